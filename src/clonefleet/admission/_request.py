"""One candidate model's gate, as a clone's failover layer uses it: admit a request, then say
how it ended (docs/rate-limits.md)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from clonefleet.admission._gate import HostGates, HostScope, Ticket
from clonefleet.admission._scope import Announced
from clonefleet.errors import CapacityTimeout, ModelHTTPError
from clonefleet.providers import LimitReport, ModelRequest, ModelResponse

__all__ = ["CandidateGate", "announced_from", "estimate_tokens"]

TOOL_TOKENS = 100
"""Tokens counted for each tool a request offers, before answers teach better."""
ANSWER_TOKENS = 64
"""Answer tokens counted for a request that sets no ``max_tokens``."""


def estimate_tokens(req: ModelRequest) -> int:
    """A cheap estimate of what a request will count against a token limit: a token per four
    characters of its messages, a flat amount per tool, and its answer's allowance."""
    chars = sum(len(m.content) for m in req.messages)
    answer = req.max_tokens if req.max_tokens else ANSWER_TOKENS
    return chars // 4 + TOOL_TOKENS * len(req.tools) + answer


def announced_from(report: LimitReport | None, now: float) -> Announced | None:
    """What a :class:`LimitReport` tells the limiter (``now``: seconds since the epoch). On
    Anthropic's wire, the input-token window stands for tokens when no combined one is sent."""
    if report is None:
        return None
    requests = report.requests
    tokens = report.tokens or report.input_tokens
    if (requests is None or requests.limit is None) and (tokens is None or tokens.limit is None):
        return None
    empty_at = report.exhausted_until(now)
    return Announced(
        rpm=requests.limit if requests is not None else None,
        tpm=tokens.limit if tokens is not None else None,
        requests_left=requests.remaining if requests is not None else None,
        tokens_left=tokens.remaining if tokens is not None else None,
        empty_for_s=None if empty_at is None else max(empty_at - now, 0.0),
    )


@dataclass(frozen=True, slots=True)
class CandidateGate:
    """The scopes one candidate's requests pass (its provider's, when configured, then its
    model's), on the host's :class:`HostGates`."""

    gates: HostGates
    scopes: tuple[HostScope, ...]
    max_wait_s: float = 900.0
    """Longest a request waits for capacity in all (refusals included) before it fails."""

    async def admit(self, req: ModelRequest, deadline: float) -> Ticket:
        """Wait for capacity for ``req`` until ``deadline`` (``time.monotonic()``).

        Raises:
            CapacityTimeout: no capacity before the deadline.
        """
        model = self.scopes[-1]
        estimate = estimate_tokens(req)
        if all(scope.open for scope in self.scopes):
            return await self.gates.admit(self.scopes, estimate)  # goes at once: no timer
        left = deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(left, 0.0)):
                return await self.gates.admit(self.scopes, estimate)
        except TimeoutError:
            raise CapacityTimeout(
                f"no capacity at {model.provider!r} for model {req.model!r} within "
                f"{self.max_wait_s:g}s (admission.max_wait_s): the provider's rate limit "
                "is used up"
            ) from None

    def answered(self, ticket: Ticket, resp: ModelResponse, req: ModelRequest) -> None:
        used = resp.usage.input_tokens + resp.usage.output_tokens
        model = self.scopes[-1]
        raw = estimate_tokens(req)
        if used > 0 and raw > 0:
            # The first answers set the ratio (a mean), later ones move it (a moving average).
            model.answers += 1
            weight = max(1.0 / model.answers, 0.2)
            model.ratio = (1.0 - weight) * model.ratio + weight * (used / raw)
        self.gates.answered(ticket, used, announced_from(resp.limits, time.time()))

    def refused(self, ticket: Ticket, err: ModelHTTPError) -> None:
        self.gates.refused(ticket, err.retry_after_s, None)

    def abandoned(self, ticket: Ticket) -> None:
        self.gates.abandoned(ticket)
