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


class _ClientSession:
    """Stands for a connected ``ray://`` session: all ``client_step`` reads of it."""

    def __init__(self, endpoint: str) -> None:
        self.client_endpoint = endpoint


@pytest.fixture
def through_client(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make this process look connected through Ray Client to ``HOST:PORT``, probing fast."""
    from clonefleet.cluster import _calls, _connect

    monkeypatch.setattr(_connect, "CLIENT_PROBE_S", 0.05)
    monkeypatch.setattr(_calls, "CLIENT_QUIET_S", 0.05)
    monkeypatch.setattr(_calls, "CLIENT_SLACK_S", 0.05)
    monkeypatch.setattr(_calls, "CLIENT_PATIENCE_S", 0.3)

    def connect(endpoint: str) -> None:
        monkeypatch.setattr(_connect, "_current", [_ClientSession(endpoint)])

    return connect


def test_a_client_step_cut_off_from_the_head_ends_saying_so(through_client):
    """A step that hangs on the network (Ray Client fetching a handle's methods, say) ends
    soon after its time once the head's port stops answering; while it answers, the step
    is waited for, then given up with NoAnswer; a step that ends is handed on as it is."""
    import socket
    import threading

    from clonefleet.cluster import NoAnswer, _connect, client_step, client_steps_left_behind
    from clonefleet.errors import ClusterError

    released = threading.Event()
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    through_client(f"127.0.0.1:{port}")
    try:
        assert client_step(lambda: "answer", 1.0) == "answer"
        with pytest.raises(KeyError):
            client_step(lambda: {}["missing"], 1.0)
        with pytest.raises(NoAnswer):  # the port answers: patience, then no answer
            client_step(lambda: released.wait(10), 0.05)
        listening.close()  # cut off
        with pytest.raises(ClusterError) as failed:
            client_step(lambda: released.wait(10), 0.05)
        # The step given up on still runs: a command then ends its process at once.
        assert client_steps_left_behind()
    finally:
        released.set()
        listening.close()
    assert f"ray://127.0.0.1:{port} cannot be reached from here" in str(failed.value)
    for thread in _connect._left_behind:
        thread.join(5)
    assert not client_steps_left_behind()


def test_without_ray_client_a_step_runs_on_the_callers_thread():
    import threading

    from clonefleet.cluster import client_step

    assert client_step(threading.current_thread, 0.01) is threading.current_thread()
