"""One scope of admission, on the limiter's side: the capacity of a provider (all its models)
or of one model, shared by every host of the fleet (docs/rate-limits.md).

A scope's limits come from the config (``rpm``, ``tpm``, ``max_in_flight``), from the limit
headers its answers carry, or, with neither, from its refusals (:class:`AdaptiveRate`). A scope
nothing is known about starts *probing*: a window of requests in flight that grows with each
answer, until the provider announces a limit (the scope is then *announced*), refuses a request
(*learned*), or the window passes :data:`OPEN_WINDOW` with neither (*open*: nothing to limit).
Pure: ``now`` is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from clonefleet.admission._bucket import Meter, RateBucket, bucket_for

__all__ = [
    "FORGET_S",
    "LEASE_S",
    "MAX_PAUSE_S",
    "OPEN_WINDOW",
    "REFUSAL_CUT",
    "Announced",
    "Demand",
    "Grant",
    "LearnedRate",
    "Limits",
    "ScopeState",
    "Source",
]

OPEN_WINDOW = 1024
"""A probing window this large, with no refusal and no limit announced, opens the scope."""
REFUSAL_CUT = 0.85
"""An announced limit is followed at this share of itself after each refusal while it is."""
LEASE_S = 10.0
"""A host that has not synced for this long gives back the slots it held (it is gone)."""
FORGET_S = 300.0
"""A scope no host has used for this long is forgotten (its limits are learned again)."""
MAX_PAUSE_S = 600.0
"""Longest pause a refusal can put on a scope."""

Source = Literal["config", "headers", "learned", "probing", "none"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Configured limits of a scope (``None``: not configured)."""

    rpm: int | None = None
    tpm: int | None = None
    max_in_flight: int | None = None

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_in_flight is not None

    def tighter(self, other: Limits) -> Limits:
        """Each limit the lower of the two (two batches' configs: neither is exceeded)."""

        def low(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else min(a, b)

        return Limits(
            low(self.rpm, other.rpm),
            low(self.tpm, other.tpm),
            low(self.max_in_flight, other.max_in_flight),
        )


@dataclass(frozen=True, slots=True)
class Announced:
    """What a provider's limit headers said, relative to when they were read."""

    rpm: int | None = None
    tpm: int | None = None
    requests_left: int | None = None
    tokens_left: int | None = None
    empty_for_s: float | None = None
    """Seconds until a window with nothing left refills (``None``: none is empty)."""


@dataclass(frozen=True, slots=True)
class Demand:
    """One host's word on one scope at a sync: what it asks for and what it saw since its
    last sync."""

    scope: str
    provider: str
    model: str | None = None
    """The model's wire name; ``None`` for a provider-wide scope."""
    origin: str = "1"
    """Which of the host's gates of this scope (one per config) it comes from."""
    configured: Limits = Limits()
    learn: bool = True
    probe: int = 8
    """The probing window to start from (the config's ``admission.initial_in_flight``)."""
    want: tuple[int, ...] = ()
    """The token estimate of each request waiting, oldest first."""
    release: int = 0
    """Slots given back."""
    tokens: int = 0
    """Tokens its answers used."""
    overrun: int = 0
    """Tokens its answers used beyond what was reserved for them (negative: fewer)."""
    sent: int = 0
    """Requests it sent without asking (the scope was open)."""
    answered: int = 0
    headerless: int = 0
    """Answers without limit headers."""
    refused: int = 0
    retry_after_s: float | None = None
    announced: Announced | None = None
    waiting: int = 0
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class Grant:
    """The limiter's answer for one scope: how many of the waiting requests (from the oldest)
    may go now, whether the scope is limited at all, and when to ask again."""

    scope: str
    admitted: int = 0
    open: bool = False
    """Nothing limits the scope: send without asking (and report what happens)."""
    retry_in_s: float = 0.0
    slots: bool = False
    """Each admitted request holds a slot until it is answered (a window or ``max_in_flight``)."""


GROWTH = 0.0005
"""A learned rate grows by this share of itself with each answer (about 1% a second at 20
requests a second): slowly, since a provider's burst hides an excess for a while."""
SEEK_GROWTH = 0.05
"""Growth per answer while a learned rate is first sought."""
MEASURED_SHARE = 0.97
"""A learned rate is set to this share of the answers measured while refusals come."""


@dataclass(slots=True)
class LearnedRate:
    """Requests per minute a provider that announces no limit allows, learned from refusals.

    While a provider refuses some requests it is saturated, so the rate of its answers is its
    limit: each refusal (at most one a second) sets the rate to :data:`MEASURED_SHARE` of the
    answers measured over the last seconds, or halves it when none were. Each answer then lets
    the rate grow by :data:`GROWTH`, so that it finds a limit that rose.
    """

    rpm: float
    seeking: bool = True
    """Until the second round of refusals the rate grows fast (:data:`SEEK_GROWTH`): the first
    comes when a probe's burst outruns the provider's, before its rate could be measured."""

    def refused(self, answered_rpm: float, first: bool) -> None:
        measured = answered_rpm * MEASURED_SHARE
        self.rpm = max(1.0, measured if measured > 0 else self.rpm / 2)
        if not first:
            self.seeking = False

    def answered(self, count: int) -> None:
        growth = SEEK_GROWTH if self.seeking else GROWTH
        self.rpm *= (1.0 + growth) ** min(count, 10_000)


@dataclass(slots=True)
class ScopeState:
    """The fleet-wide state of one scope."""

    name: str
    provider: str
    model: str | None
    configured: Limits = Limits()
    learn: bool = True
    announced: Announced | None = None
    adaptive: LearnedRate | None = None
    window: int | None = None
    requests: RateBucket | None = None
    tokens: RateBucket | None = None
    safety: float = 0.95
    """Share of an announced limit followed."""
    cut: float = 1.0
    """Further share of an announced limit after refusals while following it."""
    cut_at: float = -math.inf
    paused_until: float = -math.inf
    configured_by: dict[str, Limits] = field(default_factory=dict)
    """Each host's configured limits (of the batch it runs)."""
    last_seen: float = -math.inf
    held: dict[str, int] = field(default_factory=dict)
    """Slots each host holds."""
    seen: dict[str, float] = field(default_factory=dict)
    """When each host last synced."""
    waiting: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    sent: Meter = field(default_factory=Meter)
    used: Meter = field(default_factory=Meter)
    answers: Meter = field(default_factory=Meter)
    refusals: Meter = field(default_factory=Meter)
    refused_total: int = 0

    # -- what limits the scope ------------------------------------------------------------

    def rpm_limit(self) -> float | None:
        """Requests per minute in force (the tightest of config, headers and learning)."""
        found = [float(self.configured.rpm)] if self.configured.rpm else []
        if self.announced is not None and self.announced.rpm:
            found.append(self.announced.rpm * self.safety * self.cut)
        if self.adaptive is not None:
            found.append(self.adaptive.rpm)
        return min(found) if found else None

    def tpm_limit(self) -> float | None:
        found = [float(self.configured.tpm)] if self.configured.tpm else []
        if self.announced is not None and self.announced.tpm:
            found.append(self.announced.tpm * self.safety * self.cut)
        return min(found) if found else None

    def slot_limit(self) -> int | None:
        found = [n for n in (self.configured.max_in_flight, self.window) if n is not None]
        return min(found) if found else None

    @property
    def open(self) -> bool:
        return (
            self.rpm_limit() is None
            and self.tpm_limit() is None
            and self.slot_limit() is None
            and self.paused_until == -math.inf
        )

    def reshape(self, now: float) -> None:
        """Bring the buckets in line with the limits in force now."""
        self.requests = _shaped(self.requests, self.rpm_limit(), now, self._configured("rpm"))
        self.tokens = _shaped(self.tokens, self.tpm_limit(), now, self._configured("tpm"))

    def source(self) -> Source:
        """Where the limit in force comes from."""
        rpm, tpm = self.rpm_limit(), self.tpm_limit()
        if (rpm is not None and rpm == self.configured.rpm) or (
            tpm is not None and tpm == self.configured.tpm
        ):
            return "config"
        if rpm is not None or tpm is not None:
            return "headers" if self.announced is not None else "learned"
        if self.window is not None:
            return "probing"
        return "config" if self.configured.max_in_flight is not None else "none"

    def _configured(self, which: str) -> bool:
        limit = self.rpm_limit() if which == "rpm" else self.tpm_limit()
        value = self.configured.rpm if which == "rpm" else self.configured.tpm
        return value is not None and limit == value


def _shaped(
    bucket: RateBucket | None, per_minute: float | None, now: float, configured: bool
) -> RateBucket | None:
    if per_minute is None:
        return None
    fresh = bucket_for(per_minute, now, configured=configured)
    if bucket is None:
        return fresh
    bucket.refill(now)
    bucket.reshape(fresh.per_s, fresh.capacity)
    return bucket
