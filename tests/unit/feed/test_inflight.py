"""The in-flight limiter against simulated fleets: a fleet runs ``slots`` rows at a time, each
for a service time, the rest wait their turn; the feeder keeps the limiter's number of rows in
flight and tells it when each row was submitted and when it ended."""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable

import pytest

from clonefleet.feed import InFlight

pytestmark = pytest.mark.timeout(30)

Slots = Callable[[float], float]
"""Time -> rows the fleet serves at once (``math.inf``: all of them)."""
Service = Callable[[float, int], float]
"""(time, rows in the fleet) -> seconds a row is served for."""


def simulate(
    limiter: InFlight,
    seconds: float,
    slots: Slots,
    service: Service,
    *,
    noise: float = 0.0,
    seed: int = 7,
) -> list[tuple[float, int]]:
    """Run the feeder's loop against the fleet for ``seconds``; returns ``(time, limit)`` at
    every end. Rows end in batches of a tenth of a second, as a feeder's polls see them."""
    rng = random.Random(seed)
    now = 0.0
    waiting: deque[float] = deque()  # submission times of rows waiting for a slot
    running: list[tuple[float, int, float]] = []  # (ends at, order, submitted at)
    order = itertools.count()
    trace: list[tuple[float, int]] = []

    def in_fleet() -> int:
        return len(waiting) + len(running)

    def start_waiting(t: float) -> None:
        while waiting and len(running) < slots(t):
            sent = waiting.popleft()
            took = service(t, in_fleet()) * (1 + rng.uniform(-noise, noise))
            heapq.heappush(running, (t + took, next(order), sent))

    def top_up(t: float) -> None:
        while in_fleet() < limiter.limit:
            waiting.append(t)
        start_waiting(t)

    top_up(now)
    poll = 0.1
    while now < seconds:
        now += poll
        spans = []
        while running and running[0][0] <= now:
            _, _, sent = heapq.heappop(running)
            spans.append((sent, now))
            start_waiting(now)
        if spans:
            limiter.ended(spans)
            trace.append((now, limiter.limit))
        top_up(now)
    return trace


def fixed(value: float) -> Callable[..., float]:
    return lambda *_: value


def limits_after(trace: list[tuple[float, int]], t: float) -> list[int]:
    return [n for at, n in trace if at >= t]


def share(limits: list[int], low: float, high: float) -> float:
    """The share of ``limits`` within ``low`` and ``high``."""
    return sum(low <= n <= high for n in limits) / len(limits)


def test_it_settles_a_little_above_a_fleet_that_serves_220_at_once():
    limiter = InFlight(1000)
    trace = simulate(limiter, 120, fixed(220), fixed(0.45), noise=0.3)
    late = limits_after(trace, 60)
    # Every slot busy (at least 220 in flight), few rows waiting, but while a probe measures
    # the base time again (one window at half now and then).
    assert share(late, 220, 1.5 * 220) >= 0.85, sorted(set(late))
    assert min(late) >= 110 and max(late) <= 1.5 * 220
    assert limiter.peak < 1000


def test_it_climbs_to_the_ceiling_when_nothing_waits():
    # A real provider with slow answers and room to spare: no row waits.
    limiter = InFlight(1000)
    trace = simulate(limiter, 1200, fixed(float("inf")), fixed(20.0), noise=0.5)
    late = limits_after(trace, 600)
    assert late[-1] == 1000
    assert share(late, 1000, 1000) >= 0.9  # but for the probes


def test_noisy_rows_keep_it_near_what_the_fleet_serves():
    limiter = InFlight(1000)
    trace = simulate(limiter, 150, fixed(200), fixed(0.4), noise=0.6)
    late = limits_after(trace, 60)
    assert share(late, 150, 1.5 * 200) >= 0.85, sorted(set(late))
    assert max(late) <= 400


def test_an_overloaded_fleet_keeps_it_near_the_knee():
    # Past 100 rows the fleet slows down: each row more lengthens every row's service, so even
    # the first 256 rows wait and the base time measured first says too much.
    def service(t: float, n: int) -> float:
        return 0.4 * max(1.0, n / 100)

    limiter = InFlight(1000)
    trace = simulate(limiter, 150, fixed(float("inf")), service, noise=0.3)
    late = limits_after(trace, 90)
    assert share(late, 50, 200) >= 0.85, sorted(set(late))
    assert limiter.peak <= 512  # a cut never raised it


def test_a_rate_limit_that_tightens_mid_run_brings_the_limit_down():
    limiter = InFlight(1000)
    trace = simulate(limiter, 180, lambda t: 400 if t < 60 else 100, fixed(0.5))
    assert max(limits_after(trace, 40)[:50]) >= 400
    late = limits_after(trace, 120)
    assert share(late, 100, 1.5 * 100) >= 0.85, sorted(set(late))


def test_heavier_rows_later_get_a_new_base_time():
    # Rows twice as slow from t=30 s on, the fleet never busy: taken for a queue at first (the
    # limit falls), then the old windows leave the base and it climbs back.
    limiter = InFlight(600)
    trace = simulate(limiter, 300, fixed(float("inf")), lambda t, n: 0.5 if t < 30 else 1.0)
    assert limiter.base_s == pytest.approx(1.0, rel=0.15)
    assert share(limits_after(trace, 200), 600, 600) >= 0.85


def test_a_fleet_busy_from_the_start_is_found_by_a_probe():
    # A provider that lets 20 rows through at a time: even the first 256 rows wait, so no
    # window shows the base time until a probe halves the limit.
    limiter = InFlight(1000)
    trace = simulate(limiter, 2000, fixed(20), fixed(1.0))
    assert "probe" in {h[-1] for h in limiter.history}
    assert limiter.base_s is not None and limiter.base_s < 2.5
    assert share(limits_after(trace, 1500), 32, 64) >= 0.8, sorted(set(limits_after(trace, 1500)))


@pytest.mark.parametrize(("ceiling", "start", "floor"), [(1, 128, 32), (20, 128, 32), (500, 4, 8)])
def test_the_limit_stays_within_floor_and_ceiling(ceiling, start, floor):
    limiter = InFlight(ceiling, start=start, floor=floor)
    trace = simulate(limiter, 60, fixed(50), fixed(0.2))
    assert all(min(floor, ceiling) <= n <= ceiling for _, n in trace)


def test_a_window_is_as_many_new_rows_as_the_limit_and_half_a_second():
    limiter = InFlight(1000, start=100, warmup=0)
    limiter.ended([(0.0, 0.1)] * 120)  # enough rows, too soon
    assert limiter.windows == 0
    limiter.ended([(0.2, 0.6)])
    assert limiter.windows == 1
    assert limiter.base_s == pytest.approx((120 * 0.1 + 0.4) / 121)
    assert limiter.limit == 200  # nothing waits: doubled
    limiter.ended([(0.5, 2.0)] * 500)  # submitted before the doubling: not in the window
    limiter.ended([(0.7, 2.0)] * 199)  # submitted after it, but fewer than the limit
    assert limiter.windows == 1
    limiter.ended([(0.7, 2.6)])
    assert limiter.windows == 2
    assert limiter.history[-1][2] == pytest.approx(700 / 0.6)  # every end counts for the rate


def test_each_verdict_in_turn():
    limiter = InFlight(1000, start=100, warmup=1, probe_every=5)
    clock = itertools.count(3, 3)

    def window(took: float, n: int) -> str:
        """``n`` rows that each took ``took``, ending over one second."""
        end = float(next(clock))
        early = [(end - 1 - took, end - 1)] * (n // 2)
        limiter.ended(early + [(end - took, end)] * (n - n // 2))
        return limiter.history[-1][-1]

    assert window(2.0, 100) == "warmup"  # hosts starting: not judged, nor a base time
    assert window(0.5, 100) == "warmup"  # a quarter of the time before: still warming up
    assert limiter.base_s is None and limiter.limit == 100
    assert window(0.5, 100) == "grow" and limiter.limit == 200  # doubled
    assert window(0.6, 200) == "hold" and limiter.limit == 200  # 1.2 times the base
    # Twice the base time: rows wait. 200 ends in a second need 100 rows at 0.5 s, plus 10%.
    assert window(1.0, 200) == "cut" and limiter.limit == 110
    assert window(0.5, 110) == "grow" and limiter.limit == 137  # no longer doubling: a quarter
    assert window(0.5, 137) == "probe" and limiter.limit == 68  # the fifth judged window
    assert window(0.4, 68) == "probed" and limiter.limit == 137  # and back
    assert limiter.base_s == pytest.approx(0.4)
    assert [h[1] for h in limiter.history] == [100, 100, 100, 200, 200, 110, 137, 68]


def test_a_cut_takes_a_quarter_at_least_and_half_at_most():
    limiter = InFlight(1000, start=400, warmup=0)

    def window(sent: float, took: float, n: int, seconds: float) -> None:
        """``n`` rows submitted at ``sent`` that took ``took``, ending over ``seconds``."""
        limiter.ended([(sent, sent + took - seconds)] + [(sent, sent + took)] * (n - 1))

    window(0.0, 0.5, 400, 0.5)  # the base, 0.5 s, at 800 a second: doubled
    assert limiter.limit == 800
    window(1.0, 10.0, 800, 200.0)  # 20 times the base at 4 a second: needs 2.2 rows
    assert limiter.limit == 400
    window(300.0, 1.0, 400, 1.0)  # twice the base at 400 a second: needs 220
    assert limiter.limit == pytest.approx(220, abs=1)
    # A base measured while rows waited: the rate needs more than the limit, yet a cut cuts.
    window(400.0, 1.0, 220, 0.5)
    assert limiter.history[-1][-1] == "cut" and limiter.limit == pytest.approx(165, abs=1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="ceiling"):
        InFlight(0)
    with pytest.raises(ValueError, match="headroom"):
        InFlight(10, headroom=0.5, queueing=0.5)
