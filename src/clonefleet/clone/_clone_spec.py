"""Specs and results that cross the process boundary between scheduler and clone hosts.

Everything here is frozen, keyword-only, module-level and picklable. A :class:`CloneSpec` carries
the fully rendered launch metadata of one clone; retries and failover never re-render it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from clonefleet.clone.tools._table import Tool
from clonefleet.permissions import ALLOW_ALL, Policy
from clonefleet.providers import Message
from clonefleet.vocab import StopReason, run_record

__all__ = ["CloneSpec", "RunResult"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CloneSpec:
    """Everything a clone host needs to run one clone."""

    job_id: str
    batch_id: str
    agent: str
    clone_index: int
    clone_count: int
    instructions: str
    """Rendered definition body (the system prompt after the identity block): the paragraphs
    every clone of the batch shares."""
    task: str
    """Rendered task: the clone's first user message."""
    skills: tuple[tuple[str, str], ...] = ()
    """Injected skills as ``(name, body)``; they stay through compaction."""
    tools: tuple[str, ...] = ()
    """Names of built-in/extra tools the clone may call (control tools are always present)."""
    undeferred_tools: tuple[str, ...] = ()
    """Tools shown in full up front; when empty, every tool is shown in full."""
    extra_tools: tuple[Tool, ...] = ()
    """Python-function tools registered in code."""
    exit_schema: dict[str, Any] = field(default_factory=dict)
    exit_schema_declared: bool = False
    candidates: tuple[str, ...] = ("sim-small",)
    """Model keys of the clone's group, in group order."""
    start: int = 0
    """Index of the clone's starting candidate (clone index mod group size)."""
    fallbacks: tuple[str, ...] = ()
    fail_over_on_rate_limit: bool = False
    """A refusal for rate moves the cursor to the next candidate, as a failure does (the
    config's ``admission.fail_over_groups``); otherwise the request waits for capacity."""
    max_turns: int = 50
    max_tokens: int | None = None
    """Token budget of the whole run (input + output); ``None`` = unlimited."""
    context_budget_tokens: int = 100_000
    """When the context estimate passes this, older turns are compacted."""
    cwd: str = "."
    warnings: tuple[str, ...] = ()
    parent: str | None = None
    """Job id of the spawning clone, for nested spawns."""
    depth: int = 0
    """Nesting depth: 0 for a batch started by a user."""
    allow_subagent_spawn: bool = False
    """Gives the clone the ``subagent`` and job-control tools."""
    available_skills: tuple[tuple[str, str, str], ...] = ()
    """``(name, description, body)`` of skills the definition's own policy allows the model to
    load with the ``skill`` tool (model-invocation-disabled skills excluded)."""
    policy: Policy = ALLOW_ALL
    """The permission policy every tool call of the clone is checked against (docs/permissions.md)."""
    mcp_servers: tuple[tuple[str, dict[str, Any]], ...] = ()
    """``(name, server config)`` of the MCP servers the definition itself declares (its
    ``mcpServers``), beside those of the config."""
    subagent_provider: str = "spawn"
    """How the ``subagent`` tool starts a child: ``spawn`` (a fresh context) or ``fork`` (a child
    of this clone's own definition that inherits its completed turns; docs/prompt-cache.md)."""
    seed_messages: tuple[Message, ...] = ()
    """A fork child's start: its parent's completed turns, which its task follows (empty: the
    clone starts from its definition's prompt; docs/prompt-cache.md, "Fork spawns")."""
    instructions_own: str = ""
    """The rest of this clone's rendered body, where the template varies per clone (a body
    using ``{{ prompt }}`` or ``clone.*``); sent after the shared part."""

    cache_key: str | None = None
    """What routes its requests to one prompt cache (``prompt_cache_key``): ``None`` = its
    batch's id; a fork child's is its parent's, whose cached prefix it shares."""
    key: str | None = None
    """The key of the dataset row the clone was made from (``--inputs``; docs/inputs.md);
    ``None`` for a clone of a counted batch."""

    def __setstate__(self, state: list[Any]) -> None:
        # A spec pickled by an older release (a journal written before an upgrade) has fewer
        # fields: new fields are only ever added at the end, and get their defaults.
        names = _FIELDS or _fields_of(type(self))
        for (name, _), value in zip(names, state, strict=False):
            object.__setattr__(self, name, value)
        for name, default in names[len(state) :]:
            object.__setattr__(self, name, default())


_FIELDS: list[tuple[str, Callable[[], Any]]] = []


def _fields_of(cls: type) -> list[tuple[str, Callable[[], Any]]]:
    """``(name, default maker)`` of each field of ``cls``, in order (kept in :data:`_FIELDS`)."""
    for f in fields(cls):
        if f.default is not MISSING:
            _FIELDS.append((f.name, _constant(f.default)))
        elif f.default_factory is not MISSING:
            _FIELDS.append((f.name, f.default_factory))
        else:
            _FIELDS.append((f.name, _missing(f.name)))
    return _FIELDS


def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


def _missing(name: str) -> Callable[[], Any]:
    def fail() -> Any:
        raise TypeError(f"a pickled CloneSpec has no {name!r}")

    return fail


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """How one job's clone run ended; the fields of ``run --json`` (docs/json.md)."""

    job_id: str
    batch_id: str
    agent: str
    clone_index: int
    status: str
    stop_reason: StopReason
    outcome: str | None
    result: Any
    salvaged: bool = False
    nonconforming: bool = False
    concerns: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    error: str | None = None
    model: str | None = None
    turns: int = 0
    usage: dict[str, int] = field(
        default_factory=lambda: {
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
        }
    )
    cause: dict[str, Any] | None = None
    """Why the run failed on its provider (docs/json.md); ``None`` otherwise."""
    key: str | None = None
    """The key of the job's dataset row (:attr:`CloneSpec.key`); ``None`` in a counted batch."""

    def to_json(self) -> dict[str, Any]:
        return run_record(self)
