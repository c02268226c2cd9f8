"""How many rows a feeder keeps running: the fewest that keep the rate of ends at its highest.

Rows in flight cost what a rate does not show: each holds a provider slot, a clone's memory and
a request that a killed run loses. Past the point where the fleet (its CPUs, the provider's rate
limit, a concurrency cap) is busy, more rows only wait longer, so :class:`InFlight` probes for
that point instead of keeping a fixed number in flight (docs/inputs.md, "Rows in flight"):

- it starts at ``start`` and doubles while each doubling raises the rate of ends by more than
  ``gain`` (a share);
- once a doubling does not, it goes back to the limit before it and holds there, probing now
  and then: a quarter fewer rows, kept when the rate holds within ``gain`` of the limit's own
  (measured just before; when it rises by more, as out of an overload, a quarter fewer again at
  once), and a quarter more, kept (and doubling again) when the rate rises by more than
  ``gain``. Each probe that fails doubles the windows held before the next one (up to
  ``MAX_HOLD_WINDOWS``), so a limit that is right costs few probes.

A rate is measured over a *window*: from one change of the limit, as many ends as the limit
(every slot turned over once, whatever a row takes: a fraction of a second against a fast
simulated model, minutes against a real one) and at least ``min_window_s``. The window just
after a change is not judged (the rows of the old limit are still ending), nor are the first
``warmup`` windows (hosts starting, prompt caches filling).

Pure: no Ray, no threads; the feeder calls :meth:`InFlight.ended` as rows end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum
from typing import Protocol

__all__ = ["InFlight", "Limiter"]

MAX_HOLD_WINDOWS = 16
"""The most windows held between two probes (after probes that failed)."""


class Limiter(Protocol):
    """What a feeder asks of a limit on rows in flight (:class:`InFlight` is one)."""

    limit: int
    """The most rows to keep submitted and not ended now."""

    def ended(self, n: int = 1) -> None:
        """Note ``n`` rows that ended."""
        ...


class _Phase(Enum):
    WARMUP = "warmup"
    GROW = "grow"
    HOLD = "hold"
    PROBE_DOWN = "probe-down"
    PROBE_UP = "probe-up"


class InFlight:
    """The limit on rows submitted and not ended, adjusted from the rate at which they end.

    Args:
        ceiling: the most rows ever in flight (the feeder's ``ahead``).
        start: the first limit (at most ``ceiling``).
        floor: the fewest rows the limit goes down to (at most ``ceiling``).
        gain: the share by which a rate must rise to count as higher (and may fall while
            counting as holding).
        min_window_s: the shortest window a rate is measured over.
        warmup: windows at the start whose rates are not judged.
        hold_windows: windows measured at a held limit between two probes.
        clock: monotonic seconds (injected in tests).
    """

    def __init__(
        self,
        ceiling: int,
        *,
        start: int = 128,
        floor: int = 32,
        gain: float = 0.1,
        min_window_s: float = 0.5,
        warmup: int = 2,
        hold_windows: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ceiling < 1:
            raise ValueError(f"ceiling must be 1 or more, got {ceiling}")
        self.ceiling = ceiling
        self.floor = max(1, min(floor, ceiling))
        self.limit = max(self.floor, min(start, ceiling))
        self.gain, self.min_window_s = gain, min_window_s
        self.hold_windows = max(1, hold_windows)
        self._clock = clock
        self._phase = _Phase.WARMUP if warmup > 0 else _Phase.GROW
        self._warmup_left = warmup
        self._window_start: float | None = None
        self._window_ends = 0
        self._settling = False
        """Whether the window under way follows a change of the limit (not judged)."""
        self._held = self.limit
        """The limit last held (where a probe goes back to)."""
        self._held_rate = 0.0
        """The rate measured at :attr:`_held` (what a probe or a doubling is judged against)."""
        self._since_probe = 0
        self._hold_for = self.hold_windows
        """Windows to hold before the next probe (doubled by each probe that fails)."""
        self._next_probe = _Phase.PROBE_DOWN
        self.windows = 0
        """Windows measured so far."""
        self.peak = self.limit
        """The highest limit so far."""

    @property
    def phase(self) -> str:
        """What the limiter is doing: ``warmup``, ``grow``, ``hold``, ``probe-down`` or
        ``probe-up``."""
        return self._phase.value

    def ended(self, n: int = 1) -> None:
        """Note ``n`` rows that ended (the first call starts the first window)."""
        now = self._clock()
        if self._window_start is None:
            self._window_start = now
        self._window_ends += n
        elapsed = now - self._window_start
        if self._window_ends < self.limit or elapsed < self.min_window_s:
            return
        rate = self._window_ends / elapsed if elapsed > 0 else float("inf")
        self.windows += 1
        self._window_start, self._window_ends = now, 0
        if self._settling:
            self._settling = False
            return
        self._judge(rate)
        self.peak = max(self.peak, self.limit)

    def _set(self, limit: int) -> None:
        limit = max(self.floor, min(self.ceiling, limit))
        self._settling = self._settling or limit != self.limit
        self.limit = limit

    def _hold(self, limit: int, rate: float, *, failed: bool = False) -> None:
        self._phase = _Phase.HOLD
        self._held, self._held_rate = limit, rate
        self._set(limit)
        self._since_probe = 0
        if failed:
            self._hold_for = min(MAX_HOLD_WINDOWS, self._hold_for * 2)
        else:
            self._hold_for = self.hold_windows

    def _judge(self, rate: float) -> None:
        """Move the limit on from the rate of the window just measured at it."""
        rose = rate > self._held_rate * (1 + self.gain)
        held_up = rate >= self._held_rate * (1 - self.gain)
        match self._phase:
            case _Phase.WARMUP:
                self._warmup_left -= 1
                self._held, self._held_rate = self.limit, rate
                if self._warmup_left <= 0:
                    self._phase = _Phase.GROW
                    self._set(self.limit * 2)
            case _Phase.GROW:
                if rose and self.limit < self.ceiling:
                    self._held, self._held_rate = self.limit, rate
                    self._set(self.limit * 2)
                elif rose:  # at the ceiling: nothing more to try
                    self._hold(self.limit, rate)
                else:  # the doubling bought nothing: back to the limit before it
                    self._hold(self._held, self._held_rate)
            case _Phase.HOLD:
                self._held_rate = rate  # the held limit's rate now, to judge the next probe by
                self._since_probe += 1
                if self._since_probe >= self._hold_for:
                    self._probe()
            case _Phase.PROBE_DOWN:
                if rose:  # faster with fewer rows (an overload): fewer again at once
                    self._hold(self.limit, rate)
                    self._next_probe = _Phase.PROBE_DOWN
                    self._probe()
                elif held_up:  # as fast with fewer rows: keep the fewer
                    self._hold(self.limit, rate)
                    self._next_probe = _Phase.PROBE_DOWN
                else:
                    self._hold(self._held, self._held_rate, failed=True)
                    self._next_probe = _Phase.PROBE_UP
            case _Phase.PROBE_UP:
                if rose:  # more rows ran faster: grow again from here
                    self._held, self._held_rate = self.limit, rate
                    self._phase = _Phase.GROW
                    self._hold_for = self.hold_windows
                    self._set(self.limit * 2)
                else:
                    self._hold(self._held, self._held_rate, failed=True)
                    self._next_probe = _Phase.PROBE_DOWN

    def _probe(self) -> None:
        """Try a quarter fewer rows or a quarter more (taking turns; one that cannot move
        gives way to the other)."""
        down = max(self.floor, (self.limit * 3) // 4)
        up = min(self.ceiling, self.limit + max(1, self.limit // 4))
        phase = self._next_probe
        if phase is _Phase.PROBE_DOWN and down == self.limit:
            phase = _Phase.PROBE_UP
        if phase is _Phase.PROBE_UP and up == self.limit:
            phase = _Phase.PROBE_DOWN if down != self.limit else _Phase.HOLD
        if phase is _Phase.HOLD:
            self._since_probe = 0
            return
        self._phase = phase
        self._set(down if phase is _Phase.PROBE_DOWN else up)
