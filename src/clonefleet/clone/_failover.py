"""Model-group failover: one clone's cursor over its candidate models (docs/config.md).

The cursor starts at the clone's own candidate (clone *i* at *i mod len(group)*). A transient
failure is retried on the same candidate with backoff (honouring ``Retry-After``), then the
cursor moves on; a non-transient failure moves on at once. After a success the cursor stays on
the candidate that answered, a ``fallback_models`` entry included. One request tries each entry
of the ring (the group from the clone's start, then the fallbacks) at most once, beginning at
the cursor; when every one has failed, :class:`AllModelsFailed` lists each last failure and
carries the run record's ``cause`` (:func:`failure_cause`, docs/json.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from clonefleet.admission import CandidateGate, Ticket
from clonefleet.errors import AllModelsFailed, ModelError, ModelHTTPError, ModelTimeout
from clonefleet.providers import Model, ModelRequest, ModelResponse

__all__ = [
    "CAUSE_MESSAGE_LIMIT",
    "LENGTH_WARNING",
    "Candidate",
    "FailoverModel",
    "OnRateLimited",
    "Tried",
    "backoff_s",
    "failure_cause",
]

CAUSE_MESSAGE_LIMIT = 300
"""Characters kept of a provider's error message in a failure's ``cause``."""
LENGTH_WARNING = "the model's answer stopped at its max_tokens limit"
"""A run's warning, after ``turn N: ``, when an answer stopped for length (once per run)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One model the clone may use."""

    key: str
    """The config name (``sim-small``, ``small``); what events and results report."""
    wire_name: str
    """The name sent to the provider."""
    model: Model
    provider: str = ""
    """The config name of the candidate's provider (``""`` when unknown)."""
    max_retries: int = 2
    timeout_s: float = 60.0
    """Overall deadline of one attempt, in seconds."""
    gate: CandidateGate | None = None
    """The fleet-wide admission its requests pass (``None``: none, they go at once)."""
    max_tokens: int | None = None
    """The cap on each answer's tokens (``models.<name>.max_tokens``): sent to the provider,
    or the request's own when that is smaller (``None``: the request's, else the wire's
    default)."""


def backoff_s(
    attempt: int, retry_after_s: float | None, *, base_s: float = 0.25, cap_s: float = 8.0
) -> float:
    """Delay before retry number ``attempt`` (0-based); ``Retry-After`` wins when given."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.0), 60.0)
    return min(base_s * 2.0**attempt, cap_s)


@dataclass(slots=True, kw_only=True)
class Tried:
    """One candidate's part in a failed request: attempts, time waited, its last error."""

    model: str
    provider: str = ""
    attempts: int = 0
    waited_s: float = 0.0
    error: ModelError | None = None


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _candidate_cause(tried: Tried) -> dict[str, Any]:
    err = tried.error
    http = err if isinstance(err, ModelHTTPError) else None
    if http is not None:
        error_type, message = http.error_type, http.body or str(http)
    else:
        error_type, message = (type(err).__name__, str(err)) if err is not None else ("", "")
    return {
        "model": tried.model,
        "provider": tried.provider,
        "attempts": tried.attempts,
        "last_status": http.status if http is not None else None,
        "error_type": error_type,
        "message": _cut(message, CAUSE_MESSAGE_LIMIT),
    }


def _what(entry: dict[str, Any]) -> str:
    if entry["last_status"] is None:
        return entry["error_type"] or "error"
    return f"HTTP {entry['last_status']} {entry['error_type']}".strip()


def failure_cause(tries: Sequence[Tried]) -> dict[str, Any]:
    """The ``cause`` of a request every candidate failed (docs/json.md): the candidates in the
    order tried, total attempts and wait, and a ``summary`` such as ``HTTP 401 invalid_api_key
    on model x`` (models with the same failure named together, sorted, so that equal causes of
    clones starting on different candidates read the same)."""
    candidates = [_candidate_cause(t) for t in tries]
    models: dict[str, set[str]] = {}
    for entry in candidates:
        models.setdefault(_what(entry), set()).add(entry["model"])
    parts = [
        f"{what} on model{'s' if len(names) > 1 else ''} {', '.join(sorted(names))}"
        for what, names in sorted(models.items())
    ]
    return {
        "summary": _cut("; ".join(parts), CAUSE_MESSAGE_LIMIT),
        "attempts": sum(t.attempts for t in tries),
        "waited_s": round(sum(t.waited_s for t in tries), 3),
        "candidates": candidates,
    }


OnFailover = Callable[[str, str, str], None]
"""Called as ``(from_model, to_model, reason)`` when the cursor moves."""
OnRateLimited = Callable[[Candidate, ModelHTTPError], None]
"""Called when a provider refuses a request for its rate (the request then waits)."""


class FailoverModel:
    """A :class:`Model` that walks a clone's candidates with retries and failover."""

    def __init__(
        self,
        candidates: Sequence[Candidate],
        *,
        start: int = 0,
        fallbacks: Sequence[Candidate] = (),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_failover: OnFailover | None = None,
        fail_over_on_rate_limit: bool = False,
        on_rate_limited: OnRateLimited | None = None,
    ) -> None:
        if not candidates:
            raise ValueError("a model group needs at least one candidate")
        self._candidates = list(candidates)
        self._fallbacks = list(fallbacks)
        self._sleep = sleep
        self._on_failover = on_failover
        self._rate_fails_over = fail_over_on_rate_limit
        self._on_rate_limited = on_rate_limited
        self.reset(start)

    @property
    def current(self) -> str:
        """Key of the candidate the next request goes to."""
        return self._ring[self._cursor].key

    def reset(self, start: int = 0) -> None:
        """Select the group again: the cursor returns to the group's candidate ``start``."""
        self._first = start % len(self._candidates)
        self._ring = self._ring_from(self._first)
        self._cursor = 0

    def _ring_from(self, first: int) -> list[Candidate]:
        return self._candidates[first:] + self._candidates[:first] + self._fallbacks

    def export_cursor(self) -> dict[str, Any]:
        """The cursor as plain data, for a clone's checkpoint (see :meth:`restore_cursor`)."""
        return {"start": self._first, "cursor": self._cursor, "current": self.current}

    def restore_cursor(self, state: Mapping[str, Any]) -> bool:
        """Put the cursor back where :meth:`export_cursor` saw it.

        Returns ``False``, changing nothing, when the saved cursor does not fit this model's
        candidates (another group: the cursor stays where it is).

        Raises:
            ValueError: ``state`` is not what :meth:`export_cursor` returns.
        """
        start, cursor, current = state.get("start"), state.get("cursor"), state.get("current")
        if not (_is_index(start) and _is_index(cursor) and isinstance(current, str)):
            raise ValueError("a failover cursor needs integer start and cursor and a model key")
        if start >= len(self._candidates):
            return False
        ring = self._ring_from(start)
        if cursor >= len(ring) or ring[cursor].key != current:
            return False
        self._first, self._ring, self._cursor = start, ring, cursor
        return True

    def _order(self) -> list[tuple[int, Candidate]]:
        n = len(self._ring)
        return [((self._cursor + k) % n, self._ring[(self._cursor + k) % n]) for k in range(n)]

    async def request(self, req: ModelRequest) -> ModelResponse:
        """Send ``req`` to the current candidate, failing over as docs/config.md describes.

        Raises:
            AllModelsFailed: every candidate and fallback failed.
        """
        failures: dict[str, str] = {}
        tries: list[Tried] = []
        order = self._order()
        for position, (slot, cand) in enumerate(order):
            tried = Tried(model=cand.key, provider=cand.provider)
            tries.append(tried)
            try:
                resp = await self._attempts(cand, req, tried)
            except ModelError as exc:
                tried.error = exc
                failures[cand.key] = str(exc) or type(exc).__name__
                if position + 1 < len(order) and self._on_failover:
                    self._on_failover(cand.key, order[position + 1][1].key, failures[cand.key])
                continue
            self._cursor = slot  # keep the candidate that answered
            # Built directly: dataclasses.replace walks the fields on every call of every clone.
            return ModelResponse(
                text=resp.text,
                tool_calls=resp.tool_calls,
                usage=resp.usage,
                model=cand.key,
                refusal=resp.refusal,
                limits=resp.limits,
                truncated=resp.truncated,
            )
        raise AllModelsFailed(failures, failure_cause(tries))

    async def _attempts(self, cand: Candidate, req: ModelRequest, tried: Tried) -> ModelResponse:
        wire = ModelRequest(
            model=cand.wire_name,
            messages=req.messages,
            tools=req.tools,
            max_tokens=_cap(req.max_tokens, cand.max_tokens),
            metadata=req.metadata,
        )
        gate = cand.gate
        deadline = time.monotonic() + (gate.max_wait_s if gate is not None else 0.0)
        attempt = 0
        while True:
            tried.attempts = attempt + 1
            ticket = None
            if gate is not None:
                began = time.monotonic()
                try:
                    ticket = await gate.admit(wire, deadline)
                except ModelTimeout:
                    tried.waited_s += time.monotonic() - began
                    if tried.error is not None:
                        raise tried.error from None  # the last refusal says more
                    raise
                tried.waited_s += time.monotonic() - began
            err = await self._send(cand, wire, gate, ticket)
            if isinstance(err, ModelResponse):
                return err
            if gate is not None and isinstance(err, ModelHTTPError) and err.rate_limited:
                tried.error = err
                if self._on_rate_limited is not None:
                    self._on_rate_limited(cand, err)
                if not self._rate_fails_over:
                    continue  # back in the limiter's queue: not an attempt, no failover
                raise err
            if not err.retryable or attempt == cand.max_retries:
                raise err
            delay = backoff_s(attempt, err.retry_after_s)
            tried.waited_s += delay
            await self._sleep(delay)
            attempt += 1

    @staticmethod
    async def _send(
        cand: Candidate, wire: ModelRequest, gate: CandidateGate | None, ticket: Ticket | None
    ) -> ModelResponse | ModelError:
        """One request: its answer, or the error it failed with (told to the gate either way)."""
        # An HTTP model bounds each request itself, with the same timeout: a second timer per
        # request (of thousands of clones) would only cost.
        bounded = getattr(cand.model, "deadline_s", None)
        own = isinstance(bounded, int | float) and bounded <= cand.timeout_s
        try:
            if own:
                resp = await cand.model.request(wire)
            else:
                async with asyncio.timeout(cand.timeout_s):
                    resp = await cand.model.request(wire)
        except TimeoutError:
            err: ModelError = ModelTimeout(f"no complete response within {cand.timeout_s:g}s")
        except ModelError as exc:
            err = exc
        except BaseException:
            if gate is not None and ticket is not None:
                gate.abandoned(ticket)
            raise
        else:
            if gate is not None and ticket is not None:
                gate.answered(ticket, resp, wire)
            return resp
        if gate is not None and ticket is not None:
            if isinstance(err, ModelHTTPError) and err.rate_limited:
                gate.refused(ticket, err)
            else:
                gate.abandoned(ticket)
        return err


def _cap(asked: int | None, model_cap: int | None) -> int | None:
    """The answer cap sent: the smaller of the request's and the candidate's."""
    if asked is None or model_cap is None:
        return model_cap if asked is None else asked
    return min(asked, model_cap)


def _is_index(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
