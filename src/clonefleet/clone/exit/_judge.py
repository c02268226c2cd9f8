"""Exit payloads: schema check and status normalisation (docs/definitions.md). Pure functions.

``classify`` decides what an accepted ``exit_tool`` payload means; ``ExitJudge`` keeps the
per-run state of corrective retries, salvage and the no-progress breaker. The schema check is
bounded in size and time (``_bounds``): a payload over the caps, or one whose check runs out
of time, goes back to the model as a tool error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeGuard

import jsonschema
import jsonschema.protocols
import referencing
import referencing.exceptions
import referencing.jsonschema

from clonefleet.clone.exit._bounds import (
    EXIT_VALIDATION_TIMEOUT_S,
    BadPattern,
    BoundedValidator,
    OutOfTime,
    deadline,
    payload_problem,
    short_repr,
    without_dialects,
)
from clonefleet.clone.exit._quick import Check, quick_check
from clonefleet.errors import DefinitionError
from clonefleet.providers import IdentityCache
from clonefleet.vocab import Outcome, status_family

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
    """The exit schema cannot be applied (a ``$ref`` leads outside the document, or a pattern
    the regex engine refuses)."""


class _TooCostly(Exception):
    """Checking this payload ran out of time (or of stack): a failing exit call."""


_MAX_ERRORS = 32
"""Schema errors gathered from one payload before the most relevant one is reported."""
_MAX_PROBLEM_CHARS = 500
"""Longest schema problem sent back to the model."""


def exit_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """A bounded Draft 2020-12 validator for ``schema`` whose ``$ref`` are never fetched.

    Every clone of a batch shares one schema, so validators are cached by the schema's
    canonical JSON: checking a schema costs about a millisecond, a lookup microseconds. Use it
    through :func:`schema_errors` or :class:`ExitJudge`, which set the validation deadline.

    Raises:
        DefinitionError: ``schema`` is not a valid Draft 2020-12 JSON Schema.
    """
    return _BY_SCHEMA(schema)


def _canonical_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    return _cached_validator(json.dumps(schema, sort_keys=True, default=str))


_BY_SCHEMA = IdentityCache(_canonical_validator, 256)
"""Validators by their schema object: the clones of a batch share one, so most lookups skip
writing the schema's canonical JSON."""


@functools.lru_cache(maxsize=256)
def _cached_validator(canonical: str) -> jsonschema.protocols.Validator:
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
    return BoundedValidator(without_dialects(schema), registry=_LOCAL_ONLY)


def _gather(validator: jsonschema.protocols.Validator, payload: Any, timeout_s: float) -> list[Any]:
    """Up to ``_MAX_ERRORS`` schema errors of ``payload``, found within ``timeout_s``."""
    errors: list[Any] = []
    try:
        with deadline(timeout_s):
            for error in validator.iter_errors(payload):
                errors.append(error)
                if len(errors) >= _MAX_ERRORS:
                    break
    except referencing.exceptions.Unresolvable as exc:
        raise _Unusable(
            f"exit_tool_schema has a $ref that does not resolve inside the schema ({exc}); refs are never fetched"
        ) from None
    except BadPattern as exc:
        raise _Unusable(f"exit_tool_schema cannot be applied: {exc}") from None
    except OutOfTime:
        if not errors:  # the payload fails the schema either way: report what was found
            raise _TooCostly(
                f"checking the payload against the exit schema took longer than {timeout_s:g} s;"
                " send a smaller or simpler payload"
            ) from None
    except RecursionError:
        raise _TooCostly(
            "the payload is nested too deeply to check against the exit schema"
        ) from None
    return errors


def _problem(
    validator: jsonschema.protocols.Validator, payload: Any, timeout_s: float | None = None
) -> str | None:
    too_big = payload_problem(payload)
    if too_big is not None:
        return too_big
    limit = EXIT_VALIDATION_TIMEOUT_S if timeout_s is None else timeout_s
    error = jsonschema.exceptions.best_match(_gather(validator, payload, limit))
    if error is None:
        return None
    where = short_repr("/".join(str(p) for p in error.absolute_path) or "payload").strip("'\"")
    message = error.message
    if len(message) > _MAX_PROBLEM_CHARS:  # jsonschema quotes the whole instance: cut it short
        message = message.replace(repr(error.instance), short_repr(error.instance))
    problem = f"{where}: {message}"
    if len(problem) > _MAX_PROBLEM_CHARS:
        problem = problem[: _MAX_PROBLEM_CHARS - 3] + "..."
    return problem


def schema_errors(payload: Any, schema: dict[str, Any]) -> str | None:
    """Return a one-line description of why ``payload`` fails ``schema``, or ``None``.

    A ``$ref`` that leads outside the schema document is reported as a failure; it is never
    fetched. A payload over the size caps, or whose check runs out of time, fails too.

    Raises:
        DefinitionError: ``schema`` is not a valid JSON Schema.
    """
    try:
        return _problem(exit_validator(schema), payload)
    except (_Unusable, _TooCostly) as exc:
        return str(exc)


def _signature(payload: Any) -> str:
    """What makes two failing exit calls "identical" for the breaker."""
    try:
        return json.dumps(payload, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return f"{type(payload).__name__}:{short_repr(payload)}"


@functools.cache
def _judge_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads exit checks run on (few: a check is short, and usually microseconds)."""
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=4, thread_name_prefix="clonefleet-exit"
    )


class ExitJudge:
    """Per-run judge of ``exit_tool`` calls: schema check, corrective retries, salvage, breaker.

    Args:
        schema: the exit payload's JSON Schema (the default one or the declared one).
        retry_budget: corrective retries granted to payloads with an unrecognised status before
            the next one is salvaged.
        breaker_threshold: identical failing exit calls in a row, with no other tool activity
            between them, that end the run as abnormal.
        timeout_s: wall-clock budget of one payload's schema check (default
            ``EXIT_VALIDATION_TIMEOUT_S``).
        quick: accept what the schema's compiled quick check accepts without the full validator
            (``False``: every payload goes through the full validator; the decisions are the
            same).

    Raises:
        DefinitionError: ``schema`` is not a valid Draft 2020-12 JSON Schema.
    """

    def __init__(
        self,
        schema: dict[str, Any],
        *,
        retry_budget: int = 2,
        breaker_threshold: int = 3,
        timeout_s: float | None = None,
        quick: bool = True,
    ) -> None:
        self.schema, self.retry_budget, self.breaker_threshold = (
            schema,
            retry_budget,
            breaker_threshold,
        )
        self.timeout_s = timeout_s
        self._validator = exit_validator(schema)
        self._quick_schema, self._quick = _QUICK_BY_SCHEMA(schema)
        if not quick:
            self._quick = None
        self._status_retries = 0
        self._failing_streak: list[str] = []

    @property
    def cheap_schema(self) -> bool:
        """Whether checking against the schema is cheap for any small payload (no regular
        expressions, no references, no pairwise comparisons): a small payload is then judged on
        the event loop (:meth:`judge_off_loop`)."""
        return self._quick_schema

    def export_state(self) -> dict[str, Any]:
        """The judge's counters as plain data, for a clone's checkpoint (see
        :meth:`restore_state`). The breaker's streak holds one signature repeated, kept once."""
        streak = self._failing_streak
        return {
            "status_retries": self._status_retries,
            "streak": len(streak),
            "streak_signature": streak[-1] if streak else None,
        }

    def restore_state(self, state: Mapping[str, Any]) -> None:
        """Take back the counters :meth:`export_state` gave; nothing changes on an error.

        Raises:
            ValueError: ``state`` is malformed, or holds counters this judge could not have
                reached (retries past its budget, a streak that would have tripped the breaker).
        """
        retries, streak = state.get("status_retries"), state.get("streak")
        signature = state.get("streak_signature")
        if not (_is_count(retries) and retries <= self.retry_budget):
            raise ValueError(f"exit judge: status_retries {short_repr(retries)} out of range")
        if not (_is_count(streak) and streak < self.breaker_threshold):
            raise ValueError(f"exit judge: streak {short_repr(streak)} out of range")
        if streak and not isinstance(signature, str):
            raise ValueError("exit judge: a streak needs its signature")
        self._status_retries = retries
        self._failing_streak = [signature] * streak if isinstance(signature, str) else []

    def note_other_activity(self) -> None:
        """Any other tool activity resets the breaker's streak."""
        self._failing_streak.clear()

    async def judge_off_loop(self, payload: Any) -> ExitDecision:
        """:meth:`judge` on a worker thread: a host's clones share one event loop, and a check
        may take up to ``timeout_s``.

        A small payload against a schema with no regular expressions and no references is
        judged in place: its check is a few microseconds, far less than a thread hand-off, and
        a batch of thousands of clones makes one such call each.
        """
        if self._quick_schema and _is_small(payload):
            return self.judge(payload)
        return await asyncio.get_running_loop().run_in_executor(_judge_pool(), self.judge, payload)

    def judge(self, payload: Any) -> ExitDecision:
        """Decide about one ``exit_tool`` call.

        Order: schema check (a failure goes back to the model), status classification, then for
        a failing call the breaker (before salvage, so a breaker end is never salvaged), then the
        retry budget of unrecognised statuses, then salvage. A check that runs out of time is a
        failing call that spends the same retry budget; with the budget spent it ends the run
        abnormal (an unchecked payload is never salvaged). A schema whose ``$ref`` leads outside
        the document cannot judge anything: the run ends abnormal at once.
        """
        try:
            problem = (
                None
                if self._passes_quick(payload)
                else _problem(self._validator, payload, self.timeout_s)
            )
        except _Unusable as exc:
            return ExitDecision(verdict=Verdict.BREAK, error=str(exc))
        except _TooCostly as exc:
            return self._failing(payload, str(exc), budgeted=True, salvageable=False)
        if problem is not None:
            return self._failing(payload, problem, budgeted=False, salvageable=False)
        status = classify(payload)
        if isinstance(status, Outcome):
            self._failing_streak.clear()
            return ExitDecision(verdict=Verdict.ACCEPT, outcome=status)
        problem = (
            f"unrecognised status {short_repr(status)}: use one of success/ok/done/completed, "
            "failure/failed/error or cancelled, or a `success` boolean"
        )
        return self._failing(payload, problem, budgeted=True, salvageable=True)

    def _passes_quick(self, payload: Any) -> bool:
        """Whether the compiled quick check (:func:`quick_check`) accepts ``payload``; a payload
        it does not accept goes through the full validator, which words the problem."""
        if self._quick is None or payload_problem(payload) is not None:
            return False
        try:
            return self._quick(payload)
        except Exception:  # noqa: BLE001 - never trusted: the full validator decides
            return False

    def _failing(
        self, payload: Any, problem: str, *, budgeted: bool, salvageable: bool
    ) -> ExitDecision:
        # The breaker is checked before salvage: identical failing calls in a row end abnormal.
        signature = _signature(payload)
        if self._failing_streak and self._failing_streak[-1] != signature:
            self._failing_streak.clear()
        self._failing_streak.append(signature)
        if len(self._failing_streak) >= self.breaker_threshold:
            return ExitDecision(
                verdict=Verdict.BREAK, error="no progress: repeated failing exit_tool calls"
            )
        if budgeted:
            if self._status_retries >= self.retry_budget:
                if salvageable:
                    return ExitDecision(verdict=Verdict.SALVAGE, outcome=Outcome.SUCCESS)
                return ExitDecision(
                    verdict=Verdict.BREAK,
                    error=f"exit_tool payloads could not be checked against the exit schema ({problem})",
                )
            self._status_retries += 1
        return ExitDecision(verdict=Verdict.RETRY, error=f"exit_tool rejected: {problem}")


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _quick_parts(schema: dict[str, Any]) -> tuple[bool, Check | None]:
    return _is_quick_schema(schema), quick_check(schema)


_QUICK_BY_SCHEMA = IdentityCache(_quick_parts, 256)
"""What a judge learns from its schema beyond the validator, made once per schema object (every
clone of a batch makes its own judge over the batch's one schema)."""

_SLOW_KEYWORDS = frozenset(
    {"pattern", "patternProperties", "propertyNames", "$ref", "$dynamicRef", "uniqueItems"}
)
_SMALL_PAYLOAD_VALUES = 256


def _is_quick_schema(schema: Any) -> bool:
    """Whether checking against ``schema`` is cheap for any small payload: no regular
    expressions, no references, no pairwise comparisons."""
    stack, seen = [schema], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > 10_000:
            return False
        if isinstance(node, dict):
            if _SLOW_KEYWORDS & node.keys():
                return False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def _is_small(payload: Any) -> bool:
    """Whether ``payload`` has at most a few hundred values and short strings."""
    stack, seen = [payload], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > _SMALL_PAYLOAD_VALUES:
            return False
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and len(node) > 4096:
            return False
    return True
