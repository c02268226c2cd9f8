"""The in-flight limiter against simulated fleets: a rate of ends that is a function of the rows
in flight (rising until the fleet is busy, then flat, or falling when overloaded)."""

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
    holds (the CPUs, a rate limit or a cap are busy)."""
    return lambda n: min(n, knee) / row_s


def overloaded_past(knee: int, row_s: float) -> Curve:
    """A fleet that slows down past ``knee`` rows (each extra row costs a share of the rate)."""
    return lambda n: (min(n, knee) / row_s) * (1.0 if n <= knee else max(0.2, knee / n))


def drive(
    limiter: InFlight,
    clock: FakeClock,
    curve: Curve,
    seconds: float,
    *,
    tick_s: float = 0.05,
    noise: float = 0.0,
    seed: int = 7,
) -> list[int]:
    """Run the limiter against ``curve`` for ``seconds`` of fake time, the rows in flight kept
    at its limit; returns the limit at each tick."""
    rng = random.Random(seed)
    owed = 0.0
    limits = []
    for _ in range(int(seconds / tick_s)):
        clock.advance(tick_s)
        rate = curve(limiter.limit) * (1 + rng.uniform(-noise, noise))
        owed += rate * tick_s
        if (whole := int(owed)) > 0:
            owed -= whole
            limiter.ended(whole)
        limits.append(limiter.limit)
    return limits


def make(ceiling: int = 1000, start: int = 128, floor: int = 32) -> tuple[InFlight, FakeClock]:
    clock = FakeClock()
    return InFlight(ceiling, start=start, floor=floor, clock=clock), clock


def test_it_settles_near_the_knee_of_a_fleet_that_gets_busy():
    limiter, clock = make()
    limits = drive(limiter, clock, busy_at(knee=150, row_s=0.4), 120)
    late = limits[len(limits) // 2 :]
    # The rate is all there (at least the knee) with far fewer rows than the ceiling.
    assert min(late) >= 96, min(late)
    assert max(late) <= 400, max(late)
    assert limiter.phase in {"hold", "probe-down", "probe-up"}


def test_it_climbs_to_the_ceiling_when_more_rows_always_end_sooner():
    # A real provider with slow answers and no rate limit: every row more is more rate.
    limiter, clock = make(ceiling=1000)
    limits = drive(limiter, clock, busy_at(knee=10**9, row_s=8.0), 1200, tick_s=0.25)
    assert limiter.peak == 1000
    # Probes below the ceiling fail and grow rarer: most of the time it runs at the ceiling.
    late = limits[len(limits) // 2 :]
    assert sum(n == 1000 for n in late) / len(late) >= 0.75


def test_it_comes_down_from_an_overload():
    limiter, clock = make(ceiling=1000, start=800)
    limits = drive(limiter, clock, overloaded_past(knee=100, row_s=0.4), 200)
    assert limits[-1] <= 300, limits[-1]
    assert min(limits[len(limits) // 2 :]) >= 32


def test_noise_does_not_ratchet_it_down_far_below_the_knee():
    limiter, clock = make()
    limits = drive(limiter, clock, busy_at(knee=200, row_s=0.4), 300, noise=0.08)
    late = limits[len(limits) // 3 :]
    assert sum(late) / len(late) >= 120, sum(late) / len(late)
    assert max(late) <= 800


@pytest.mark.parametrize(("ceiling", "start", "floor"), [(1, 128, 32), (20, 128, 32), (500, 4, 8)])
def test_the_limit_stays_within_floor_and_ceiling(ceiling, start, floor):
    limiter, clock = make(ceiling=ceiling, start=start, floor=floor)
    limits = drive(limiter, clock, busy_at(knee=50, row_s=0.2), 60)
    low = min(floor, ceiling)
    assert all(low <= n <= ceiling for n in limits)
    assert limiter.limit >= 1


def test_a_window_lasts_as_many_ends_as_the_limit_and_half_a_second():
    clock = FakeClock()
    limiter = InFlight(1000, start=100, warmup=1, clock=clock)
    limiter.ended(1)  # starts the first window
    clock.advance(0.1)
    limiter.ended(200)  # enough ends, too soon
    assert limiter.windows == 0
    clock.advance(0.5)
    limiter.ended(1)
    assert limiter.windows == 1
    assert limiter.limit == 200  # the warm-up over: the first doubling
    clock.advance(10)
    limiter.ended(150)  # fewer ends than the limit: the window goes on
    assert limiter.windows == 1


def test_the_window_after_a_change_is_not_judged():
    clock = FakeClock()
    limiter = InFlight(1000, start=100, warmup=1, clock=clock)
    limiter.ended(0)
    clock.advance(1)
    limiter.ended(100)  # warm-up window: 100/s, then doubled to 200
    assert limiter.limit == 200
    clock.advance(1)
    limiter.ended(200)  # the settling window: not judged, however fast
    assert limiter.limit == 200
    clock.advance(1)
    limiter.ended(200)  # judged: 200/s beat 100/s by more than 10%: doubled again
    assert limiter.limit == 400
    clock.advance(1)
    limiter.ended(400)  # settling
    clock.advance(4)
    limiter.ended(400)  # judged: 100/s, no better than 200/s: back to 200 and held
    assert limiter.limit == 200
    assert limiter.phase == "hold"


def test_bad_arguments():
    with pytest.raises(ValueError, match="ceiling"):
        InFlight(0)
