"""Model-group failover: one clone's cursor over its candidate models (docs/config.md).

The cursor starts at the clone's own candidate (clone *i* at *i mod len(group)*). A transient
failure is retried on the same candidate with backoff (honouring ``Retry-After``), then the
cursor moves on; a non-transient failure moves on at once. After a success the cursor stays on
the candidate that answered, a ``fallback_models`` entry included. One request tries each entry
of the ring (the group from the clone's start, then the fallbacks) at most once, beginning at
the cursor; when every one has failed, :class:`AllModelsFailed` lists each last failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from clonefleet.errors import AllModelsFailed, ModelError, ModelTimeout
from clonefleet.providers import Model, ModelRequest, ModelResponse

__all__ = ["Candidate", "FailoverModel", "backoff_s"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One model the clone may use."""

    key: str
    """The config name (``sim-small``, ``small``); what events and results report."""
    wire_name: str
    """The name sent to the provider."""
    model: Model
    max_retries: int = 2
    timeout_s: float = 60.0
    """Overall deadline of one attempt, in seconds."""


def backoff_s(
    attempt: int, retry_after_s: float | None, *, base_s: float = 0.25, cap_s: float = 8.0
) -> float:
    """Delay before retry number ``attempt`` (0-based); ``Retry-After`` wins when given."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.0), 60.0)
    return min(base_s * 2.0**attempt, cap_s)


OnFailover = Callable[[str, str, str], None]
"""Called as ``(from_model, to_model, reason)`` when the cursor moves."""


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
    ) -> None:
        if not candidates:
            raise ValueError("a model group needs at least one candidate")
        self._candidates = list(candidates)
        self._fallbacks = list(fallbacks)
        self._sleep = sleep
        self._on_failover = on_failover
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
        order = self._order()
        for position, (slot, cand) in enumerate(order):
            try:
                resp = await self._attempts(cand, req)
            except ModelError as exc:
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
            )
        raise AllModelsFailed(failures)

    async def _attempts(self, cand: Candidate, req: ModelRequest) -> ModelResponse:
        wire = ModelRequest(
            model=cand.wire_name,
            messages=req.messages,
            tools=req.tools,
            max_tokens=req.max_tokens,
            metadata=req.metadata,
        )
        # An HTTP model bounds each request itself, with the same timeout: a second timer per
        # request (of thousands of clones) would only cost.
        bounded = getattr(cand.model, "deadline_s", None)
        own = isinstance(bounded, int | float) and bounded <= cand.timeout_s
        for attempt in range(cand.max_retries + 1):
            try:
                if own:
                    return await cand.model.request(wire)
                async with asyncio.timeout(cand.timeout_s):
                    return await cand.model.request(wire)
            except TimeoutError:
                err: ModelError = ModelTimeout(f"no complete response within {cand.timeout_s:g}s")
            except ModelError as exc:
                err = exc
            if not err.retryable or attempt == cand.max_retries:
                raise err
            await self._sleep(backoff_s(attempt, err.retry_after_s))
        raise AssertionError("unreachable")


def _is_index(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
