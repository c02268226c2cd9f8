"""How a clone's run ends: the :class:`Ending` a loop step decides, and the :class:`RunResult`
made from it (status, outcome, the caller-facing error text). Pure; the loop emits the events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clonefleet.clone._clone_spec import CloneSpec, RunResult
from clonefleet.providers import Usage
from clonefleet.vocab import JobState, Outcome, StopReason, stop_error

__all__ = ["SALVAGE_WARNING", "Ending", "run_result"]

SALVAGE_WARNING = "exit payload salvaged: status outside the recognised families"


@dataclass(slots=True)
class Ending:
    """How the run ends, decided by a step; ``None`` fields keep defaults."""

    reason: StopReason
    result: Any = None
    outcome: str | None = None
    detail: str = ""
    salvaged: bool = False
    cause: dict[str, Any] | None = None
    """The provider failure that ended the run (the run record's ``cause``)."""


def run_result(
    spec: CloneSpec,
    ending: Ending,
    *,
    warnings: tuple[str, ...],
    model: str | None,
    turns: int,
    usage: Usage,
) -> RunResult:
    """The run record of a run that ended as ``ending`` (``warnings`` already complete)."""
    reason = ending.reason
    completed = reason is StopReason.COMPLETED
    status = {
        StopReason.COMPLETED: JobState.COMPLETED,
        StopReason.CANCELLED: JobState.CANCELLED,
    }.get(reason, JobState.FAILED)
    outcome = (
        ending.outcome
        if completed
        else (Outcome.CANCELLED if reason is StopReason.CANCELLED else Outcome.FAILURE)
    )
    concerns = ("exit payload salvaged after unrecognised status",) if ending.salvaged else ()
    return RunResult(
        job_id=spec.job_id,
        batch_id=spec.batch_id,
        agent=spec.agent,
        clone_index=spec.clone_index,
        key=spec.key,
        status=status,
        stop_reason=reason,
        outcome=str(outcome) if outcome is not None else None,
        result=ending.result if completed else None,
        salvaged=ending.salvaged,
        nonconforming=ending.salvaged,
        concerns=concerns,
        warnings=warnings,
        error=stop_error(reason, ending.detail),
        model=model,
        turns=turns,
        usage=usage.to_json(),
        cause=ending.cause,
    )
