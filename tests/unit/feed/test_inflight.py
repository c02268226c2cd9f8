"""The in-flight limiter against simulated fleets: with ``n`` rows in flight a fleet ends rows
at some rate, each having taken ``n / rate`` seconds (Little's law), so rows that wait take
longer than rows that do not."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from clonefleet.feed import InFlight
from clonefleet.testing import FakeClock

pytestmark = pytest.mark.timeout(30)

Curve = Callable[[int], float]
"""Rows in flight -> rows ended per second."""


def busy_at(knee: int, row_s: float) -> Curve:
    """A fleet whose rows take ``row_s`` each until ``knee`` run at once; past that the rate
    holds (the CPUs, a rate limit or a cap are busy) and rows wait."""
    return lambda n: min(n, knee) / row_s


def overloaded_past(knee: int, row_s: float) -> Curve:
    """A fleet that slows down past ``knee`` rows (each extra row costs a share of the rate)."""
    return lambda n: (min(n, knee) / row_s) * (1.0 if n <= knee else max(0.2, knee / n))


def drive(
    limiter: InFlight,
    clock: FakeClock,
    curve: Curve | Callable[[int, float], float],
    seconds: float,
    *,
    tick_s: float = 0.05,
    noise: float = 0.0,
    seed: int = 7,
    timed: bool = False,
) -> list[int]:
    """Run the limiter against ``curve`` for ``seconds`` of fake time, the rows in flight kept
    at its limit (``timed``: the curve also takes the time); returns the limit at each tick."""
    rng = random.Random(seed)
    owed = 0.0
    limits = []
    for step in range(int(seconds / tick_s)):
        clock.advance(tick_s)
        n = limiter.limit
        rate = curve(n, step * tick_s) if timed else curve(n)  # type: ignore[call-arg]
        owed += rate * tick_s
        if (whole := int(owed)) > 0:
            owed -= whole
            took = n / rate
            limiter.ended([took * (1 + rng.uniform(-noise, noise)) for _ in range(whole)])
        limits.append(limiter.limit)
    return limits


def make(ceiling: int = 1000, start: int = 128, floor: int = 32) -> tuple[InFlight, FakeClock]:
    clock = FakeClock()
    return InFlight(ceiling, start=start, floor=floor, clock=clock), clock


def late(limits: list[int]) -> list[int]:
    return limits[len(limits) // 2 :]


def share(limits: list[int], low: float, high: float) -> float:
    """The share of the ticks whose limit is within ``low`` and ``high``."""
    return sum(low <= n <= high for n in limits) / len(limits)


def test_it_settles_a_little_above_the_knee_of_a_fleet_that_gets_busy():
    limiter, clock = make()
    limits = drive(limiter, clock, busy_at(knee=220, row_s=0.45), 120)
    # Every row the fleet can serve (at least the knee), and not far over it, but while a
    # probe measures the base time again (a window at half now and then).
    assert share(late(limits), 220, 1.6 * 220) >= 0.85
    assert min(late(limits)) >= 110 and max(late(limits)) <= 1.6 * 220
    assert limiter.peak < 1000


def test_it_climbs_to_the_ceiling_when_nothing_waits():
    # A real provider with slow answers and room to spare: no row waits.
    limiter, clock = make(ceiling=1000)
    limits = drive(limiter, clock, busy_at(knee=10**9, row_s=8.0), 600, tick_s=0.25)
    assert limits[-1] == 1000
    assert share(late(limits), 1000, 1000) >= 0.9  # but for the probes


def test_an_overloaded_fleet_keeps_it_within_a_few_times_the_knee():
    limiter, clock = make(ceiling=1000)
    limits = drive(limiter, clock, overloaded_past(knee=100, row_s=0.4), 120)
    assert share(late(limits), 64, 260) >= 0.85
    assert min(late(limits)) >= 32 and max(late(limits)) <= 260


def test_noisy_times_keep_it_near_the_knee():
    limiter, clock = make()
    limits = drive(limiter, clock, busy_at(knee=200, row_s=0.4), 120, noise=0.3)
    assert share(late(limits), 150, 400) >= 0.85
    assert max(late(limits)) <= 400


def test_a_cap_that_tightens_mid_run_brings_the_limit_down():
    # A provider's rate limit lowered half way: the knee falls from 400 to 100 rows.
    def curve(n: int, t: float) -> float:
        return min(n, 400 if t < 60 else 100) / 0.5

    limiter, clock = make()
    limits = drive(limiter, clock, curve, 120, timed=True)
    assert max(limits[: int(55 / 0.05)][-100:]) >= 400
    assert max(limits[-200:]) <= 1.6 * 100, limits[-200:]


def test_heavier_rows_later_are_not_taken_for_a_queue():
    # Rows twice as slow from t=30 s on, the fleet never busy: a cut finds no queue.
    def curve(n: int, t: float) -> float:
        return n / (0.5 if t < 30 else 1.0)

    limiter, clock = make(ceiling=600)
    limits = drive(limiter, clock, curve, 100, timed=True)
    verdicts = [h[-1] for h in limiter.history]
    assert "rebase" in verdicts
    assert limiter.base_s == pytest.approx(1.0)
    assert sum(n == 600 for n in late(limits)) / len(late(limits)) >= 0.9


def test_a_fleet_busy_from_the_start_is_found_by_a_probe():
    # A provider that lets 20 rows through at a time: even the first 128 rows wait, so no
    # window shows the base time until a probe halves the limit.
    limiter, clock = make(ceiling=1000)
    limits = drive(limiter, clock, busy_at(knee=20, row_s=1.0), 900, tick_s=0.1)
    assert "probe" in {h[-1] for h in limiter.history}
    assert limiter.base_s is not None and limiter.base_s < 2.5
    assert share(late(limits), 32, 64) >= 0.8


@pytest.mark.parametrize(("ceiling", "start", "floor"), [(1, 128, 32), (20, 128, 32), (500, 4, 8)])
def test_the_limit_stays_within_floor_and_ceiling(ceiling, start, floor):
    limiter, clock = make(ceiling=ceiling, start=start, floor=floor)
    limits = drive(limiter, clock, busy_at(knee=50, row_s=0.2), 60)
    assert all(min(floor, ceiling) <= n <= ceiling for n in limits)


def test_a_window_is_as_many_ends_as_the_limit_and_half_a_second():
    clock = FakeClock()
    limiter = InFlight(1000, start=100, warmup=0, clock=clock)
    limiter.ended([])  # starts the first window
    clock.advance(0.1)
    limiter.ended([0.4] * 120)  # enough ends, too soon
    assert limiter.windows == 0
    clock.advance(0.5)
    limiter.ended([0.4])
    assert limiter.windows == 1
    assert limiter.base_s == 0.4
    assert limiter.limit == 200  # nothing waits: doubled
    clock.advance(10)
    limiter.ended([0.4] * 199)  # fewer ends than the limit: the window goes on
    assert limiter.windows == 1


def test_each_verdict_in_turn():
    clock = FakeClock()
    limiter = InFlight(1000, start=100, warmup=1, clock=clock)

    def window(took: float, n: int, seconds: float = 1.0) -> str:
        clock.advance(seconds)
        limiter.ended([took] * n)
        return limiter.history[-1][-1]

    limiter.ended([])
    assert window(2.0, 100) == "warmup"  # hosts starting: not judged, nor a base time
    assert window(0.5, 100) == "warmup"  # a quarter of the time before: still warming up
    assert limiter.base_s is None and limiter.limit == 100
    assert window(0.5, 100) == "grow" and limiter.limit == 200  # doubled
    assert window(0.5, 200) == "settle" and limiter.limit == 200
    assert window(0.65, 200) == "hold" and limiter.limit == 200  # 1.3 times the base
    # Twice the base time: rows wait. 200 a second at 0.5 s needs 100 rows, plus 10%.
    assert window(1.0, 200) == "cut" and limiter.limit == 110
    assert window(0.5, 110) == "settle"
    assert window(0.5, 110) == "grow" and limiter.limit == 137  # no longer doubling: a quarter
    assert [h[1] for h in limiter.history] == [100, 100, 100, 200, 200, 200, 110, 110]


def test_a_cut_at_most_halves_the_limit():
    clock = FakeClock()
    limiter = InFlight(1000, start=400, warmup=0, clock=clock)
    limiter.ended([])
    clock.advance(1)
    limiter.ended([0.5] * 400)  # the base
    clock.advance(1)
    limiter.ended([0.5] * 800)  # settling after the doubling to 800
    clock.advance(200)
    limiter.ended([5.0] * 800)  # ten times the base at 4 a second: needs 2.2 rows
    assert limiter.limit == 400


def test_a_cut_that_finds_no_queue_makes_that_time_the_base():
    clock = FakeClock()
    limiter = InFlight(1000, start=100, warmup=0, clock=clock)
    limiter.ended([])
    for took, n in [(0.5, 100), (0.5, 200), (0.5, 200)]:  # the base, settle, then doubled
        clock.advance(1)
        limiter.ended([took] * n)
    assert limiter.limit == 400
    clock.advance(1)
    limiter.ended([0.5] * 400)  # settling
    clock.advance(2)
    limiter.ended([1.0] * 400)  # rows twice as heavy: cut (200 a second x 0.5 s x 1.1)
    assert limiter.history[-1][-1] == "cut" and limiter.limit == 200
    clock.advance(2)
    limiter.ended([1.0] * 200)  # settling
    clock.advance(2)
    limiter.ended([1.0] * 200)  # as slow with half the rows: no queue was cut
    assert limiter.history[-1][-1] == "rebase"
    assert limiter.limit == 400 and limiter.base_s == 1.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="ceiling"):
        InFlight(0)
    with pytest.raises(ValueError, match="headroom"):
        InFlight(10, headroom=0.5, queueing=0.5)
