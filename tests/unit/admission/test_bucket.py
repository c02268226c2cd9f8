"""RateBucket and Meter: the refilling bucket of capacity and the one-minute rate meter."""

from __future__ import annotations

import pytest

from clonefleet.admission import Meter, RateBucket

pytestmark = pytest.mark.timeout(30)


def test_a_bucket_refills_at_its_rate_up_to_its_capacity() -> None:
    bucket = RateBucket(per_s=2.0, capacity=5.0, level=0.0, at=10.0)
    bucket.refill(11.0)
    assert bucket.level == pytest.approx(2.0)
    bucket.refill(10.5)  # a clock that steps back adds nothing
    assert bucket.level == pytest.approx(2.0) and bucket.at == 11.0
    bucket.refill(100.0)
    assert bucket.level == 5.0


def test_wait_is_the_time_until_a_cost_fits_and_a_large_cost_fits_when_full() -> None:
    bucket = RateBucket(per_s=2.0, capacity=5.0, level=1.0, at=0.0)
    assert bucket.wait_s(1.0) == 0.0
    assert bucket.wait_s(3.0) == pytest.approx(1.0)
    assert bucket.wait_s(50.0) == pytest.approx(2.0)  # capped at the capacity: 4 to go
    bucket.level = -4.0  # a debt is paid back first
    assert bucket.wait_s(1.0) == pytest.approx(2.5)


def test_reshape_keeps_the_level_within_the_new_size() -> None:
    bucket = RateBucket(per_s=2.0, capacity=5.0, level=5.0, at=0.0)
    bucket.reshape(1.0, 3.0)
    assert (bucket.per_s, bucket.capacity, bucket.level) == (1.0, 3.0, 3.0)
    bucket.reshape(4.0, 10.0)
    assert bucket.level == 3.0


def test_a_meter_counts_the_last_minute() -> None:
    meter = Meter()
    meter.add(100.2, 3)
    meter.add(130.0, 4)
    assert meter.total(130.5) == 7
    assert meter.total(159.9) == 7
    assert meter.total(160.5) == 4  # second 100 is more than a minute old
    assert meter.total(500.0) == 0
    meter.add(500.0, 1)
    assert meter.total(500.0) == 1


def test_a_meter_measures_a_recent_rate_per_minute() -> None:
    meter = Meter()
    for second in range(100, 110):
        meter.add(second + 0.5, 10)  # 10 a second: 600 a minute
    assert meter.recent_per_minute(109.5, 5) == pytest.approx(60 * 60 / 5.5)
    assert meter.recent_per_minute(109.0, 2) == pytest.approx(30 * 60 / 2.05)
