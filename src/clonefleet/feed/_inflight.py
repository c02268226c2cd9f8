"""How many rows a feeder keeps running: about as many as the fleet serves without queueing.

Rows in flight cost what a rate does not show: each holds a provider slot, a clone's memory and
a request that a killed run loses. Past the point where the fleet (its CPUs, the provider's rate
limit, a concurrency cap) is busy, more rows only wait, and each row takes longer from its
submission to its end. :class:`InFlight` watches that time (docs/inputs.md, "Rows in flight"):

- the *base* time is the shortest a window's rows have taken on average among the latest
  :data:`BASE_WINDOWS` windows, the time of a row that waits for nothing (the mean, not the
  median: rows that wait for a host or a provider slot are a tail a median does not see, and by
  Little's law the mean is the rows in flight over the rate of ends); a dataset whose later rows
  are heavier thus has a new base once its old windows are past;
- while a window's rows take at most ``1 + headroom`` times the base, nothing waits: the limit
  doubles (until the first queue is seen), then grows by a quarter;
- once they take more than ``1 + queueing`` times the base, rows wait: the limit goes to what
  the rate measured needs at the base time (Little's law: rate times base time) plus
  ``headroom``, a quarter less at least (a base measured while rows already waited says too
  much) and half at most;
- in between, it holds;
- every ``probe_every`` windows it halves the limit for one window to measure the base again,
  then goes back (a fleet busy from the start, whose rows all waited, would otherwise never show
  the base, and the base would leave the latest windows).

A window holds the rows submitted since the limit last changed (those submitted before ran under
the old limit and say nothing of the new one; after a cut none is submitted until the rows in
flight are down to the new limit), as many as the limit (each slot turned over once,
at least :data:`MIN_WINDOW_ENDS`) over at least ``min_window_s``: a time is a mean over many
rows, whatever a row takes (half a second against a fast simulated model, minutes against a
real one). The first ``warmup`` windows are not judged, nor more while each window's time falls
by a fifth or more (hosts starting, caches filling), up to :data:`MAX_WARMUP`.

Pure: no Ray, no threads, no clock of its own: the feeder calls :meth:`InFlight.ended` with
when each row that ended was submitted and when it ended, both on the feeder's clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

__all__ = ["InFlight", "Limiter", "Span"]

Span = tuple[float, float]
"""A row's ``(submitted at, ended at)``, in seconds on the caller's monotonic clock."""

HISTORY = 256
"""Windows kept in :attr:`InFlight.history`."""
MIN_WINDOW_ENDS = 16
"""The fewest rows a window is measured over."""
MAX_WARMUP = 8
"""The most windows at the start that are not judged."""
BASE_WINDOWS = 40
"""The latest windows whose shortest mean time is the base time (more than ``probe_every``, so
that a probe's window is always among them)."""


class Limiter(Protocol):
    """What a feeder asks of a limit on rows in flight (:class:`InFlight` is one)."""

    limit: int
    """The most rows to keep submitted and not ended now."""

    def ended(self, spans: Sequence[Span]) -> None:
        """Note rows that ended, each as ``(submitted at, ended at)``."""
        ...


class InFlight:
    """The limit on rows submitted and not ended, from the time rows take to end.

    Args:
        ceiling: the most rows ever in flight (the feeder's ``ahead``).
        start: the first limit (within ``floor`` and ``ceiling``).
        floor: the fewest rows the limit goes down to.
        headroom: the share over the base time below which nothing is taken to wait, and the
            share of rows over what the rate needs kept when the limit is cut.
        queueing: the share over the base time past which rows are taken to wait.
        min_window_s: the shortest window.
        warmup: windows at the start that are not judged (more while the time falls).
        probe_every: windows between two probes of the base time.
    """

    def __init__(
        self,
        ceiling: int,
        *,
        start: int = 256,
        floor: int = 32,
        headroom: float = 0.1,
        queueing: float = 0.3,
        min_window_s: float = 0.5,
        warmup: int = 2,
        probe_every: int = 30,
    ) -> None:
        if ceiling < 1:
            raise ValueError(f"ceiling must be 1 or more, got {ceiling}")
        if not 0 < headroom < queueing:
            raise ValueError(f"need 0 < headroom < queueing, got {headroom} and {queueing}")
        self.ceiling = ceiling
        self.floor = max(1, min(floor, ceiling))
        self.limit = max(self.floor, min(start, ceiling))
        self.headroom, self.queueing = headroom, queueing
        self.min_window_s = min_window_s
        self.probe_every = probe_every
        self._warmup_left = warmup
        self._warmup_mean: float | None = None
        self._changed_at = -math.inf
        """When the limit last changed: rows submitted before are left out of the window."""
        self._first_end: float | None = None
        """When the window's first row ended (its rate is measured from there)."""
        self._ends = 0
        """Rows of any age that ended in the window (for its rate)."""
        self._took: list[float] = []
        """Seconds each row submitted since the last change took (for its mean)."""
        self._last_end = -math.inf
        self._slow_start = True
        """Doubling until rows are first seen to wait."""
        self._probe_from: int | None = None
        """The limit to go back to after the probe under way."""
        self._since_probe = 0
        """Windows judged since the last probe."""
        self._means: deque[float] = deque(maxlen=BASE_WINDOWS)
        """The mean times of the latest judged windows."""
        self.base_s: float | None = None
        """The base time: the shortest of :attr:`_means`."""
        self.windows = 0
        """Windows measured so far."""
        self.peak = self.limit
        """The highest limit so far."""
        self.history: deque[tuple[float, int, float, float, str]] = deque(maxlen=HISTORY)
        """The latest windows: ``(when it ended, the limit it ran under, its rate of ends a
        second, its rows' mean seconds, what was made of it)``."""

    def ended(self, spans: Sequence[Span]) -> None:
        """Note rows that ended, each as ``(submitted at, ended at)`` on the caller's clock."""
        if not spans:
            return
        for sent, end in spans:
            if self._first_end is None:
                self._first_end = end
            self._last_end = max(self._last_end, end)
            self._ends += 1
            if sent >= self._changed_at:
                self._took.append(end - sent)
        now, first = self._last_end, self._first_end
        elapsed = now - (first if first is not None else now)
        if len(self._took) < max(MIN_WINDOW_ENDS, self.limit) or elapsed < self.min_window_s:
            return
        rate = self._ends / max(elapsed, 1e-6)
        mean = math.fsum(self._took) / len(self._took)
        self._first_end, self._ends, self._took = None, 0, []
        self.windows += 1
        limit = self.limit
        verdict = self._judge(rate, mean)
        if self.limit != limit:
            self._changed_at = now
        self.history.append((now, limit, rate, mean, verdict))
        self.peak = max(self.peak, self.limit)

    def _set(self, limit: int) -> None:
        self.limit = max(self.floor, min(self.ceiling, limit))

    def _warming(self, mean: float) -> bool:
        """Whether the window is one of the warm-up's: the first ``warmup``, and after them
        while each window's time is a fifth or more under the one before (at most
        :data:`MAX_WARMUP` in all)."""
        if self._warmup_left < 0:
            return False  # over for good
        before, self._warmup_mean = self._warmup_mean, mean
        if self._warmup_left > 0:
            self._warmup_left -= 1
            return True
        if before is not None and mean < 0.8 * before and self.windows <= MAX_WARMUP:
            return True
        self._warmup_left = -1
        return False

    def _judge(self, rate: float, mean: float) -> str:
        """Move the limit on from the rate and mean time of the window just measured;
        returns what was made of it."""
        if self._warming(mean):
            return "warmup"
        self._means.append(mean)
        self.base_s = base = min(self._means)
        if self._probe_from is not None:  # the probe's window measured: back to the limit
            self._set(self._probe_from)
            self._probe_from = None
            return "probed"
        self._since_probe += 1
        if self._since_probe >= self.probe_every and self.limit > self.floor:
            self._probe_from, self._since_probe = self.limit, 0
            self._set(self.limit // 2)
            return "probe"
        ratio = mean / base if base > 0 else 1.0
        if ratio <= 1 + self.headroom:
            self._set(self.limit * 2 if self._slow_start else self.limit + max(1, self.limit // 4))
            return "grow"
        if ratio <= 1 + self.queueing:
            return "hold"
        self._slow_start = False
        needed = round(rate * base * (1 + self.headroom))
        self._set(max(self.limit // 2, min(needed, self.limit - self.limit // 4)))
        return "cut"
