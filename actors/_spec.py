"""Specs and results that cross the process boundary between scheduler and clone hosts.

Everything here is frozen, keyword-only, module-level and picklable. A :class:`CloneSpec` carries
the fully rendered launch metadata of one clone; retries and failover never re-render it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..config import Config
from ..providers import SimScript
from ._tools import Tool

__all__ = ["RUN_RECORD_FIELDS", "CloneSpec", "RunResult", "StopReason", "STOP_ERRORS", "run_record"]

RUN_RECORD_FIELDS = (
    "job_id",
    "batch_id",
    "agent",
    "clone_index",
    "status",
    "stop_reason",
    "outcome",
    "result",
    "salvaged",
    "nonconforming",
    "concerns",
    "warnings",
    "error",
    "model",
    "turns",
    "usage",
)
"""The fields of one ``run --json`` object, in order (SPEC §7)."""


def run_record(source: Any, **overrides: Any) -> dict[str, Any]:
    """The ``run --json`` object read off any object with those attributes."""
    out = {
        name: overrides[name] if name in overrides else getattr(source, name)
        for name in RUN_RECORD_FIELDS
    }
    out["concerns"], out["warnings"], out["usage"] = (
        list(out["concerns"]),
        list(out["warnings"]),
        dict(out["usage"]),
    )
    return out


class StopReason(StrEnum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    TOKEN_LIMIT = "token_limit"
    DECLINED = "declined"
    ABNORMAL = "abnormal"


STOP_ERRORS = {
    StopReason.CANCELLED: "Error: subagent run was cancelled",
    StopReason.FAILED: "Error: subagent run failed",
    StopReason.TOKEN_LIMIT: "Error: subagent run hit its token limit before finishing",
    StopReason.DECLINED: "Error: subagent declined the task",
}


def stop_error(reason: StopReason, detail: str = "") -> str | None:
    """The exact caller-facing error text of SPEC §3 (``None`` for a completed run)."""
    if reason is StopReason.COMPLETED:
        return None
    if reason is StopReason.ABNORMAL:
        return f"Error: subagent run ended abnormally ({detail or 'unknown'})"
    return STOP_ERRORS[reason]


@dataclass(frozen=True, slots=True, kw_only=True)
class CloneSpec:
    """Everything a clone host needs to run one clone."""

    job_id: str
    batch_id: str
    agent: str
    clone_index: int
    clone_count: int
    instructions: str
    """Rendered definition body (the system prompt suffix)."""
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
    max_turns: int = 50
    max_tokens: int | None = None
    """Token budget of the whole run (input + output); ``None`` = unlimited."""
    context_budget_tokens: int = 100_000
    """When the context estimate passes this, older turns are compacted."""
    cwd: str = "."
    config: Config = field(default_factory=Config)
    sim_script: SimScript | None = None
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """How one job's clone run ended; the fields of ``run --json`` (SPEC §7)."""

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
        default_factory=lambda: {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    )

    def to_json(self) -> dict[str, Any]:
        return run_record(self, status=self.status, stop_reason=str(self.stop_reason))
