"""Exit payloads: schema check and status normalisation (SPEC §2.6). Pure functions.

``classify`` decides what an accepted ``exit_tool`` payload means; ``ExitJudge`` keeps the
per-run state of corrective retries, salvage and the no-progress breaker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jsonschema

__all__ = ["ExitDecision", "ExitJudge", "Outcome", "Verdict", "classify", "schema_errors"]

_FAMILIES = {
    **dict.fromkeys(("success", "ok", "done", "completed"), "success"),
    **dict.fromkeys(("failure", "failed", "error"), "failure"),
    **dict.fromkeys(("cancelled", "canceled", "cancel"), "cancelled"),
}


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"


class Verdict(StrEnum):
    ACCEPT = "accept"
    """Payload is valid and classified; the run ends with it."""
    RETRY = "retry"
    """Send the error back to the model and let it try again."""
    SALVAGE = "salvage"
    """Retry budget spent on an unrecognised status: end completed, marked salvaged."""
    BREAK = "break"
    """No-progress breaker tripped: end abnormal, never salvaged."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitDecision:
    verdict: Verdict
    outcome: Outcome | None = None
    error: str | None = None
    """The tool error given to the model (RETRY) or the abnormal reason (BREAK)."""


def classify(payload: Any) -> Outcome | str:
    """Normalise a payload's status: an :class:`Outcome`, or the unrecognised string itself.

    A ``success`` boolean wins; otherwise the first present of ``kind``, ``outcome``, ``status``
    decides; a non-string value there stops the search; no status at all is a success.
    """
    if not isinstance(payload, dict):
        return Outcome.SUCCESS
    if isinstance(payload.get("success"), bool):
        return Outcome.SUCCESS if payload["success"] else Outcome.FAILURE
    for key in ("kind", "outcome", "status"):
        if key in payload:
            value = payload[key]
            if not isinstance(value, str):
                return Outcome.SUCCESS
            family = _FAMILIES.get(value.lower())
            return Outcome(family) if family else value
    return Outcome.SUCCESS


def schema_errors(payload: Any, schema: dict[str, Any]) -> str | None:
    """Return a one-line description of why ``payload`` fails ``schema``, or ``None``."""
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(payload))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "payload"
    return f"{where}: {error.message}"


class ExitJudge:
    """Per-run judge of ``exit_tool`` calls: retry budget and no-progress breaker."""

    def __init__(self, schema: dict[str, Any], *, retry_budget: int = 2, breaker_threshold: int = 3) -> None:
        self.schema, self.retry_budget, self.breaker_threshold = schema, retry_budget, breaker_threshold
        self._status_retries = 0
        self._failing_streak: list[str] = []

    def note_other_activity(self) -> None:
        """Any other tool activity resets the breaker's streak."""
        self._failing_streak.clear()

    def judge(self, payload: Any) -> ExitDecision:
        """Decide about one ``exit_tool`` call."""
        problem = schema_errors(payload, self.schema)
        status = None
        if problem is None:
            status = classify(payload)
            if isinstance(status, Outcome):
                self._failing_streak.clear()
                return ExitDecision(verdict=Verdict.ACCEPT, outcome=status)
            problem = (
                f"unrecognised status {status!r}: use one of success/ok/done/completed, "
                "failure/failed/error or cancelled, or a `success` boolean"
            )
        # The breaker is checked before salvage: identical failing calls in a row end abnormal.
        signature = json.dumps(payload, sort_keys=True, default=str)
        if self._failing_streak and self._failing_streak[-1] != signature:
            self._failing_streak.clear()
        self._failing_streak.append(signature)
        if len(self._failing_streak) >= self.breaker_threshold:
            return ExitDecision(verdict=Verdict.BREAK, error="no progress: repeated failing exit_tool calls")
        if status is not None:
            if self._status_retries >= self.retry_budget:
                return ExitDecision(verdict=Verdict.SALVAGE, outcome=Outcome.SUCCESS)
            self._status_retries += 1
        return ExitDecision(verdict=Verdict.RETRY, error=f"exit_tool rejected: {problem}")
