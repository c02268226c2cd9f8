"""Appending run records to a results file so that a killed driver loses at most a torn line."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Mapping
from typing import Any

from clonefleet.config import Config, printable
from clonefleet.errors import UsageError
from clonefleet.results._csv import CsvResults
from clonefleet.results._index import KeyState, ResultsIndex, is_csv

__all__ = ["SYNC_EVERY_S", "ResultsWriter"]

SYNC_EVERY_S = 1.0
"""A results file is synced to disk at most this often while written (and on close)."""
OUT_MODE = 0o644


class ResultsWriter:
    """A results file (``--out``) open for appending run records, JSONL or CSV by its name
    (:func:`~clonefleet.results.is_csv`).

    On open it reads the file's :class:`ResultsIndex` (or takes the one given, read again if the
    file changed since), cuts off a torn last line, ends a last line that lacks its line break,
    and writes the CSV header to an empty file (or checks the header already there). Each record
    is then one ``write`` of a whole line, so it is in the file at once and a SIGKILL leaves at
    most a torn last line; the file is synced at most once every :data:`SYNC_EVERY_S` and on
    :meth:`close`. The file is locked while open: a second writer of the same file is refused.

    A record for a key that already succeeded in this file is not written (:meth:`write`
    returns ``False`` and :attr:`refused` counts it): no key has two successes.

    Raises:
        UsageError: the file is a directory, cannot be opened or read, is written by another
            run, or is a CSV file whose header differs from this run's columns.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        index: ResultsIndex | None = None,
        include_input: bool = False,
        exit_schema: Mapping[str, Any] | None = None,
        config: Config | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = str(path)
        self.include_input = include_input
        self.written = 0
        self.refused = 0
        """Records not written because their key had already succeeded."""
        self.csv = (
            CsvResults(exit_schema, include_input=include_input, config=config)
            if (index.csv if index is not None else is_csv(self.path))
            else None
        )
        self._clock = clock
        self.synced_at = clock()
        self._fd: int | None = None
        name = printable(self.path)
        fd = self._open(name)
        try:
            self.regular = stat.S_ISREG(os.fstat(fd).st_mode)
            if self.regular:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise UsageError(
                        f"results file {name} is being written by another run; wait for it "
                        "to end or name another file"
                    ) from None
            if index is None or (self.regular and index.size != os.fstat(fd).st_size):
                index = ResultsIndex.read(self.path) if self.regular else ResultsIndex(self.path)
            self.index = index
            if self.regular:
                self._mend(fd, index, name)
            elif self.csv is not None:  # a FIFO or a terminal: a fresh stream each time
                self._put(fd, self.csv.header().encode())
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _open(self, name: str) -> int:
        if os.path.isdir(self.path):
            raise UsageError(f"results file {name} is a directory; name a file in it")
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        try:
            # O_NONBLOCK only for the open: a FIFO with no reader fails instead of hanging.
            fd = os.open(self.path, flags | os.O_NONBLOCK, OUT_MODE)
            os.set_blocking(fd, True)
        except OSError as exc:
            raise UsageError(
                f"cannot open results file {name} for writing: {exc.strerror or exc}"
            ) from None
        return fd

    def _mend(self, fd: int, index: ResultsIndex, name: str) -> None:
        """Cut a torn tail, end an unended last line, and write or check the CSV header."""
        if index.torn_offset is not None:
            os.ftruncate(fd, index.torn_offset)
            index.torn_offset = None
            if index.csv and index.header is None:
                index.size = 0
        elif index.needs_newline:
            self._put(fd, b"\n")
            index.needs_newline = False
        if self.csv is None:
            return
        if index.header is None and os.fstat(fd).st_size == 0:
            self._put(fd, self.csv.header().encode())
            index.header = self.csv.columns
        elif index.header != self.csv.columns:
            raise UsageError(
                f"results file {name}: line 1: its columns are not this run's "
                f"({_difference(index.header or (), self.csv.columns)}); name another file, "
                "or run with the definition and options that wrote it"
            )

    @staticmethod
    def _put(fd: int, data: bytes) -> None:
        while data:
            data = data[os.write(fd, data) :]

    def write(self, record: Mapping[str, Any], row: object = None) -> bool:
        """Append one run record (with ``include_input``, ``row`` goes in under ``input``).

        Returns ``False``, writing nothing, when the record's key already succeeded in this
        file.
        """
        if self._fd is None:
            raise UsageError(f"results file {printable(self.path)} is closed")
        key = record.get("key")
        if isinstance(key, str) and self.index.state(key) is KeyState.SUCCEEDED:
            self.refused += 1
            return False
        if self.csv is not None:
            data = self.csv.line(record, row).encode("utf-8", "backslashreplace")
        else:
            out = dict(record)
            if self.include_input:
                out["input"] = row
            data = (json.dumps(out, default=str) + "\n").encode()
        self._put(self._fd, data)
        self.written += 1
        if isinstance(key, str):
            self.index.note(key, status=record.get("status"), outcome=record.get("outcome"))
        if self.regular and self._clock() - self.synced_at >= SYNC_EVERY_S:
            self._sync()
        return True

    def _sync(self) -> None:
        self.synced_at = self._clock()
        if self._fd is not None and self.regular:
            try:
                os.fsync(self._fd)
            except OSError:
                pass  # the lines are written; a file system that cannot sync keeps them anyway

    def close(self) -> None:
        """Sync to disk and close (twice is harmless)."""
        if self._fd is None:
            return
        self._sync()
        fd, self._fd = self._fd, None
        os.close(fd)

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _difference(theirs: tuple[str, ...], ours: tuple[str, ...]) -> str:
    """How a CSV file's header differs from a run's columns, in words."""
    added = [c for c in ours if c not in theirs]
    dropped = [c for c in theirs if c not in ours]
    parts = []
    if added:
        parts.append("this run adds " + ", ".join(added))
    if dropped:
        parts.append("the file has " + ", ".join(dropped) + " that this run has not")
    return "; ".join(parts) or "the same columns in another order: " + ",".join(theirs)
