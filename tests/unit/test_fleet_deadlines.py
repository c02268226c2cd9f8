"""Every client call on the scheduler has a deadline, and only reads are retried (no Ray here).

A :class:`Fleet` made with :meth:`Fleet.over` gets a fake scheduler handle and a fake ``wait``
that records how long each call was given; a fake clock stands in for time. The end-to-end
checks (a frozen scheduler, ``jobs wait --timeout``) are in ``tests/ray/test_cluster_client.py``;
``call_with_deadline`` alone is tested in ``tests/unit/cluster/test_call_deadlines.py``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from clonefleet import Fleet
from clonefleet.cluster import NoAnswer
from clonefleet.config import Config
from clonefleet.errors import ClusterError, SchedulerUnavailable, UsageError

pytestmark = pytest.mark.timeout(20)


class Clock:
    """A clock whose sleeps move it at once (and are recorded)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class _Method:
    def __init__(self, name: str) -> None:
        self.name = name

    def remote(self, *args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return self.name, args, kwargs


class FakeScheduler:
    """``handle.method.remote(...)`` gives back ``(method, args, kwargs)`` as the "ref"."""

    def __getattr__(self, name: str) -> _Method:
        return _Method(name)


def _fleet(
    answer: Callable[[str, float], Any],
    clock: Clock | None = None,
    handle: Any = None,
    call_timeout_s: float = 30.0,
) -> tuple[Fleet, list[tuple[str, float]]]:
    """A Fleet over ``handle`` (a :class:`FakeScheduler` by default) whose calls go to
    ``answer(method, seconds_left)``; also the calls it got."""
    clock = clock or Clock()
    calls: list[tuple[str, float]] = []

    def wait(ref: tuple[str, Any, Any], left_s: float) -> Any:
        calls.append((ref[0], left_s))
        return answer(ref[0], left_s)

    fleet = Fleet.over(
        FakeScheduler() if handle is None else handle,
        config=Config(),
        wait=wait,
        clock=clock,
        sleep=clock.sleep,
        call_timeout_s=call_timeout_s,
        wait_margin_s=2.0,
    )
    return fleet, calls


@pytest.mark.parametrize(
    ("call", "deadline_s"),
    [
        (lambda f: f.job_status("sa_1"), 30.0),
        (lambda f: f.job_result("sa_1"), 30.0),
        (lambda f: f.list_jobs(status="running"), 30.0),
        (lambda f: f.expand(["b_1"]), 30.0),
        (lambda f: f.job_cancel("sa_1"), 30.0),
        (lambda f: f.cancel_many(["b_1"]), 30.0),
        (lambda f: f.spawn_nested({}, "sa_1"), 30.0),
        (lambda f: f.events("b_1"), 30.0),
        (lambda f: f.events("b_1", wait_s=3.0), 5.0),
        (lambda f: f.remaining(["b_1"]), 30.0),
        (lambda f: f.remaining(["b_1"], 4.0), 6.0),
        (lambda f: f.job_block(["b_1"], timeout_seconds=5), 7.0),
        (lambda f: f.job_block(["b_1"], wait_seconds=1, timeout_seconds=5), 3.0),
        (lambda f: f.job_block(["b_1"], timeout_seconds=0), 2.0),
        (lambda f: f.job_block(["b_1"]), 3602.0),
    ],
)
def test_every_call_gets_a_deadline_waits_get_their_wait_plus_the_margin(call, deadline_s):
    fleet, calls = _fleet(lambda method, left: {"ok": method})
    call(fleet)
    assert [left for _, left in calls] == [deadline_s]


def test_the_control_deadline_is_the_fleets_call_timeout():
    fleet, calls = _fleet(lambda method, left: [], call_timeout_s=4.5)
    fleet.expand(["b_1"])
    assert calls == [("expand", 4.5)]


def test_a_scheduler_that_does_not_answer_is_a_cluster_error_naming_the_deadline():
    def frozen(method: str, left: float) -> Any:
        raise NoAnswer

    fleet, calls = _fleet(frozen)
    with pytest.raises(ClusterError, match=r"did not answer within 7 s; it may be frozen") as err:
        fleet.job_block(["b_1"], timeout_seconds=5)
    assert not isinstance(err.value, SchedulerUnavailable)
    assert len(calls) == 1  # a timeout is not retried: the deadline is spent


def test_reads_are_retried_with_backoff_while_the_scheduler_restarts():
    clock = Clock()
    fails = iter([True, True, False])

    def restarting(method: str, left: float) -> Any:
        if next(fails):
            raise SchedulerUnavailable("ActorUnavailableError: restarting")
        return {"job_id": "sa_1"}

    fleet, calls = _fleet(restarting, clock)
    assert fleet.job_status("sa_1") == {"job_id": "sa_1"}
    assert clock.sleeps == [0.1, 0.2]
    assert [round(left, 3) for _, left in calls] == [30.0, 29.9, 29.7]


@pytest.mark.parametrize(
    "call",
    [
        lambda f: f.job_status("sa_1"),
        lambda f: f.job_result("sa_1"),
        lambda f: f.list_jobs(),
        lambda f: f.expand(["b_1"]),
        lambda f: f.events("b_1", wait_s=1.0),
        lambda f: f.remaining(["b_1"], 1.0),
        lambda f: f.job_block(["b_1"], timeout_seconds=1),
    ],
)
def test_each_read_is_retried(call):
    fails = iter([True, False])

    def once_unavailable(method: str, left: float) -> Any:
        if next(fails):
            raise SchedulerUnavailable("restarting")
        return {}

    fleet, calls = _fleet(once_unavailable)
    call(fleet)
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("call", "args_of"),
    [
        (lambda f: f.job_block(["b_1"], wait_seconds=9, timeout_seconds=5), lambda a, k: a[2]),
        (lambda f: f.remaining(["b_1"], 5.0), lambda a, k: a[1]),
        (lambda f: f.events("b_1", wait_s=5.0), lambda a, k: k["wait_s"]),
    ],
)
def test_a_wait_made_again_waits_only_for_the_rest(call, args_of):
    clock = Clock()
    sent: list[float] = []

    class Recording(FakeScheduler):
        def __getattr__(self, name: str) -> _Method:
            method = _Method(name)
            remote = method.remote

            def record(*args: Any, **kwargs: Any) -> Any:
                sent.append(args_of(args, kwargs))
                return remote(*args, **kwargs)

            method.remote = record  # type: ignore[method-assign]
            return method

    def restarting_then_answering(method: str, left: float) -> Any:
        if len(sent) == 1:
            clock.now += 1.5  # the scheduler died while this try waited
            raise SchedulerUnavailable("ActorUnavailableError")
        return {}

    fleet, _ = _fleet(restarting_then_answering, clock, Recording())
    call(fleet)
    assert [round(x, 3) for x in sent] == [5.0, 3.4]  # 5 s, less 1.5 s waited and 0.1 s paused


@pytest.mark.parametrize(
    "call",
    [
        lambda f: f.spawn_nested({"agent": "x"}, "sa_1"),
        lambda f: f.submit(SimpleNamespace(submission=object())),
        lambda f: f.job_cancel("sa_1"),
        lambda f: f.cancel_many(["b_1"]),
    ],
)
def test_calls_that_change_state_are_never_retried(call):
    def unavailable(method: str, left: float) -> Any:
        raise SchedulerUnavailable("restarting")

    fleet, calls = _fleet(unavailable)
    with pytest.raises(SchedulerUnavailable):
        call(fleet)
    assert len(calls) == 1


def test_retries_stop_at_the_deadline_with_a_retryable_error():
    clock = Clock()

    def unavailable(method: str, left: float) -> Any:
        raise SchedulerUnavailable("ActorUnavailableError: restarting")

    fleet, calls = _fleet(unavailable, clock, call_timeout_s=3.0)
    with pytest.raises(SchedulerUnavailable, match="retryable") as err:
        fleet.list_jobs()
    assert err.value.retryable and isinstance(err.value, ClusterError)
    assert clock.now - 100.0 <= 3.0
    assert clock.sleeps == [0.1, 0.2, 0.4, 0.8, 1.0]  # doubling, capped at a second
    assert len(calls) == 6


def test_an_unavailable_scheduler_error_pickles_and_says_it_is_retryable():
    error = SchedulerUnavailable("ActorUnavailableError: the actor is restarting")
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is SchedulerUnavailable and str(clone) == str(error)
    assert vars(clone) == vars(error) and clone.retryable
    assert "retryable" in str(error) and "restarting" in str(error)


def test_a_bad_call_timeout_is_refused_before_ray_starts(tmp_path):
    with pytest.raises(UsageError, match="call_timeout_s"):
        Fleet(call_timeout_s=0, cwd=tmp_path)
    with pytest.raises(UsageError, match="wait_margin_s"):
        Fleet(wait_margin_s=-1, cwd=tmp_path)
