"""How many rows a feeder keeps running: about as many as the fleet serves without queueing.

Rows in flight cost what a rate does not show: each holds a provider slot, a clone's memory and
a request that a killed run loses. Past the point where the fleet (its CPUs, the provider's rate
limit, a concurrency cap) is busy, more rows only wait, and each row takes longer from its
submission to its end. :class:`InFlight` watches that time (docs/inputs.md, "Rows in flight"):

- the *base* time is the shortest a window's rows have taken on average, the time of a row
  that waits for nothing (the mean, not the median: rows that wait for a host or a provider
  slot are a tail a median does not see, and by Little's law the mean is the rows in flight
  over the rate of ends);
- while a window's rows take less than ``1 + headroom`` times the base, nothing waits: the limit
  doubles (until the first queue is seen), then grows by a quarter;
- once they take more than ``1 + queueing`` times the base, rows wait: the limit goes to what
  the rate measured needs at the base time (Little's law: rate times base time) plus
  ``headroom``, never less than half of it at once;
- in between, it holds;
- a cut that did not shorten the rows' time (still over ``1 + queueing`` times the base, and
  no less than ``1 - headroom`` of the time before it) found no queue: the rows themselves got
  heavier (a dataset's later rows), so that time is the base from then on and the limit goes
  back to what it was;
- after ``probe_every`` windows without a shorter time, it halves the limit for one window to
  measure the base again, then goes back (a fleet busy from the start, whose rows all waited,
  would otherwise never show the base).

A window is as many ends as the limit (at least 16: each slot turned over once) and at least ``min_window_s``: each
time is a mean over many rows, whatever a row takes (half a second against a fast simulated
model, minutes against a real one). The window just after a change is not judged (its rows ran
under the old limit), nor are the first ``warmup`` windows, nor more while each window's time
falls by a fifth or more (hosts starting, caches filling), up to :data:`MAX_WARMUP`.

Pure: no Ray, no threads; the feeder calls :meth:`InFlight.ended` with the times of the rows
that ended.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["InFlight", "Limiter"]

HISTORY = 256
"""Windows kept in :attr:`InFlight.history`."""
MIN_WINDOW_ENDS = 16
"""The fewest ends a window is measured over."""
MAX_WARMUP = 8
"""The most windows at the start that are not judged."""


class Limiter(Protocol):
    """What a feeder asks of a limit on rows in flight (:class:`InFlight` is one)."""

    limit: int
    """The most rows to keep submitted and not ended now."""

    def ended(self, seconds: Sequence[float]) -> None:
        """Note rows that ended, each with the seconds from its submission to its end."""
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
        probe_every: windows without a shorter time after which the base is measured again.
        clock: monotonic seconds (injected in tests).
    """

    def __init__(
        self,
        ceiling: int,
        *,
        start: int = 128,
        floor: int = 32,
        headroom: float = 0.1,
        queueing: float = 0.4,
        min_window_s: float = 0.5,
        warmup: int = 2,
        probe_every: int = 30,
        clock: Callable[[], float] = time.monotonic,
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
        self._clock = clock
        self._warmup_left = warmup
        self._warmup_mean: float | None = None
        self.probe_every = probe_every
        self._unrefreshed = 0
        """Windows since the base time was last lowered or probed."""
        self._probe_from: int | None = None
        """The limit to go back to after the probe under way."""
        self._window_start: float | None = None
        self._times: list[float] = []
        self._settling = False
        """Whether the window under way follows a change of the limit (not judged)."""
        self._slow_start = True
        """Doubling until rows are first seen to wait."""
        self._cut_from: tuple[int, float] | None = None
        """``(limit, mean seconds)`` before the latest cut, until the window after it."""
        self.base_s: float | None = None
        """The base time: the shortest mean time of a window's rows (or the time a cut
        did not shorten)."""
        self.windows = 0
        """Windows measured so far."""
        self.peak = self.limit
        """The highest limit so far."""
        self.history: deque[tuple[float, int, float, float, str]] = deque(maxlen=HISTORY)
        """The latest windows: ``(clock time at its end, the limit it ran under, its rate of
        ends a second, its rows' mean seconds, what was made of it)``."""

    def ended(self, seconds: Sequence[float]) -> None:
        """Note rows that ended, each with the seconds from its submission to its end (the
        first call starts the first window)."""
        now = self._clock()
        if self._window_start is None:
            self._window_start = now
        self._times.extend(seconds)
        elapsed = now - self._window_start
        if len(self._times) < max(MIN_WINDOW_ENDS, self.limit) or elapsed < self.min_window_s:
            return
        rate = len(self._times) / elapsed if elapsed > 0 else float("inf")
        mean = statistics.fmean(self._times)
        self._window_start, self._times = now, []
        self.windows += 1
        limit = self.limit
        verdict = self._judge(rate, mean)
        self.history.append((now, limit, rate, mean, verdict))
        self.peak = max(self.peak, self.limit)

    def _set(self, limit: int) -> None:
        limit = max(self.floor, min(self.ceiling, limit))
        if limit != self.limit:
            self._settling = True
        self.limit = limit

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
        self._unrefreshed += 1
        if self.base_s is None or mean < self.base_s:
            if self.base_s is None or mean < self.base_s * (1 - self.headroom / 4):
                self._unrefreshed = 0  # a base found anew, not a window a shade shorter
            self.base_s = mean
        if self._settling:
            self._settling = False
            return "settle"
        if self._probe_from is not None:  # the probe's window measured: back to the limit
            self._set(self._probe_from)
            self._probe_from, self._cut_from = None, None
            return "probed"
        if self._unrefreshed >= self.probe_every and self.limit > self.floor:
            self._probe_from, self._unrefreshed = self.limit, 0
            self._set(self.limit // 2)
            return "probe"
        ratio = mean / self.base_s if self.base_s > 0 else 1.0
        cut_from, self._cut_from = self._cut_from, None
        if (
            cut_from is not None
            and ratio > 1 + self.queueing
            and mean >= cut_from[1] * (1 - self.headroom)
        ):
            self.base_s = mean  # no queue was cut: the rows take longer now
            self._set(cut_from[0])
            return "rebase"
        if ratio <= 1 + self.headroom:
            self._set(self.limit * 2 if self._slow_start else self.limit + max(1, self.limit // 4))
            return "grow"
        if ratio <= 1 + self.queueing:
            return "hold"
        self._slow_start = False
        needed = rate * self.base_s * (1 + self.headroom)
        self._cut_from = (self.limit, mean)
        self._set(max(self.limit // 2, round(needed)))
        return "cut"
