"""Planning a nested spawn's child batch: what the parent clone's host renders, and the check of
what it sends back.

The prompt of a ``subagent`` call is written by a model and is a template. The scheduler does
not render it (it is one actor every batch and every ``jobs`` command waits on): it packs
everything the render needs into a :class:`NestedPlan` and hands it to the parent's clone host,
which calls it off its event loop; the scheduler accepts only what :func:`check_planned` finds to
be the batch it asked for. Rendering is bounded (``docs/definitions.md``).

A plan carries the parent batch's config, definitions and skills as the client loaded them, so a
remote cluster never needs the caller's files.

A fork spawn (a parent whose subagent provider is ``fork``) takes the same path: its request also
carries the parent's completed turns, read into a :class:`Fork`; the children are planned from the
parent's own definition as any child is, and :meth:`Fork.child` then gives each the parent's tool
view, models and turns, so its first request starts with its parent's previous one, byte for byte
(docs/prompt-cache.md, "Fork spawns").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clonefleet.clone import CloneSpec, message_from_json
from clonefleet.config import Config
from clonefleet.definitions import MAX_OUTPUT_CHARS, Catalog, SkillCatalog, load_catalog
from clonefleet.errors import ClusterError, UsageError
from clonefleet.permissions import ALLOW_ALL, Policy
from clonefleet.planning._clone_specs import BatchRequest, plan_specs
from clonefleet.providers import Message

__all__ = ["Fork", "NestedPlan", "check_planned", "child_request", "fork_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fork:
    """What a fork child inherits from its parent clone: the parent's spec, its completed turns,
    the tools it shows in full and the model it is on."""

    parent: CloneSpec
    messages: tuple[Message, ...]
    visible: tuple[str, ...]
    model: str | None = None

    def child(self, spec: CloneSpec) -> CloneSpec:
        """``spec`` (planned from the parent's definition as any child) with the parent's tools,
        tool view, models and turns: its first request starts with the parent's previous one."""
        p = self.parent
        start = p.candidates.index(self.model) if self.model in p.candidates else p.start
        return replace(
            spec,
            tools=p.tools,
            undeferred_tools=self.visible,
            extra_tools=p.extra_tools,
            exit_schema=p.exit_schema,
            exit_schema_declared=p.exit_schema_declared,
            available_skills=p.available_skills,
            mcp_servers=p.mcp_servers,
            candidates=p.candidates,
            start=start,
            fallbacks=p.fallbacks,
            fail_over_on_rate_limit=p.fail_over_on_rate_limit,
            allow_subagent_spawn=p.allow_subagent_spawn,
            subagent_provider=p.subagent_provider,
            seed_messages=self.messages,
            cache_key=p.cache_key or p.batch_id,
        )


def fork_of(request: Mapping[str, Any], parent: CloneSpec) -> Fork | None:
    """The fork a ``subagent`` request of clone ``parent`` asks for (its ``fork`` part, which
    the tool adds), or ``None`` for a plain spawn.

    Raises:
        UsageError: a fork part from a clone whose subagent provider is not ``fork``, or one
            that is not what the tool sends.
    """
    data = request.get("fork")
    if data is None:
        return None
    if parent.subagent_provider != "fork":
        raise UsageError(f"{parent.agent} spawns subagents; it does not fork")
    try:
        if not isinstance(data, Mapping):
            raise ValueError("not a mapping")
        raw, visible, model = data.get("messages"), data.get("visible"), data.get("model")
        if not isinstance(raw, list | tuple) or not isinstance(visible, list | tuple):
            raise ValueError("messages and visible must be lists")
        if not all(isinstance(v, str) for v in visible) or not isinstance(model, str | None):
            raise ValueError("visible must hold tool names and model be a model key")
        messages = tuple(message_from_json(m) for m in raw)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"a fork request's turns are malformed: {exc}") from None
    return Fork(parent=parent, messages=messages, visible=tuple(visible), model=model)


@dataclass(frozen=True, slots=True, kw_only=True)
class NestedPlan:
    """Everything rendering one nested spawn needs; calling it renders (picklable, so it crosses
    to a host actor).

    Raises (when called):
        UsageError: bad cwd, model or request (see :func:`plan_specs`).
        DefinitionError: unknown agent, render failure (``TemplateError``) or bad skill.
    """

    request: BatchRequest
    config: Config
    batch_id: str
    job_ids: tuple[str, ...]
    caller_cwd: str
    """The parent's launch directory: the child's default and the directory it may not leave."""
    caller_tools: tuple[str, ...]
    catalog: Catalog | None
    skills: SkillCatalog | None
    project_path: str
    """Where the catalog is loaded from when the parent batch carried none."""
    subagents_dirs: tuple[str, ...] = ()
    caller_policy: Policy = ALLOW_ALL
    """The parent clone's permission policy: the child's starts from it and can only narrow it."""
    fork: Fork | None = None
    """A fork spawn's inheritance (``None``: a plain spawn)."""

    def __call__(self) -> tuple[CloneSpec, ...]:
        catalog = self.catalog
        if catalog is None:
            dirs = [Path(d) for d in self.subagents_dirs]
            catalog = load_catalog(Path(self.project_path), dirs, self.config)
        specs = plan_specs(
            self.request,
            catalog,
            self.config,
            batch_id=self.batch_id,
            job_ids=list(self.job_ids),
            caller_cwd=Path(self.caller_cwd),
            caller_tools=self.caller_tools,
            skills=self.skills,
            caller_policy=self.caller_policy,
        )
        return specs if self.fork is None else tuple(map(self.fork.child, specs))


def check_planned(specs: Any, plan: NestedPlan) -> tuple[CloneSpec, ...]:
    """The specs a host sent back, if they are the batch ``plan`` asked for: one
    :class:`CloneSpec` per reserved id in order, of the plan's batch, parent and depth, each
    rendered text within the template output cap, each policy the parent's with layers added;
    a fork's children each with the parent's tools and the turns the plan carries.

    Raises:
        ClusterError: anything else (the host is not speaking this protocol).
    """
    req = plan.request
    ok = (
        isinstance(specs, tuple)
        and all(isinstance(s, CloneSpec) for s in specs)
        and tuple(s.job_id for s in specs) == plan.job_ids
    )
    if ok:
        ok = all(
            s.batch_id == plan.batch_id
            and s.clone_index == i
            and s.clone_count == len(plan.job_ids)
            and s.parent == req.parent
            and s.depth == req.depth
            and len(s.task) <= MAX_OUTPUT_CHARS
            and len(s.instructions) <= MAX_OUTPUT_CHARS
            and s.policy.extends(plan.caller_policy)  # a child never gets more than its parent
            and _forked_as_asked(s, plan.fork)
            for i, s in enumerate(specs)
        )
    if not ok:
        raise ClusterError(
            f"the clone host answered the nested spawn {plan.batch_id} with another batch"
        )
    return tuple(specs)


def _forked_as_asked(spec: CloneSpec, fork: Fork | None) -> bool:
    if fork is None:
        return not spec.seed_messages
    return (
        spec.agent == fork.parent.agent
        and spec.tools == fork.parent.tools
        and spec.seed_messages == fork.messages
    )


def child_request(
    request: Mapping[str, Any],
    parent_job_id: str,
    parent_depth: int,
    config: Config,
    fork: Fork | None = None,
) -> BatchRequest:
    """The batch a ``subagent`` call of job ``parent_job_id`` (at ``parent_depth``) asks for,
    one level below it; a ``fork`` asks for clones of the parent's own definition (its
    ``subagent_type`` and ``model_override`` are not read).

    Raises:
        UsageError: the child would be deeper than ``limits.max_depth``.
    """
    depth = parent_depth + 1
    if depth > config.limits.max_depth:
        raise UsageError(
            f"nesting depth {depth} exceeds limits.max_depth ({config.limits.max_depth}); "
            "finish the task without another subagent"
        )
    return BatchRequest(
        agent=fork.parent.agent if fork else str(request.get("subagent_type") or "_default"),
        prompt=str(request.get("prompt", "")),
        count=request.get("count", 1),
        model=None if fork else request.get("model_override"),
        cwd=request.get("cwd"),
        parent=parent_job_id,
        depth=depth,
    )
