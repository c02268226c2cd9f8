"""Running a file tool's work off the event loop, bounded in time and stoppable.

:func:`run_bounded` runs the work in a worker thread of the file tools' own small pool. The work
is cooperative: it calls :meth:`ToolDeadline.check` often (per directory entry, per line) and
ends at its next check once the deadline has passed or the clone was cancelled; the caller
answers within the deadline (plus a short grace) even when the work is stuck. See
docs/architecture.md, "Tools a clone can call".
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from clonefleet.errors import ToolRetry

__all__ = ["ToolDeadline", "active_work", "run_bounded"]

T = TypeVar("T")

_GRACE_S = 0.5
"""How much longer than its deadline the caller waits for work stuck in a system call."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_active = 0
_active_lock = threading.Lock()


class ToolDeadline:
    """The limits one tool call's work runs under: a deadline, a cancel flag, a visit count.

    Args:
        what: the tool's name, for the error texts.
        timeout_s: seconds the work may take, counted from the call.
        max_visits: directory entries the work may look at (``glob``, ``grep``).
    """

    def __init__(self, what: str, timeout_s: float, max_visits: int) -> None:
        self.what, self.timeout_s, self.max_visits = what, timeout_s, max_visits
        self.ends_at = time.monotonic() + timeout_s
        self.visits = 0
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Ask the work to stop at its next check (the clone was cancelled, or the caller gave up)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.ends_at - time.monotonic())

    def check(self) -> None:
        """Raise when the work must stop.

        Raises:
            ToolRetry: the call was cancelled, or its deadline passed.
        """
        if self._cancelled.is_set():
            raise ToolRetry(f"{self.what} was cancelled")
        if time.monotonic() >= self.ends_at:
            raise self.timed_out()

    def visit(self) -> None:
        """Count one directory entry looked at, then :meth:`check`.

        Raises:
            ToolRetry: too many entries, cancelled, or past the deadline.
        """
        self.visits += 1
        if self.visits > self.max_visits:
            raise ToolRetry(
                f"{self.what} stopped after looking at {self.max_visits} directory entries; "
                "narrow the pattern or give a smaller `path`"
            )
        self.check()

    def timed_out(self) -> ToolRetry:
        return ToolRetry(f"{self.what} timed out after {self.timeout_s:g}s")


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = min(32, (os.cpu_count() or 1) + 4)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="clonefleet-tool")
        return _pool


def _call(work: Callable[[ToolDeadline], T], deadline: ToolDeadline) -> T:
    global _active
    with _active_lock:
        _active += 1
    try:
        deadline.check()  # queued past its deadline, or cancelled while queued
        return work(deadline)
    finally:
        with _active_lock:
            _active -= 1


def active_work() -> int:
    """How many tool calls' work is running in worker threads right now."""
    with _active_lock:
        return _active


async def run_bounded(
    work: Callable[[ToolDeadline], T], *, what: str, timeout_s: float, max_visits: int = 100_000
) -> T:
    """Run ``work(deadline)`` in a worker thread; answer within the deadline; stop it when
    cancelled.

    Args:
        work: the blocking work; it calls the deadline's checks often.
        what: the tool's name, for the error texts.
        timeout_s: the call's deadline in seconds.
        max_visits: directory entries the work may look at.

    Returns:
        What ``work`` returned.

    Raises:
        ToolRetry: the work failed, or the deadline passed.
        asyncio.CancelledError: the calling task was cancelled (the work is told to stop).
    """
    deadline = ToolDeadline(what, timeout_s, max_visits)
    future = asyncio.get_running_loop().run_in_executor(_executor(), _call, work, deadline)
    try:
        done, _ = await asyncio.wait({future}, timeout=timeout_s + _GRACE_S)
    except asyncio.CancelledError:
        deadline.cancel()
        future.cancel()  # drops it if it is still queued
        raise
    if not done:
        deadline.cancel()
        future.cancel()
        raise deadline.timed_out()
    return future.result()
