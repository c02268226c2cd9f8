"""``call_with_deadline`` gives each try what is left of one deadline; ``positive_seconds``
refuses a deadline that is not a positive number (no Ray here).

How a :class:`~clonefleet.Fleet` uses them, call by call, is in
``tests/unit/test_fleet_deadlines.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clonefleet.cluster import call_with_deadline, positive_seconds
from clonefleet.errors import SchedulerUnavailable, UsageError

pytestmark = pytest.mark.timeout(20)


def test_call_with_deadline_gives_each_try_what_is_left():
    now = [100.0]
    seen: list[float] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def attempt(seconds_left: Callable[[], float]) -> str:
        now[0] += 0.1  # sending the call took time: it counts
        seen.append(seconds_left())
        now[0] += 0.5  # the try itself took time
        if len(seen) < 3:
            raise SchedulerUnavailable()
        return "answer"

    out = call_with_deadline(attempt, 10.0, idempotent=True, clock=lambda: now[0], sleep=sleep)
    assert out == "answer"
    assert [round(left, 6) for left in seen] == [9.9, 9.2, 8.4]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_call_timeout_must_be_a_positive_number_of_seconds(bad):
    with pytest.raises(UsageError, match="call_timeout_s"):
        positive_seconds(bad, "call_timeout_s")
