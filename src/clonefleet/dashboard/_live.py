"""The dashboard's live state: one poller reads the fleet, every page shares what it read.

:class:`BlockingCalls` runs the blocking fleet reads in a few worker threads, each with a
deadline, so the event loop is never held; :class:`Live` reads a :class:`Snapshot` every
``refresh_s`` while someone is looking, keeps the last good one when the scheduler does not
answer (and says why), and wakes the server-sent event streams when something changed.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from clonefleet.dashboard._data import DataSource, Snapshot, overview, read_snapshot
from clonefleet.errors import ClonefleetError

__all__ = ["BlockingCalls", "DashboardOptions", "Live"]

T = TypeVar("T")
log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
"""The longest pause between reads while the scheduler does not answer."""
JOBS_PER_REFRESH = 2_000
"""A fleet of more jobs is read less often than ``refresh_s``, in proportion."""
MAX_PAUSE_S = 30.0
"""The longest pause between reads of a large fleet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DashboardOptions:
    """How the dashboard server reads the fleet and serves pages."""

    refresh_s: float = 1.0
    """Seconds between two reads of the job table while a page is open."""
    call_timeout_s: float = 15.0
    """Deadline of one read of a job or its events (the thread is left to finish on its own)."""
    table_timeout_s: float = 60.0
    """Deadline of one read of the whole job table (a page of 1,000 jobs per call on the
    scheduler, each with the fleet's own deadline)."""
    workers: int = 4
    """Reads of the fleet running at once; further requests wait for a free one."""
    max_streams: int = 32
    """Live-update streams served at once; more are refused with 503."""
    stream_lifetime_s: float = 300.0
    """A live-update stream ends after this long (the browser reconnects at once)."""
    heartbeat_s: float = 15.0
    """A stream with nothing new sends a comment this often (keeps proxies from closing it)."""
    idle_s: float = 60.0
    """No request for this long: the poller stops reading until the next one."""


class BlockingCalls:
    """Runs blocking calls in ``workers`` threads, each with a deadline of ``deadline_s``.

    A call past its deadline raises ``TimeoutError`` at once while its thread runs on; its slot is
    only freed when the thread returns, so a frozen scheduler can tie up at most ``workers``
    threads and never an unbounded queue of them.
    """

    def __init__(self, workers: int, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self._workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="clonefleet-dashboard")
        self._slots: asyncio.Semaphore | None = None  # made on first use, in the server's loop

    async def __call__(
        self, fn: Callable[..., T], *args: Any, deadline_s: float | None = None
    ) -> T:
        """``fn(*args)`` in a worker thread; ``TimeoutError`` after ``deadline_s`` (default
        the one given at construction)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._workers)
        slots = self._slots
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.deadline_s if deadline_s is None else deadline_s):
            await slots.acquire()
            try:
                fut = loop.run_in_executor(self._pool, functools.partial(fn, *args))
            except BaseException:
                slots.release()
                raise
            fut.add_done_callback(lambda f: _settle(f, slots))
            return await asyncio.shield(fut)

    def close(self) -> None:
        """Stop taking calls; threads still running finish on their own."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _settle(fut: asyncio.Future[Any], slots: asyncio.Semaphore) -> None:
    slots.release()
    if not fut.cancelled():
        fut.exception()  # retrieved, so an abandoned call's error is not reported as lost


def _problem(exc: BaseException, deadline_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"the scheduler did not answer within {deadline_s:g} s"
    if isinstance(exc, ClonefleetError):
        return str(exc)
    return f"could not read the fleet ({type(exc).__name__}: {exc})"


class Live:
    """The latest snapshot and the scheduler's state, read by one poller for every page."""

    def __init__(
        self,
        source: DataSource,
        calls: BlockingCalls,
        options: DashboardOptions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source, self.calls, self.options, self._clock = source, calls, options, clock
        self.snapshot: Snapshot | None = None
        self.problem: str | None = None
        """Why the last read failed; ``None`` after a good one."""
        self.version = 0
        """Grows whenever :attr:`message` changes."""
        self.message = b"{}"
        """The overview and the scheduler's state as JSON (one line), sent to every stream."""
        self._digest = b""
        self._last_seen = clock()
        self._changed: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None

    def touch(self) -> None:
        """Someone is looking: keep reading (and start again at once after an idle pause)."""
        self._last_seen = self._clock()
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Read the fleet every ``refresh_s`` (backing off up to 5 s while it fails), pausing
        while nobody looks; runs until cancelled."""
        self._wake = asyncio.Event()
        pause = self.options.refresh_s
        while True:
            if self._clock() - self._last_seen > self.options.idle_s:
                self._wake.clear()
                await self._wake.wait()
            try:
                snap = await self.calls(
                    read_snapshot, self.source, deadline_s=self.options.table_timeout_s
                )
            except Exception as exc:  # every failure shows as the banner; the loop goes on
                if not isinstance(exc, ClonefleetError | TimeoutError):
                    log.exception("dashboard: reading the fleet failed")
                self.publish(self.snapshot, _problem(exc, self.options.table_timeout_s))
                pause = min(pause * 2, MAX_BACKOFF_S)
            else:
                self.publish(snap, None)
                pause = self.pause_after(snap)
            await asyncio.sleep(pause)

    def pause_after(self, snap: Snapshot) -> float:
        """``refresh_s``, longer for a large fleet: each read lists every job, so reads of
        100,000 jobs come at most every 30 s rather than every second."""
        scale = max(1.0, len(snap.jobs) / JOBS_PER_REFRESH)
        return min(self.options.refresh_s * scale, max(self.options.refresh_s, MAX_PAUSE_S))

    def publish(self, snap: Snapshot | None, problem: str | None) -> None:
        """Take a new snapshot (or a failure) and wake the streams if anything changed."""
        self.snapshot, self.problem = snap, problem
        body: dict[str, Any] = overview(snap) if snap is not None else {}
        body["scheduler"] = {"ok": problem is None and snap is not None, "problem": problem}
        rows = orjson.dumps(snap.jobs) if snap is not None else b""
        fetched = body.pop("fetched_at", None)
        digest = hashlib.blake2b(orjson.dumps(body) + rows, digest_size=16).digest()
        if digest == self._digest:
            return
        self._digest = digest
        self.version += 1
        body.update(version=self.version, fetched_at=fetched)
        self.message = orjson.dumps(body)
        self.wake_streams()

    def wake_streams(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = None

    async def wait_change(self, seen: int, timeout_s: float) -> None:
        """Return once :attr:`version` is past ``seen``, after ``timeout_s``, or at shutdown."""
        if self.version != seen:
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        changed = self._changed
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            pass
