"""The journal writer: cheap appends, group commit in one worker thread, rotation and compaction.

Appending only encodes and buffers. Every write and fsync of segment data happens in one worker
thread, a whole group at a time, so many concurrent ``commit()`` callers share one ``write()`` and
one ``fsync()``. Snapshots are written in a second thread so a compaction does not hold up
commits. What the records mean is the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from threading import Lock
from typing import Any

from clonefleet.errors import JournalError, UsageError
from clonefleet.journal._files import (
    UNREADABLE,
    Replay,
    cut_damaged_tail,
    list_folder,
    open_folder,
    read_journal,
    remove_stale,
    segment_name,
    snapshot_name,
)
from clonefleet.journal._frame import DEFAULT_LIMITS, Limits, encode_record

__all__ = ["Journal"]

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class _State(StrEnum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class _Switch:
    """A mark in the pending stream: what comes after it goes to a new segment (compaction).

    The writer thread fills in ``seq``, the sequence number of that segment.
    """

    __slots__ = ("seq",)

    def __init__(self) -> None:
        self.seq: int | None = None


class Journal:
    """The writer of one journal folder.

    Records are appended to the current segment ``seg-NNNNNNNN.cfj``; a new segment starts when
    the current one passes ``segment_bytes`` (at a group boundary) and at each compaction. Only
    one writer may hold a folder at a time (an advisory lock on the folder).

    Lifecycle: open → closing → closed. ``append``, ``commit``, ``compact`` and ``flush_sync``
    raise :class:`UsageError` once closing has begun; ``close``/``aclose`` twice is harmless.
    After a failed write or fsync the journal is broken: ``append`` and ``commit`` raise
    :class:`JournalError`, and only a new :meth:`open` (which repairs the torn tail) recovers.

    Attributes:
        fsyncs: how many times segment data was fsynced (one per written group), for tests and
            metrics.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        segment_bytes: int = 64 << 20,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        """Make (mode 0700) or open the folder and take its writer lock; read no records.

        The first write starts a new segment after the highest sequence number in the folder.

        Args:
            folder: the journal folder.
            segment_bytes: start a new segment once the current one holds this many bytes.
            limits: the limits every record must fit (see :class:`Limits`).

        Raises:
            UsageError: ``segment_bytes`` is not positive.
            JournalError: the folder cannot be made or opened, is a symlink, belongs to another
                user, or another writer holds it.
        """
        if segment_bytes <= 0:
            raise UsageError(f"segment_bytes must be positive, not {segment_bytes}")
        self._path = os.fspath(folder)
        self._segment_bytes, self._limits = segment_bytes, limits
        self._dir_fd = open_folder(folder)
        try:
            fcntl.flock(self._dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._seg_seq = list_folder(self._dir_fd).highest_seq + 1
            self._size = self._scan_size()
        except OSError as exc:
            os.close(self._dir_fd)
            if isinstance(exc, BlockingIOError):
                raise JournalError(
                    f"journal folder {self._path} is held by another writer; close it first"
                ) from exc
            raise JournalError(f"cannot open journal folder {self._path}: {exc}") from exc
        self._fd: int | None = None  # the current segment, made at its first write
        self._seg_bytes = 0
        self._lock = Lock()  # guards _pending, _appended and _size
        self._io_lock = Lock()  # one group written at a time, in order
        self._pending: list[bytes | _Switch] = []
        self._appended = 0
        self._durable = 0
        self._failure: OSError | None = None
        self._state = _State.OPEN
        self._inflight: asyncio.Future[None] | None = None
        self._background: asyncio.Task[None] | None = None
        self._compacting: asyncio.Lock | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="clonefleet-journal")
        self._bulk = ThreadPoolExecutor(1, thread_name_prefix="clonefleet-journal-snapshot")
        self.fsyncs = 0

    @property
    def folder(self) -> str:
        """The journal folder."""
        return self._path

    @classmethod
    def open(
        cls,
        folder: str | os.PathLike[str],
        *,
        segment_bytes: int = 64 << 20,
        limits: Limits = DEFAULT_LIMITS,
    ) -> tuple[Journal, Replay]:
        """Open a writer on ``folder`` and read back what it holds.

        The writer starts a new segment after the highest one; it never appends to an old file.
        Damage at the end of the last segment (a torn or corrupt tail) is reported in the
        replay, its bytes are kept in ``<segment>.damaged`` and the segment is cut back to its
        good end, so the next open does not report it again. Leftovers of an interrupted
        compaction (temp snapshots, files older than the snapshot used) are deleted.

        Args:
            folder: the journal folder; made (mode 0700) when missing.
            segment_bytes: as for :class:`Journal`.
            limits: as for :class:`Journal`.

        Returns:
            The writer and the replay of what was there before.

        Raises:
            JournalError: as for :class:`Journal`, or the tail could not be repaired.
        """
        journal = cls(folder, segment_bytes=segment_bytes, limits=limits)
        try:
            replay = read_journal(folder, limits)
            journal._repair(replay)
        except BaseException:
            journal._release()
            raise
        return journal, replay

    def _repair(self, replay: Replay) -> None:
        try:
            listing = list_folder(self._dir_fd)
            start = replay.snapshot_seq or 0
            live = [seq for seq in listing.segments if seq >= start]
            if live:
                last = listing.segments[max(live)]
                last_path = os.path.join(self._path, last)
                for damage in replay.damage:
                    if damage.path == last_path and not damage.reason.startswith(UNREADABLE):
                        cut_damaged_tail(self._dir_fd, last, damage.offset)
            remove_stale(self._dir_fd, replay.snapshot_seq)
            self._size = self._scan_size()
        except OSError as exc:
            raise JournalError(f"cannot repair journal folder {self._path}: {exc}") from exc

    def _scan_size(self) -> int:
        listing = list_folder(self._dir_fd)
        names = [*listing.segments.values(), *listing.snapshots.values()]
        return sum(os.stat(n, dir_fd=self._dir_fd, follow_symlinks=False).st_size for n in names)

    # -- appending and committing --------------------------------------------------------------

    def append(self, record: dict[str, Any]) -> int:
        """Encode ``record`` and buffer it for the next group; no I/O.

        Returns:
            The record's sequence number in this writer: increasing, not necessarily by one.

        Raises:
            JournalError: the record cannot be encoded (see :func:`encode_record`), or an
                earlier write failed.
            UsageError: the journal is closing or closed.
        """
        if self._state is not _State.OPEN:
            raise UsageError(f"journal {self._path} is {self._state}; open a new one")
        if self._failure is not None:
            raise self._failed_error()
        frame = encode_record(record, self._limits)
        with self._lock:
            self._pending.append(frame)
            self._appended += 1
            return self._appended

    async def commit(self) -> None:
        """Return once every record appended before this call is written and fsynced.

        Concurrent callers share groups: one worker-thread ``write()`` and ``fsync()`` covers
        every record pending when it starts. Cancelling a caller does not cancel the group.

        Raises:
            JournalError: the write or fsync failed (for every caller waiting on that group).
        """
        target = self._appended
        while self._durable < target:
            if self._failure is not None:
                raise self._failed_error()
            flight = self._inflight
            if flight is None or flight.done():
                flight = self._start_flush()
            await asyncio.shield(flight)

    def _start_flush(self) -> asyncio.Future[None]:
        flight = asyncio.get_running_loop().run_in_executor(self._writer, self._flush_group)
        self._inflight = flight
        flight.add_done_callback(self._flush_done)
        return flight

    def _flush_done(self, flight: asyncio.Future[None]) -> None:
        if self._inflight is flight:
            self._inflight = None
        if not flight.cancelled():
            flight.exception()  # the waiters get it; it is also kept in _failure

    def start_background(self, interval_s: float = 0.05) -> None:
        """Flush pending records every ``interval_s`` seconds, one group each time.

        Records appended but never committed are then still made durable within about
        ``interval_s``. Call from a running event loop; ``aclose()`` stops it. After a failed
        write the flushing stops, and the next ``append`` or ``commit`` raises.

        Raises:
            UsageError: the journal is closing or closed, or flushing already runs.
        """
        self._check_open()
        if self._background is not None and not self._background.done():
            raise UsageError("the journal's background flush is already running")
        self._background = asyncio.get_running_loop().create_task(
            self._flush_every(interval_s), name=f"journal flush {self._path}"
        )

    async def _flush_every(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if self._durable < self._appended:
                try:
                    await self.commit()
                except JournalError:
                    return

    def flush_sync(self) -> None:
        """Write and fsync everything pending, blocking the calling thread.

        For shutdown, tests and callers without an event loop; async code uses :meth:`commit`.

        Raises:
            JournalError: the write or fsync failed, now or before.
            UsageError: the journal is closing or closed.
        """
        self._check_open()
        self._flush_group()

    def _flush_group(self) -> None:
        """Write and fsync every pending record as one group; runs in whatever thread calls it."""
        with self._io_lock:
            if self._failure is not None:
                raise self._failed_error()
            with self._lock:
                items, self._pending = self._pending, []
                last = self._appended
            try:
                self._write_items(items)
            except OSError as exc:
                self._failure = exc
                raise self._failed_error() from exc
            self._durable = last

    def _write_items(self, items: list[bytes | _Switch]) -> None:
        chunk: list[bytes] = []
        for item in items:
            if isinstance(item, _Switch):
                self._write_chunk(chunk)
                chunk = []
                self._next_segment()
                item.seq = self._seg_seq
            else:
                chunk.append(item)
        self._write_chunk(chunk)

    def _write_chunk(self, chunk: list[bytes]) -> None:
        if not chunk:
            return
        data = b"".join(chunk)
        if self._fd is None:
            self._fd = os.open(
                segment_name(self._seg_seq), _CREATE_FLAGS | os.O_APPEND, 0o600, dir_fd=self._dir_fd
            )
            os.fsync(self._dir_fd)
        self._write(self._fd, data)
        self._fsync(self._fd)
        self.fsyncs += 1
        self._seg_bytes += len(data)
        with self._lock:
            self._size += len(data)
        if self._seg_bytes >= self._segment_bytes:
            self._next_segment()

    def _next_segment(self) -> None:
        """Close the current segment, so the next write starts a new one (a no-op when the
        current one has no file yet: it is still new)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.close(fd)
        self._seg_seq += 1
        self._seg_bytes = 0

    def _write(self, fd: int, data: bytes) -> None:
        """Write all of ``data``; the seam a test overrides to fail like a full disk."""
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def _fsync(self, fd: int) -> None:
        os.fsync(fd)

    def _failed_error(self) -> JournalError:
        return JournalError(
            f"journal {self._path} could not write: {self._failure}; records since the last "
            "commit may be lost; reopen it with Journal.open"
        )

    # -- compaction ----------------------------------------------------------------------------

    async def compact(self, snapshot: Iterable[dict[str, Any]]) -> None:
        """Replace everything journaled so far with ``snapshot``, the whole live state.

        The snapshot is encoded at once (read at this moment), then written as ``snap-N.cfj`` beside
        a new segment N, and older files are deleted; each step is safe to crash after
        (docs/durability.md, "Compaction"). Compactions run one at a time.

        Raises:
            JournalError: a snapshot record cannot be encoded (nothing changed then), or a write
                failed.
            UsageError: the journal is closing or closed.
        """
        self._check_open()
        if self._compacting is None:
            self._compacting = asyncio.Lock()
        async with self._compacting:
            self._check_open()
            data = b"".join([encode_record(record, self._limits) for record in snapshot])
            switch = _Switch()
            with self._lock:
                self._pending.append(switch)
                self._appended += 1
            await self.commit()
            if switch.seq is None:  # pragma: no cover - commit returned, so the switch was written
                raise JournalError("compaction lost its segment switch")
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._bulk, self._install_snapshot, switch.seq, data)

    def _install_snapshot(self, seq: int, data: bytes) -> None:
        final = snapshot_name(seq)
        temp = f"{final}.tmp"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=self._dir_fd)
            fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=self._dir_fd)
            try:
                self._write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, final, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            os.fsync(self._dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self._dir_fd)
            raise JournalError(f"cannot write journal snapshot {final}: {exc}") from exc
        with self._lock:
            self._size += len(data)
        try:
            freed = remove_stale(self._dir_fd, seq)
        except OSError as exc:
            raise JournalError(f"cannot delete journal files older than {final}: {exc}") from exc
        with self._lock:
            self._size -= freed

    # -- size and closing ----------------------------------------------------------------------

    def size_bytes(self) -> int:
        """Total bytes of the segments and snapshots in the folder (a counter; no ``stat``)."""
        return self._size

    def _check_open(self) -> None:
        if self._state is not _State.OPEN:
            raise UsageError(f"journal {self._path} is {self._state}; open a new one")

    async def aclose(self) -> None:
        """Stop the background flush, wait for a running compaction, write and fsync what is
        pending, and close the files. Closing twice is harmless.

        Raises:
            JournalError: pending records could not be written, now or in an earlier failed
                write (the files are closed anyway).
        """
        if self._state is not _State.OPEN:
            return
        self._state = _State.CLOSING
        background, self._background = self._background, None
        if background is not None:
            background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await background
        try:
            async with self._compacting or asyncio.Lock():
                await self.commit()
        finally:
            self._release()

    def close(self) -> None:
        """Like :meth:`aclose`, blocking; for code without an event loop.

        It cancels the background flush but cannot wait for it (use ``aclose()`` in async code).

        Raises:
            JournalError: pending records could not be written, now or in an earlier failed
                write (the files are closed anyway).
        """
        if self._state is not _State.OPEN:
            return
        self._state = _State.CLOSING
        if self._background is not None:
            self._background.cancel()
            self._background = None
        try:
            if self._durable < self._appended:
                self._flush_group()
        finally:
            self._release()

    def _release(self) -> None:
        self._state = _State.CLOSED
        self._writer.shutdown(wait=True)
        self._bulk.shutdown(wait=True)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        os.close(self._dir_fd)  # also drops the writer lock
