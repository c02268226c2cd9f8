"""A refilling bucket of capacity (requests or tokens) and a one-minute rate meter. Pure: every
call is given ``now`` (seconds on one monotonic clock of the caller's)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["FILL_S", "Meter", "RateBucket", "bucket_for"]

FILL_S = 0.5
"""Seconds of its rate a bucket holds when full: the largest burst it lets through."""


@dataclass(slots=True)
class RateBucket:
    """Holds up to ``capacity`` and gains ``per_s`` each second; a charge may leave it in debt
    (below zero), which later refills pay back first."""

    per_s: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.per_s)
            self.at = now

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` fits (0 when it fits now); a cost above the capacity fits once
        the bucket is full."""
        need = min(cost, self.capacity) - self.level
        return need / self.per_s if need > 1e-9 else 0.0

    def reshape(self, per_s: float, capacity: float) -> None:
        """A new rate and size; the level is kept, bounded by the new size."""
        self.per_s, self.capacity = per_s, capacity
        self.level = min(self.level, capacity)


def bucket_for(per_minute: float, now: float, *, configured: bool) -> RateBucket:
    """A full bucket for ``per_minute``. A configured limit is never exceeded in any minute:
    its burst is taken out of its rate (``capacity + 60 * per_s == per_minute``)."""
    capacity = max(1.0, per_minute / 60.0 * FILL_S)
    per_s = (per_minute - capacity) / 60.0 if configured else per_minute / 60.0
    return RateBucket(max(per_s, per_minute / 600.0), capacity, capacity, now)


@dataclass(slots=True)
class Meter:
    """Counts over the last minute in one-second slots: requests or tokens "per minute now"."""

    slots: list[float] = field(default_factory=lambda: [0.0] * 60)
    second: int = 0

    def _advance(self, now: float) -> None:
        second = math.floor(now)
        if second - self.second >= 60:
            self.slots = [0.0] * 60
        else:
            for s in range(self.second + 1, second + 1):
                self.slots[s % 60] = 0.0
        self.second = max(self.second, second)

    def add(self, now: float, amount: float) -> None:
        self._advance(now)
        self.slots[self.second % 60] += amount

    def total(self, now: float) -> float:
        """The sum over the 60 seconds up to ``now``."""
        self._advance(now)
        return sum(self.slots)

    def recent_per_minute(self, now: float, span_s: int = 5) -> float:
        """The rate over the last ``span_s`` whole seconds and this one so far, per minute."""
        self._advance(now)
        total = sum(self.slots[(self.second - k) % 60] for k in range(span_s + 1))
        return total * 60 / (span_s + max(now - self.second, 0.05))
