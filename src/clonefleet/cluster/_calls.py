"""Calls on the scheduler actor from a client: connecting, deadlines, retries, Ray's errors.

Every call gets a deadline; a call that only reads is made again, with short backoff, while
Ray restarts the scheduler. Ray's errors are turned into ours here (the :class:`~clonefleet.Fleet`
facade never sees them). What the scheduler does with a call is not this module's business.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from clonefleet.cluster._connect import (
    SCHEDULER_NAME,
    ClusterConfig,
    ClusterSession,
    StillRunning,
    cluster_unreachable,
    current_client_endpoint,
    named_actor_exists,
    through_client,
    while_reachable,
)
from clonefleet.cluster._runtime import remote_runtime_env
from clonefleet.errors import ClonefleetError, ClusterError, SchedulerUnavailable, UsageError

__all__ = [
    "CALL_TIMEOUT_S",
    "START_TIMEOUT_S",
    "WAIT_MARGIN_S",
    "NoAnswer",
    "call_with_deadline",
    "client_step",
    "connecting_step",
    "connect_client",
    "positive_seconds",
    "ray_wait",
]

T = TypeVar("T")

CALL_TIMEOUT_S = 30.0
"""Default deadline of a control call (status, listing, cancel, submit) on the scheduler."""
WAIT_MARGIN_S = 2.0
"""Added to a waiting call's own wait (``job_block``, ``remaining``, ``events(wait_s=...)``)."""
START_TIMEOUT_S = 120.0
"""Deadline of the first answer of a scheduler the client creates (its worker has to start)."""
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 1.0
"""Pause between tries of a read while the scheduler restarts: doubling from the first to the
most."""


class NoAnswer(Exception):  # noqa: N818 - a signal between ray_wait and call_with_deadline
    """The scheduler did not answer in the time one try had (raised by a ``wait`` such as
    :func:`ray_wait`, turned into :class:`ClusterError` by :func:`call_with_deadline`)."""


def call_with_deadline(
    attempt: Callable[[Callable[[], float]], Any],
    timeout_s: float,
    *,
    idempotent: bool,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """Run ``attempt(seconds_left)`` until it answers or ``timeout_s`` has passed.

    ``seconds_left()`` says how much of the deadline is left at the moment it is called (after
    the call was sent, so sending does not count twice). ``attempt`` raises :class:`NoAnswer`
    when its time ran out and
    :class:`SchedulerUnavailable` while the scheduler restarts: an ``idempotent`` call then
    tries again after a short, doubling pause as long as the deadline allows; any other call
    raises it at once.

    Raises:
        ClusterError: no answer within ``timeout_s``.
        SchedulerUnavailable: still unavailable at the deadline (or the call not ``idempotent``).
    """
    deadline = clock() + timeout_s
    pause = RETRY_FIRST_S
    while True:
        try:
            return attempt(lambda: max(deadline - clock(), 0.0))
        except NoAnswer:
            raise ClusterError(
                f"the scheduler did not answer within {round(timeout_s, 1):g} s; it may be "
                "frozen or overloaded (`clonefleet cluster status` shows the cluster)"
            ) from None
        except SchedulerUnavailable:
            if not idempotent or clock() + pause >= deadline:
                raise
        sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)


def ray_wait(ref: Any, timeout_s: float) -> Any:
    """``ray.get`` of one scheduler call for at most ``timeout_s``: our errors unwrapped, Ray's
    turned into ours.

    Raises:
        NoAnswer: no answer in time.
        SchedulerUnavailable: the call was lost while Ray restarts the scheduler.
        ClusterError: the scheduler or the whole cluster is gone, or Ray failed the call.
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        if through_client():
            return _client_get(ref, timeout_s)
        return ray.get(ref, timeout=timeout_s)
    except GetTimeoutError:
        _unless_cluster_gone()
        raise NoAnswer from None
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ClonefleetError):
            raise cause from None
        raise ClusterError(task_error_text(exc, cause)) from None
    except RayActorError as exc:
        _unless_cluster_gone()
        text = _ANSI.sub("", str(exc)).strip()
        detail = text.splitlines()[0][:200] if text else ""
        if _still_registered():
            # Ray keeps the name of an actor it is restarting; calls in flight were lost.
            raise SchedulerUnavailable(f"{type(exc).__name__}: {detail}") from None
        raise ClusterError(
            f"the scheduler actor is gone ({type(exc).__name__}: {detail}); the next Fleet or "
            "`clonefleet run --detach` starts a new one"
        ) from None


CLIENT_QUIET_S = 5.0
"""How long a step through Ray Client runs before the head's port is tried (then every
:data:`~clonefleet.cluster._connect.CLIENT_PROBE_S`): cut off, a ``ray.get`` would hang until
gRPC gives up (about 2 minutes), whatever its own timeout."""
CLIENT_SLACK_S = 3.0
"""How long past its own timeout a step through Ray Client may take (a ``ray.get`` through
Ray Client answers a little after its timeout)."""
CLIENT_PATIENCE_S = 30.0
"""How much longer it is waited for while the head's port still answers."""


def _client_get(ref: Any, timeout_s: float) -> Any:
    """``ray.get(ref, timeout=timeout_s)`` through Ray Client, kept to its deadline when the
    network to the head is cut (:func:`client_step`)."""
    import ray

    return client_step(lambda: ray.get(ref, timeout=timeout_s), timeout_s)


def client_step(step: Callable[[], T], timeout_s: float) -> T:
    """``step()``, a part of a call that may wait on the network through Ray Client (sending a
    call on an actor handle whose methods Ray Client has not fetched yet, looking an actor up,
    a ``ray.get``); simply run when this process is not connected through Ray Client.

    Through Ray Client it runs on a thread of its own; once it has run
    :data:`CLIENT_QUIET_S` (or ``timeout_s``, when shorter), the head's port is tried every
    2 s, and a port that does not answer ends the call with :class:`ClusterError` (the thread
    is left to Ray). A step still running :data:`CLIENT_SLACK_S` plus
    :data:`CLIENT_PATIENCE_S` past ``timeout_s``, the port answering, is given up.

    Raises:
        ClusterError: the head cannot be reached.
        NoAnswer: still no answer that long after ``timeout_s``, the port answering.
    """
    endpoint = current_client_endpoint()
    if endpoint is None:
        return step()
    try:
        return while_reachable(
            step,
            endpoint,
            quiet_s=min(timeout_s, CLIENT_QUIET_S),
            give_up_s=timeout_s + CLIENT_SLACK_S + CLIENT_PATIENCE_S,
        )
    except StillRunning:
        raise NoAnswer from None


def connecting_step(step: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
    """:func:`client_step` for a part of connecting (looking the scheduler up, creating it):
    no answer in time is a :class:`ClusterError` saying so.

    Raises:
        ClusterError: the head cannot be reached, or did not answer within ``timeout_s``.
    """
    try:
        return client_step(step, timeout_s)
    except NoAnswer:
        raise ClusterError(
            f"the cluster did not answer within {round(timeout_s, 1):g} s while this client "
            "connected; it may be overloaded (`clonefleet cluster status` shows it)"
        ) from None


def _unless_cluster_gone() -> None:
    """Raise :class:`ClusterError` when the whole cluster is gone (``cluster down``): no call
    will be answered, and retrying would only run into Ray's own 60 s limit."""
    why = cluster_unreachable()
    if why is not None:
        raise ClusterError(why) from None


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
"""Terminal control sequences (Ray colours the header of a remote traceback)."""
_HEADER = re.compile(r"^ray::(?:[\w.]*\.)?(\w+)\(\)(?: \(pid=[^\n]*)?$")
"""The first line of a remote traceback: ``ray::Class.method() (pid=..., ip=..., ...)``."""


def task_error_text(exc: BaseException, cause: BaseException | None = None) -> str:
    """The message of a scheduler call that raised something not ours (a fault in the
    scheduler): the call's name, what it raised, then the scheduler's traceback, as plain text.

    Ray's error carries the method's name only in the (coloured) header line of its traceback:
    the exception Ray rebuilds as an instance of the cause's class drops its ``function_name``.
    """
    lines = _ANSI.sub("", str(exc)).strip().splitlines()
    name = getattr(exc, "__dict__", {}).get("function_name") or ""
    if lines and (header := _HEADER.match(lines[0])):
        name = name or header.group(1)
        lines = lines[1:]
    name = name.rsplit(".", 1)[-1] or "(unnamed)"
    what = f"{type(cause).__name__}: {cause}" if cause is not None else (lines or ["?"])[-1]
    trace = "\n".join(lines)
    return f"scheduler call {name} failed with {what}; the scheduler's traceback:\n{trace}"


def _still_registered() -> bool:
    try:
        return named_actor_exists(SCHEDULER_NAME)
    except Exception:  # the cluster itself is going away: nothing to wait for
        return False


def connect_client(
    address: str | None,
    num_cpus: int | None,
    *,
    ship_package: bool,
    session: type[ClusterSession] = ClusterSession,
) -> tuple[ClusterSession, bool]:
    """Start or join Ray for a client (through ``session``); also says whether the scheduler
    actor already exists.

    A client that does not ship the package but finds no scheduler reconnects with it: the
    scheduler it is about to create runs the package on the cluster's workers.

    Raises:
        ClusterError: Ray cannot be started or reached.
    """
    if address is None:
        embedded = session(ClusterConfig(num_cpus=num_cpus)).start()
        return embedded, named_actor_exists(SCHEDULER_NAME)
    env = remote_runtime_env(ship_package=ship_package)
    joined = session(ClusterConfig(address=address, runtime_env=env)).start()
    try:
        existed = connecting_step(lambda: named_actor_exists(SCHEDULER_NAME))
    except BaseException:
        joined.stop()
        raise
    if existed or ship_package:
        return joined, existed
    joined.stop()
    env = remote_runtime_env()
    return session(ClusterConfig(address=address, runtime_env=env)).start(), False


def positive_seconds(value: float, name: str, *, zero: bool = False) -> float:
    """``value`` as seconds, more than 0 (or at least 0 with ``zero``).

    Raises:
        UsageError: not a number, or too small.
    """
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or not (value >= 0 if zero else value > 0):
        least = "0 or more" if zero else "more than 0"
        raise UsageError(f"{name} must be a number of seconds, {least}, got {value!r}")
    return float(value)
