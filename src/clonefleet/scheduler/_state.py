"""The allowed transitions of job states, the job record and the batch submission (pure data).

A job moves ``reserved → running → completed|failed|cancelled`` (or straight from ``reserved``
to ``cancelled``/``failed``); terminal states never change again, so every job reaches exactly
one terminal state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from clonefleet.errors import UsageError
from clonefleet.vocab import RUN_RECORD_FIELDS, JobState, run_record

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "ZERO_USAGE",
    "JobRecord",
    "display_name",
    "known_cost",
]


_STATUS_FIELDS = tuple(name for name in RUN_RECORD_FIELDS if name != "result")

TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.RESERVED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def display_name(agent: str, clone_index: int) -> str:
    """``Agent #N`` (1-based) for ``_default``, else ``<name> #<clone index>``."""
    return f"Agent #{clone_index + 1}" if agent == "_default" else f"{agent} #{clone_index}"


ZERO_USAGE: dict[str, int] = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "cache_read_tokens": 0,
    "cache_write_tokens": 0,
}
"""A job's usage before it counted anything (``cache_*``: parts of ``input_tokens``)."""


def known_cost(cost_usd: float, unpriced_tokens: int, total_tokens: int) -> float | None:
    """The dollars of some usage as shown: ``None`` when none of it had a price."""
    return None if unpriced_tokens and unpriced_tokens >= total_tokens else cost_usd


@dataclass(slots=True, kw_only=True)
class JobRecord:
    """The scheduler's row for one job."""

    job_id: str
    batch_id: str
    agent: str
    clone_index: int
    clone_count: int
    key: str | None = None
    """The key of the job's dataset row (``--inputs``); ``None`` in a counted batch."""
    state: JobState = JobState.RESERVED
    parent: str | None = None
    depth: int = 0
    host_id: str | None = None
    node: str | None = None
    """Id of the cluster node whose actor hosts the clone (known once it started)."""
    model: str | None = None
    turns: int = 0
    usage: dict[str, int] = field(default_factory=lambda: dict(ZERO_USAGE))
    """The counters of the usage its events counted: :data:`ZERO_USAGE`'s keys."""
    cost_usd: float = 0.0
    """Dollars of the usage its events counted on models with a ``price`` (``_usage.py``)."""
    unpriced_tokens: int = 0
    """Tokens its events counted on models without a price."""
    progress: dict[str, Any] | None = None
    todos: list[dict[str, Any]] | None = None
    """The clone's latest todo list (``todo_write``), or ``None``."""
    outcome: str | None = None
    stop_reason: str | None = None
    result: Any = None
    error: str | None = None
    detail: str | None = None
    """Why a non-completed run ended (e.g. each model's last failure); the ``error`` text stays
    the exact caller-facing sentence."""
    cause: dict[str, Any] | None = None
    """Why the run failed on its provider: each candidate's last HTTP status and error, attempts
    and time waited (docs/json.md); ``None`` for a job that did not fail so."""
    salvaged: bool = False
    nonconforming: bool = False
    restarts: int = 0
    """How many times the job's clone was started again after its host died."""
    messages: dict[str, int] = field(
        default_factory=lambda: {"queued": 0, "delivered": 0, "undelivered": 0}
    )
    """Deliveries to the job by state (the inbox holds the deliveries themselves)."""
    concerns: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL

    def move(self, state: JobState) -> None:
        """Apply a transition.

        Raises:
            UsageError: the transition is not in :data:`TRANSITIONS`.
        """
        if state not in TRANSITIONS[self.state]:
            raise UsageError(f"job {self.job_id} cannot go from {self.state} to {state}")
        self.state = state
        now = time.time()
        if state is JobState.RUNNING:
            self.started_at = now
        elif state in TERMINAL:
            self.ended_at = now

    def finish(self, result: dict[str, Any]) -> None:
        """Record a final run record (a ``RunResult`` as JSON, or one the scheduler made) and
        move to its terminal state; a field the record leaves out keeps its value."""
        self.move(JobState(result["status"]))
        for key in (
            "outcome",
            "stop_reason",
            "result",
            "error",
            "salvaged",
            "nonconforming",
            "cause",
        ):
            if key in result:
                setattr(self, key, result[key])
        self.turns = result.get("turns", self.turns)
        self.concerns = list(result.get("concerns", self.concerns) or [])
        self.warnings = list(result.get("warnings", self.warnings) or [])
        self.usage = {**self.usage, **(result.get("usage") or {})}  # a key it lacks: as counted
        self.model = result.get("model") or self.model

    def status(self) -> dict[str, Any]:
        """The ``job_status`` view: every field of the run record but the result (which may be
        large), then where the job runs, its progress and its times."""
        own = {
            "status": str(self.state),
            "usage": dict(self.usage),
            "concerns": list(self.concerns),
            "warnings": list(self.warnings),
        }
        view = {name: own[name] if name in own else getattr(self, name) for name in _STATUS_FIELDS}
        view.update(
            display_name=display_name(self.agent, self.clone_index),
            cost_usd=known_cost(
                self.cost_usd, self.unpriced_tokens, self.usage.get("total_tokens", 0)
            ),
            detail=self.detail,
            progress=self.progress,
            todos=self.todos,
            parent=self.parent,
            host=self.host_id,
            node=self.node,
            restarts=self.restarts,
            messages=dict(self.messages),
            created_at=self.created_at,
            started_at=self.started_at,
            ended_at=self.ended_at,
        )
        return view

    def run_record(self, **overrides: Any) -> dict[str, Any]:
        """The job's ``run --json`` record (meaningful once terminal; ``docs/json.md``), with
        ``overrides`` in place of the job's own fields."""
        return run_record(self, **{"status": self.state, **overrides})
