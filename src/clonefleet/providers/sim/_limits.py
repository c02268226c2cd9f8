"""Rate limits of the simulated provider: per-model token buckets for requests and tokens per
minute, and the limit headers each wire format sends (docs/cli.md, "Rate limits of the simulated
provider"). Pure: time comes from an injectable clock, so tests drive it with a fake one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from clonefleet.providers._protocol import ModelRequest
from clonefleet.providers.sim._prefix import text_tokens

__all__ = [
    "DEFAULT_ANSWER_TOKENS",
    "Admission",
    "Bucket",
    "SimLimiter",
    "SimLimits",
    "anthropic_limit_headers",
    "go_duration",
    "openai_limit_headers",
    "request_cost",
]

DEFAULT_ANSWER_TOKENS = 16
"""Answer tokens counted for a request that names no ``max_tokens``."""

Kind = Literal["requests", "tokens"]


@dataclass(frozen=True, slots=True)
class SimLimits:
    """The limits a simulated provider enforces, the same for each model it serves.

    Args:
        rpm: requests per minute (``None``: no request limit).
        tpm: tokens per minute, counted by :func:`request_cost` (``None``: no token limit).
        burst: requests the request bucket holds after an idle spell (default: one second of
            ``rpm``, at least 1); the token bucket holds the same span of ``tpm`` (one second's
            worth without ``rpm``). Needs ``rpm``.
        headers: send the limit headers and ``retry-after`` (``False``: a 429 says only its
            status and body).

    Raises:
        ValueError: a limit is not a positive whole number, or ``burst`` comes without ``rpm``.
    """

    rpm: int | None = None
    tpm: int | None = None
    burst: int | None = None
    headers: bool = True

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "burst"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a whole number of 1 or more, not {value!r}")
        if self.burst is not None and self.rpm is None:
            raise ValueError("burst needs rpm: it counts requests")

    @property
    def enabled(self) -> bool:
        """Whether any limit is set."""
        return self.rpm is not None or self.tpm is not None

    @property
    def span_s(self) -> float:
        """Seconds of its rate that each bucket holds when full."""
        if self.rpm is None:
            return 1.0
        return 60.0 * self.request_capacity / self.rpm

    @property
    def request_capacity(self) -> int:
        """Size of the request bucket, in requests."""
        if self.rpm is None:
            return 0
        return self.burst if self.burst is not None else max(1, math.ceil(self.rpm / 60))


@dataclass(slots=True)
class Bucket:
    """One refilling bucket: holds up to ``capacity``, gains ``rate_per_s`` each second.

    A charge larger than the capacity is let through when the bucket is full and leaves it in
    debt, so no request is refused forever.
    """

    limit: int
    """The per-minute limit the bucket enforces (the figure the limit headers report)."""
    capacity: float
    rate_per_s: float
    level: float
    at: float
    """Clock time of ``level``."""

    @classmethod
    def full(cls, per_minute: int, capacity: float, now: float) -> Bucket:
        return cls(per_minute, capacity, per_minute / 60.0, capacity, now)

    def refill(self, now: float) -> None:
        """Bring ``level`` up to ``now``."""
        if now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.rate_per_s)
            self.at = now

    def wait_s(self, cost: float) -> float:
        """Seconds until the bucket can take ``cost`` (0 when it can now)."""
        need = min(cost, self.capacity) - self.level
        return max(0.0, need / self.rate_per_s) if need > 1e-9 else 0.0

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.capacity - self.level) / self.rate_per_s)

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level + 1e-9))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one bucket looks like after an admission, for the limit headers."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True, slots=True)
class Admission:
    """The limiter's answer to one request."""

    admitted: bool
    binding: Kind | None = None
    """The limit that refused the request (the one with the longer wait)."""
    retry_after_s: float = 0.0
    """Seconds until the request would be let through (0 when admitted)."""
    cost: int = 0
    requests: Snapshot | None = None
    tokens: Snapshot | None = None


@dataclass(slots=True)
class SimLimiter:
    """Per-model token buckets enforcing :class:`SimLimits`; ``clock`` gives seconds."""

    limits: SimLimits
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, tuple[Bucket | None, Bucket | None]] = field(default_factory=dict)

    def _for(self, model: str, now: float) -> tuple[Bucket | None, Bucket | None]:
        pair = self._buckets.get(model)
        if pair is None:
            lim = self.limits
            requests = Bucket.full(lim.rpm, lim.request_capacity, now) if lim.rpm else None
            tokens = Bucket.full(lim.tpm, lim.tpm * lim.span_s / 60.0, now) if lim.tpm else None
            pair = self._buckets[model] = (requests, tokens)
        return pair

    def admit(self, model: str, cost: int) -> Admission:
        """Let one request of ``cost`` tokens to ``model`` through (charging both buckets), or
        refuse it (charging nothing) with the wait that would let it through."""
        now = self.clock()
        requests, tokens = self._for(model, now)
        waits: dict[Kind, float] = {}
        if requests is not None:
            requests.refill(now)
            waits["requests"] = requests.wait_s(1)
        if tokens is not None:
            tokens.refill(now)
            waits["tokens"] = tokens.wait_s(cost)
        binding = max(waits, key=lambda k: waits[k], default=None)
        refused = binding is not None and waits[binding] > 0
        if not refused:
            if requests is not None:
                requests.level -= 1
            if tokens is not None:
                tokens.level -= cost
        return Admission(
            admitted=not refused,
            binding=binding if refused else None,
            retry_after_s=waits[binding] if refused and binding else 0.0,
            cost=cost,
            requests=_snapshot(requests),
            tokens=_snapshot(tokens),
        )


def _snapshot(bucket: Bucket | None) -> Snapshot | None:
    if bucket is None:
        return None
    return Snapshot(bucket.limit, bucket.remaining, bucket.reset_s())


def request_cost(req: ModelRequest) -> int:
    """Tokens a request counts against ``tpm``: its input, counted as the simulated model counts
    usage (words of the messages), plus its ``max_tokens`` (else ``DEFAULT_ANSWER_TOKENS``)."""
    words = sum(text_tokens(m.content) for m in req.messages)
    return words + (req.max_tokens if req.max_tokens else DEFAULT_ANSWER_TOKENS)


def go_duration(seconds: float) -> str:
    """A duration as OpenAI's limit headers write it: ``120ms``, ``1.5s``, ``6m0s``, ``1h0m0s``."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _retry_after(admission: Admission) -> dict[str, str]:
    if admission.admitted:
        return {}
    return {"retry-after": str(max(1, math.ceil(admission.retry_after_s - 1e-6)))}


def openai_limit_headers(admission: Admission) -> dict[str, str]:
    """``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the limits that are set,
    and on a refusal ``retry-after`` (whole seconds, rounded up) and ``retry-after-ms``."""
    out: dict[str, str] = {}
    for kind, snap in (("requests", admission.requests), ("tokens", admission.tokens)):
        if snap is not None:
            out[f"x-ratelimit-limit-{kind}"] = str(snap.limit)
            out[f"x-ratelimit-remaining-{kind}"] = str(snap.remaining)
            out[f"x-ratelimit-reset-{kind}"] = go_duration(snap.reset_s)
    if not admission.admitted:
        out.update(_retry_after(admission))
        out["retry-after-ms"] = str(max(1, math.ceil(admission.retry_after_s * 1000 - 1e-6)))
    return out


def rfc3339(wall_s: float) -> str:
    """A wall-clock time as Anthropic's reset headers write it, rounded up to the second:
    ``2026-12-01T22:50:07Z``."""
    moment = datetime.fromtimestamp(math.ceil(wall_s - 1e-6), UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def anthropic_limit_headers(admission: Admission, wall_now: float) -> dict[str, str]:
    """``anthropic-ratelimit-requests-{limit,remaining,reset}`` and the same for ``tokens``,
    ``input-tokens`` and ``output-tokens`` (one bucket counts both, so the three report it
    alike), for the limits that are set; resets are RFC 3339 times; on a refusal
    ``retry-after`` in whole seconds, rounded up."""
    out: dict[str, str] = {}
    named = [("requests", admission.requests)]
    named += [(k, admission.tokens) for k in ("tokens", "input-tokens", "output-tokens")]
    for kind, snap in named:
        if snap is not None:
            out[f"anthropic-ratelimit-{kind}-limit"] = str(snap.limit)
            out[f"anthropic-ratelimit-{kind}-remaining"] = str(snap.remaining)
            out[f"anthropic-ratelimit-{kind}-reset"] = rfc3339(wall_now + snap.reset_s)
    out.update(_retry_after(admission))
    return out
