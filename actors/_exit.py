"""Exit payloads: schema check and status normalisation (docs/definitions.md). Pure functions.

``classify`` decides what an accepted ``exit_tool`` payload means; ``ExitJudge`` keeps the
per-run state of corrective retries, salvage and the no-progress breaker.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema

from ..errors import DefinitionError
from ..vocab import Outcome, status_family

__all__ = [
    "ExitDecision",
    "ExitJudge",
    "Verdict",
    "classify",
    "exit_validator",
    "schema_errors",
]


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
            return status_family(value) or value
    return Outcome.SUCCESS


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    # jsonschema's default registry still fetches unknown `$ref` URIs over the network (with a
    # deprecation warning). An exit schema comes from a definition file: never reach out.
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs class


_LOCAL_ONLY: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
"""A registry that resolves ``$ref`` inside the schema document only; nothing is ever fetched."""


class _Unusable(Exception):
    """The exit schema cannot be applied (a ``$ref`` leads outside the document)."""


def exit_validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """A Draft 2020-12 validator for ``schema`` whose ``$ref`` are never fetched.

    Every clone of a batch shares one schema, so validators are cached by the schema's
    canonical JSON: checking a schema costs about a millisecond, a lookup microseconds.

    Raises:
        DefinitionError: ``schema`` is not a valid Draft 2020-12 JSON Schema.
    """
    return _cached_validator(json.dumps(schema, sort_keys=True, default=str))


@functools.lru_cache(maxsize=256)
def _cached_validator(canonical: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(canonical)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise DefinitionError(
            f"exit_tool_schema is not a valid Draft 2020-12 JSON Schema at {exc.json_path}: {exc.message}",
            "invalid-definition",
            None,
            "exit_tool_schema",
        ) from None
    return jsonschema.Draft202012Validator(schema, registry=_LOCAL_ONLY)


def _problem(validator: jsonschema.Draft202012Validator, payload: Any) -> str | None:
    try:
        if validator.is_valid(payload):  # the common case, without collecting errors
            return None
        error = jsonschema.exceptions.best_match(validator.iter_errors(payload))
    except referencing.exceptions.Unresolvable as exc:
        raise _Unusable(
            f"exit_tool_schema has a $ref that does not resolve inside the schema ({exc}); refs are never fetched"
        ) from None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "payload"
    return f"{where}: {error.message}"


def schema_errors(payload: Any, schema: dict[str, Any]) -> str | None:
    """Return a one-line description of why ``payload`` fails ``schema``, or ``None``.

    A ``$ref`` that leads outside the schema document is reported as a failure; it is never fetched.

    Raises:
        DefinitionError: ``schema`` is not a valid JSON Schema.
    """
    try:
        return _problem(exit_validator(schema), payload)
    except _Unusable as exc:
        return str(exc)


class ExitJudge:
    """Per-run judge of ``exit_tool`` calls: schema check, corrective retries, salvage, breaker.

    Args:
        schema: the exit payload's JSON Schema (the default one or the declared one).
        retry_budget: corrective retries granted to payloads with an unrecognised status before
            the next one is salvaged.
        breaker_threshold: identical failing exit calls in a row, with no other tool activity
            between them, that end the run as abnormal.

    Raises:
        DefinitionError: ``schema`` is not a valid Draft 2020-12 JSON Schema.
    """

    def __init__(
        self, schema: dict[str, Any], *, retry_budget: int = 2, breaker_threshold: int = 3
    ) -> None:
        self.schema, self.retry_budget, self.breaker_threshold = (
            schema,
            retry_budget,
            breaker_threshold,
        )
        self._validator = exit_validator(schema)
        self._status_retries = 0
        self._failing_streak: list[str] = []

    def note_other_activity(self) -> None:
        """Any other tool activity resets the breaker's streak."""
        self._failing_streak.clear()

    def judge(self, payload: Any) -> ExitDecision:
        """Decide about one ``exit_tool`` call.

        Order: schema check (a failure goes back to the model), status classification, then for
        a failing call the breaker (before salvage, so a breaker end is never salvaged), then the
        retry budget of unrecognised statuses, then salvage. A schema whose ``$ref`` leads outside
        the document cannot judge anything: the run ends abnormal at once.
        """
        try:
            problem = _problem(self._validator, payload)
        except _Unusable as exc:
            return ExitDecision(verdict=Verdict.BREAK, error=str(exc))
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
            return ExitDecision(
                verdict=Verdict.BREAK, error="no progress: repeated failing exit_tool calls"
            )
        if status is not None:
            if self._status_retries >= self.retry_budget:
                return ExitDecision(verdict=Verdict.SALVAGE, outcome=Outcome.SUCCESS)
            self._status_retries += 1
        return ExitDecision(verdict=Verdict.RETRY, error=f"exit_tool rejected: {problem}")
