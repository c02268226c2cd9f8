"""Planning a batch: from (agent, prompt, count, options) to rendered clone specs.

Runs on the client, where the definition files are, before anything is submitted: the count is
checked, models resolved, tools resolved and every clone rendered, so one error rejects the whole
batch and nothing starts.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from clonefleet.clone import CloneSpec
from clonefleet.config import Config
from clonefleet.definitions import (
    DEFAULT_EXIT_SCHEMA,
    Catalog,
    Definition,
    Effective,
    RenderedClone,
    SkillCatalog,
    render_batch,
    skill_allowed,
)
from clonefleet.errors import ConfigError, DefinitionError, UsageError
from clonefleet.permissions import ALLOW_ALL, Policy
from clonefleet.planning._budget_check import check_batch_budget
from clonefleet.providers import SimScript
from clonefleet.vocab import (
    KNOWN_TOOLS,
    MCP_ALL,
    WEB_TOOLS,
    WORK_TOOLS,
    canonical_tool,
    is_mcp_grant,
)

__all__ = [
    "BatchRequest",
    "RowFailure",
    "check_count",
    "check_request",
    "check_rows",
    "clone_tools",
    "plan_specs",
    "resolve_tools",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRequest:
    """What a caller asks for; see ``clonefleet run --help`` for each option."""

    agent: str
    prompt: str
    count: int = 1
    model: str | None = None
    """``--model``: a model, alias or ``@mg:GROUP`` overriding the definition's."""
    cwd: str | None = None
    approve_chdir: bool = False
    variables: Mapping[str, str] = field(default_factory=dict)
    subagents_dirs: tuple[str, ...] = ()
    sim_script: SimScript | None = None
    clones_per_actor: int | None = None
    max_concurrency: int | None = None
    parent: str | None = None
    depth: int = 0
    budget_tokens: int | None = None
    """``--budget-tokens``: see :attr:`BatchSubmission.budget_tokens`."""
    budget_usd: float | None = None
    """``--budget-usd``: see :attr:`BatchSubmission.budget_usd`."""
    rows: tuple[tuple[str, Any], ...] = ()
    """``--inputs``: one ``(key, data)`` per clone, in clone order (data: a dict for a data row,
    a str for a text row). When given, the batch has one clone per row (``count`` is not
    used), each clone's templates see its row as ``input`` and its spec carries the key."""
    batch_id: str | None = None
    """The batch the clones join: an open batch this request grows (``Fleet.extend``);
    ``None`` = a new batch, its id drawn when planned."""
    first_index: int = 0
    """The whole batch's index of this request's first clone: a part planned on its own
    (``Fleet.extend``) numbers its clones on from the parts before it."""
    total: int | None = None
    """The whole batch's clone count (``clone.count``, ``CloneSpec.clone_count``) when known;
    ``None``: this request's own count."""

    @property
    def clone_count(self) -> int:
        """How many clones the request asks for: one per row, else ``count`` (unchecked)."""
        return len(self.rows) if self.rows else self.count


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A dataset row whose clone could not be planned: it fails alone, the other rows are
    planned."""

    key: str
    """The row's key."""
    index: int
    """The clone's index in the whole batch (0-based)."""
    reason: str
    """Why, in plain words, naming the clone (a template error, a missing field, a row nested
    too deeply, an ``@skill:`` reference that does not resolve)."""


def check_count(count: Any, config: Config) -> int:
    """Accept an integer ``1 <= count <= limits.max_count``.

    Raises:
        UsageError: zero, negative, not an integer, or above the limit.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise UsageError(f"count must be a whole number, got {count!r}")
    if count < 1:
        raise UsageError(f"count must be at least 1, got {count}")
    if count > config.limits.max_count:
        raise UsageError(
            f"count {count} is above limits.max_count ({config.limits.max_count}); raise it in the config to allow more"
        )
    return count


def check_rows(rows: Sequence[tuple[str, Any]]) -> None:
    """Accept rows whose keys are distinct strings and whose data are mappings or strings.

    Raises:
        UsageError: naming the row (by position) and the reason.
    """
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if not (isinstance(row, tuple) and len(row) == 2):
            raise UsageError(f"input row {i + 1}: expected a (key, data) pair, got {row!r:.80}")
        key, data = row
        if not isinstance(key, str):
            raise UsageError(f"input row {i + 1}: its key must be text, got {key!r:.80}")
        if not isinstance(data, (Mapping, str)):
            raise UsageError(
                f"input row {i + 1} (key {key!r:.80}): its data must be an object or text,"
                f" got {type(data).__name__}"
            )
        first = seen.setdefault(key, i)
        if first != i:
            raise UsageError(f"input rows {first + 1} and {i + 1} have the same key {key!r:.80}")


def _check_slots(value: Any, flag: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"{flag} must be a whole number of 1 or more, got {value!r}")


def check_request(req: BatchRequest, config: Config) -> None:
    """Check what a request asks for besides the count: the prompt is text of at most
    ``limits.max_prompt_chars`` characters; ``clones_per_actor`` and ``max_concurrency`` are
    absent or at least 1.

    Raises:
        UsageError: naming the option and the limit.
    """
    if not isinstance(req.prompt, str):
        raise UsageError(f"the prompt must be text, got {type(req.prompt).__name__}")
    limit = config.limits.max_prompt_chars
    if len(req.prompt) > limit:
        raise UsageError(
            f"the prompt has {len(req.prompt):,} characters, above limits.max_prompt_chars"
            f" ({limit:,}); raise it in the config to allow more"
        )
    _check_slots(req.clones_per_actor, "--clones-per-actor (clones_per_actor)")
    _check_slots(req.max_concurrency, "--max-concurrency (max_concurrency)")


def resolve_tools(
    defn: Definition,
    caller_tools: Sequence[str] | None = None,
    web_tools: Collection[str] = (),
    servers: Collection[str] = (),
) -> tuple[str, ...]:
    """The built-in tools a clone of ``defn`` may call.

    ``tools`` absent means every tool of the caller; ``inherit_tools`` unions the caller's tools
    into the declared ones (``switch_facet`` is never inherited); ``tools_deny`` removes. MCP grants
    pass through for the clone host to resolve against its servers, and a bare name of one of the
    clone's MCP ``servers`` means the ``mcp__<server>`` shorthand. See docs/definitions.md, "Tools"
    ("Which tools a clone gets", "MCP tools").
    """
    caller = (
        [*(t for t in WORK_TOOLS if t not in WEB_TOOLS or t in web_tools), MCP_ALL]
        if caller_tools is None
        else [t for t in caller_tools if t != "switch_facet"]
    )
    names = caller if defn.tools is None else [canonical_tool(t) for t in defn.tools]
    names = [f"mcp__{n}" if n in servers and n not in KNOWN_TOOLS else n for n in names]
    if "tag!ALL" in names:
        names = [*WORK_TOOLS, MCP_ALL]
    if defn.inherit_tools:
        names = names + caller
    deny = set(defn.tools_deny)
    return tuple(
        n for n in dict.fromkeys(names) if (n in WORK_TOOLS or is_mcp_grant(n)) and n not in deny
    )


def _launch_dir(req: BatchRequest, caller_cwd: Path) -> Path:
    if req.cwd is None:
        return caller_cwd
    target = (caller_cwd / req.cwd).resolve()
    if not target.is_dir():
        raise UsageError(f"--cwd {req.cwd} is not an existing directory")
    base = caller_cwd.resolve()
    if target != base and base not in target.parents and not req.approve_chdir:
        raise UsageError(
            f"--cwd {target} is outside the caller's directory {base}; pass --allow-chdir to approve it"
        )
    return target


class _FromDefinition(TypedDict):
    """The fields of a clone spec that its definition alone decides."""

    agent: str
    undeferred_tools: tuple[str, ...]
    exit_schema: dict[str, Any]
    exit_schema_declared: bool
    max_turns: int
    max_tokens: int | None
    warnings: tuple[str, ...]
    allow_subagent_spawn: bool
    available_skills: tuple[tuple[str, str, str], ...]
    mcp_servers: tuple[tuple[str, dict[str, Any]], ...]


def _from_definition(defn: Definition, skills: SkillCatalog | None) -> _FromDefinition:
    # The skills the definition's own policy lets the model load with the `skill` tool.
    loadable = tuple(
        (sk.name, sk.description, sk.body)
        for sk in (skills.skills.values() if skills is not None else ())
        if skill_allowed(defn, sk.name) and not sk.disable_model_invocation
    )
    return _FromDefinition(
        agent=defn.name,
        undeferred_tools=tuple(defn.undeferred_tools),
        exit_schema=defn.exit_tool_schema or DEFAULT_EXIT_SCHEMA,
        exit_schema_declared=defn.exit_tool_schema is not None,
        max_turns=defn.max_turns or 50,
        max_tokens=defn.max_tokens,
        warnings=tuple(defn.warnings),
        allow_subagent_spawn=defn.allow_subagent_spawn,
        available_skills=loadable,
        mcp_servers=tuple(defn.mcp_servers),
    )


def _model_keys(
    req: BatchRequest, defn: Definition, config: Config
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The candidates (``--model`` or the definition's) and fallbacks, each checked to resolve.

    Raises:
        UsageError: a model, alias or group the config does not know.
    """
    try:
        candidates = config.model_candidates(req.model or defn.model)
        fallbacks = tuple(defn.fallback_models)
        for key in (*candidates, *fallbacks):
            config.resolve_model(key)
    except ConfigError as exc:
        raise UsageError(f"{req.agent}: {exc.message}") from None
    return candidates, fallbacks


def _group_name(model: str | None) -> str | None:
    """The model group a definition's ``model`` names (``None``: a single model)."""
    if model is None or model == "inherit":
        return "default"
    return model[4:] if model.startswith("@mg:") else None


def plan_specs(
    req: BatchRequest,
    catalog: Catalog,
    config: Config,
    *,
    batch_id: str,
    job_ids: Sequence[str],
    caller_cwd: Path,
    caller_tools: Sequence[str] | None = None,
    skills: SkillCatalog | None = None,
    caller_policy: Policy | None = None,
    failures: list[RowFailure] | None = None,
) -> tuple[CloneSpec, ...]:
    """Render every clone of the batch and return their specs (nothing is started).
    ``caller_policy``: a spawning clone's permission policy (see :func:`clone_tools`).

    ``failures``, when given with rows, makes each row fail alone: a row whose clone cannot be
    rendered is left out of the specs and a :class:`RowFailure` appended; a template that does
    not compile and every other error still raise.

    Raises:
        UsageError: bad count, prompt (too long), cwd, model, clones per actor or concurrency,
            first index or total.
        DefinitionError: unknown agent, invalid definition, render failure.
    """
    count = check_count(req.clone_count, config)
    check_request(req, config)
    check_rows(req.rows)
    if len(job_ids) != count:
        raise UsageError("one job id per clone is needed")
    defn = catalog.get(req.agent)
    launch = _launch_dir(req, caller_cwd)
    candidates, fallbacks = _model_keys(req, defn, config)
    check_batch_budget(req.budget_tokens, req.budget_usd, config, (*candidates, *fallbacks))
    gets = clone_tools(defn, config, launch, caller_tools, caller_policy)
    first = req.first_index
    failed: list[tuple[int, DefinitionError]] | None = (
        [] if failures is not None and req.rows else None
    )
    rendered = render_batch(
        defn,
        prompt=req.prompt,
        count=count,
        batch_id=batch_id,
        job_ids=job_ids,
        cwd=str(launch),
        project_path=str(caller_cwd),
        model_names=[candidates[(first + i) % len(candidates)] for i in range(count)],
        variables=dict(req.variables),
        available_tools=list(gets.tools),
        available_subagents=[d.name for d in catalog.listed()],
        available_skills=skills.names() if skills is not None else (),
        skills=skills,
        inputs=[data for _, data in req.rows] if req.rows else None,
        first_index=first,
        total=req.total,
        failures=failed,
    )
    if failures is not None and failed:
        failures.extend(RowFailure(req.rows[i][0], first + i, exc.message) for i, exc in failed)
    common: dict[str, Any] = {
        "batch_id": batch_id,
        "clone_count": count if req.total is None else req.total,
        "tools": gets.tools,
        "candidates": tuple(candidates),
        "fallbacks": fallbacks,
        "fail_over_on_rate_limit": _group_name(req.model or defn.model)
        in config.admission.fail_over_groups,
        "cwd": str(launch),
        "parent": req.parent,
        "depth": req.depth,
        **_from_definition(defn, skills),
        "policy": gets.policy,
        "allow_subagent_spawn": gets.spawn,
        "subagent_provider": defn.subagent_provider or config.subagent_provider,
    }
    keys = [key for key, _ in req.rows] if req.rows else None
    return _specs(rendered, job_ids, common, keys, first)


def clone_tools(
    defn: Definition,
    config: Config,
    launch: Path,
    caller_tools: Sequence[str] | None = None,
    caller_policy: Policy | None = None,
) -> Effective:
    """What a clone of ``defn`` launched in ``launch`` gets: its tools, its permission policy
    and whether it may spawn (``validate`` reports the same, docs/permissions.md).

    The policy is the caller's (a nested spawn) or else the config's layers (the user's own
    config's first while a project's config is in use), with the
    definition's own layer below it; relative path rules of a layer start at that layer's
    launch directory. A tool the policy denies whatever its arguments is left out, and a
    definition may spawn only while the policy lets it call ``subagent`` at all.
    """
    base = caller_policy
    if base is None:
        base = ALLOW_ALL
        for layer in config.permission_layers():
            base = base.child(layer, str(launch))
    policy = base.child(defn.permissions, str(launch))
    servers = {*config.mcp_servers, *(name for name, _ in defn.mcp_servers)}
    tools = resolve_tools(defn, caller_tools, config.web.enabled_tools, servers)
    return Effective(
        tools=tuple(t for t in tools if policy.tool_denial(t) is None),
        policy=policy,
        spawn=defn.allow_subagent_spawn and policy.tool_denial("subagent") is None,
    )


def _specs(
    rendered: Sequence[RenderedClone],
    job_ids: Sequence[str],
    common: dict[str, Any],
    keys: Sequence[str] | None = None,
    first_index: int = 0,
) -> tuple[CloneSpec, ...]:
    """One spec per rendered clone; each starts at candidate ``index mod group size`` and
    carries its row's key (``keys`` and ``job_ids``: one per clone of the part, whose first
    clone has index ``first_index``; ``keys`` ``None``: a counted batch). The
    paragraphs of the rendered bodies that every clone shares are its ``instructions``, the rest
    its ``instructions_own`` (docs/prompt-cache.md)."""
    shared = shared_paragraphs([r.instructions for r in rendered])
    return tuple(
        CloneSpec(
            job_id=job_ids[r.index - first_index],
            clone_index=r.index,
            instructions=shared,
            instructions_own=r.instructions[len(shared) :].removeprefix(PARAGRAPH),
            task=r.task,
            skills=tuple((s.name, s.body) for s in r.skills),
            start=r.index % len(common["candidates"]),
            key=None if keys is None else keys[r.index - first_index],
            **common,
        )
        for r in rendered
    )


PARAGRAPH = "\n\n"
"""What separates the blocks of a system prompt (the wires join system messages with it)."""


def shared_paragraphs(bodies: Sequence[str]) -> str:
    """The longest run of whole paragraphs every body starts with: all of it when they are all
    the same (or there is one), else the common text up to its last paragraph break, so that it
    joined to each body's rest by :data:`PARAGRAPH` gives the body back, byte for byte."""
    if not bodies:
        return ""
    first = bodies[0]
    if all(b == first for b in bodies):
        return first
    common = os.path.commonprefix(list(bodies))
    cut = common.rfind(PARAGRAPH)
    return common[:cut] if cut > 0 else ""
