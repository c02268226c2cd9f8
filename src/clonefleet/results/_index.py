"""What an existing results file says per key: which rows are done, for resuming a run."""

from __future__ import annotations

import csv
import io
import json
import os
import stat
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from clonefleet.config import printable
from clonefleet.errors import UsageError
from clonefleet.results._scan import MAX_RECORD_BYTES, Piece, pieces
from clonefleet.vocab import JobState, Outcome

__all__ = ["BAD_LINES_KEPT", "BadLine", "KeyState", "ResultsIndex", "is_csv"]

BAD_LINES_KEPT = 20
"""Bad lines an index remembers with their reasons (all are counted)."""

_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
CSV_KEY_COLUMNS = ("key", "status", "outcome")


def is_csv(path: str | os.PathLike[str]) -> bool:
    """Whether a results file is CSV (its name ends in ``.csv``, any case); else it is JSONL."""
    return str(path).lower().endswith(".csv")


class KeyState(StrEnum):
    """What the latest terminal record of a key says."""

    SUCCEEDED = "succeeded"
    """Completed with outcome ``success``."""
    FAILED = "failed"
    """Any other terminal record: failed, cancelled, or completed with another outcome."""


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line of a results file that was skipped, and why."""

    line: int
    reason: str


class ResultsIndex:
    """The keys of a results file (``--out``, JSONL or CSV) and the state of each: the index a
    resumed run skips rows by.

    Read with :meth:`read` in one pass. It holds the keys and one flag per key, nothing of the
    records. A record without a key (``key`` missing or null, an empty ``key`` cell in CSV) or
    whose status is not terminal counts for nothing; the latest terminal record of a key wins.
    A bad line in the middle is skipped and counted (:attr:`bad_count`, the first few in
    :attr:`bad_lines`). A last line without a line break that does not read as a record is a torn
    tail (a writer killed mid-line): it is ignored and :attr:`torn_offset` says where it starts,
    so that :class:`~clonefleet.results.ResultsWriter` cuts it off before appending.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.csv = is_csv(path)
        self._states: dict[str, bool] = {}  # key -> succeeded
        self.records = 0
        """Records read that have a key and a terminal status."""
        self.unkeyed = 0
        """Records read without a key (ignored for resuming)."""
        self.bad_count = 0
        self.bad_lines: list[BadLine] = []
        """The first :data:`BAD_LINES_KEPT` bad lines."""
        self.torn_offset: int | None = None
        """The byte offset of a torn last line, or ``None``."""
        self.needs_newline = False
        """The last record is whole but has no line break after it (append one first)."""
        self.size = 0
        """The file's size in bytes when read (0: missing, empty or not a regular file)."""
        self.header: tuple[str, ...] | None = None
        """A CSV file's header row (``None``: JSONL, or no header yet)."""

    # -- reading ----------------------------------------------------------------------------------

    @classmethod
    def read(cls, path: str | os.PathLike[str], *, limit: int = MAX_RECORD_BYTES) -> ResultsIndex:
        """The index of the results file at ``path``; empty when it does not exist, is empty or
        is not a regular file (a FIFO or a terminal has nothing to resume from).

        Raises:
            UsageError: ``path`` is a directory or cannot be read, or is a CSV file whose header
                lacks the ``key``, ``status`` or ``outcome`` column.
        """
        index = cls(path)
        name = printable(index.path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return index
        except OSError as exc:
            raise UsageError(f"cannot read results file {name}: {exc.strerror or exc}") from None
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"results file {name} is a directory; name a file in it")
        if not stat.S_ISREG(st.st_mode):
            return index
        try:
            with open(path, "rb") as f:
                columns: dict[str, int] | None = None
                for piece in pieces(f, csv=index.csv, limit=limit):
                    if index.csv and columns is None and index.header is None:
                        columns = index._read_header(piece)
                    elif index.csv:
                        index._take_csv(piece, columns or {})
                    else:
                        index._take_json(piece)
                index.size = f.tell()
        except OSError as exc:
            raise UsageError(f"cannot read results file {name}: {exc.strerror or exc}") from None
        return index

    def _read_header(self, piece: Piece) -> dict[str, int] | None:
        if not piece.terminated:
            self.torn_offset = piece.offset  # a torn header: the file is written afresh
            return None
        try:
            header = next(csv.reader(io.StringIO(piece.data.decode("utf-8"), newline="")))
        except (UnicodeDecodeError, csv.Error, StopIteration):
            header = []
        missing = [c for c in CSV_KEY_COLUMNS if c not in header]
        if missing or piece.overlong:
            raise UsageError(
                f"results file {printable(self.path)}: line 1: the header has no "
                f"{', '.join(missing) or 'key'} column; a results CSV starts with "
                f"{','.join(CSV_KEY_COLUMNS)}"
            )
        self.header = tuple(header)
        return {c: header.index(c) for c in CSV_KEY_COLUMNS}

    def _bad(self, piece: Piece, reason: str) -> None:
        if not piece.terminated:
            self.torn_offset = piece.offset  # the torn tail of a killed writer, not a bad line
            return
        self.bad_count += 1
        if len(self.bad_lines) < BAD_LINES_KEPT:
            self.bad_lines.append(BadLine(piece.line, reason))

    def _take_json(self, piece: Piece) -> None:
        if piece.overlong:
            return self._bad(piece, "longer than the limit of a record")
        if not piece.data.strip():
            return None
        try:
            record: Any = json.loads(piece.data)
        except (UnicodeDecodeError, ValueError) as exc:
            return self._bad(piece, f"not JSON ({exc})")
        if not isinstance(record, dict):
            return self._bad(piece, "not a JSON object")
        self._take(piece, record.get("key"), record.get("status"), record.get("outcome"))
        return None

    def _take_csv(self, piece: Piece, columns: dict[str, int]) -> None:
        if piece.overlong:
            return self._bad(piece, "longer than the limit of a record")
        if not piece.data.strip():
            return None
        assert self.header is not None
        try:
            row = next(csv.reader(io.StringIO(piece.data.decode("utf-8"), newline="")))
        except (UnicodeDecodeError, csv.Error, StopIteration) as exc:
            return self._bad(piece, f"not a CSV row ({exc})")
        if len(row) != len(self.header):
            return self._bad(piece, f"{len(row)} fields where the header has {len(self.header)}")
        key, status, outcome = (row[columns[c]] for c in CSV_KEY_COLUMNS)
        self._take(piece, key or None, status, outcome or None)
        return None

    def _take(self, piece: Piece, key: object, status: object, outcome: object) -> None:
        if not isinstance(status, str) or (outcome is not None and not isinstance(outcome, str)):
            return self._bad(piece, "no status, or a status or outcome that is not a string")
        if key is not None and not isinstance(key, str):
            return self._bad(piece, "a key that is not a string")
        if not piece.terminated:
            self.needs_newline = True  # whole, but the writer must end the line first
        if key is None:
            self.unkeyed += 1
            return None
        if status in _TERMINAL:
            self.note(key, status=status, outcome=outcome)
        return None

    # -- asking -----------------------------------------------------------------------------------

    def note(self, key: str, *, status: object, outcome: object) -> None:
        """Take in a terminal record of ``key`` written after those read (latest wins)."""
        self.records += 1
        self._states[key] = status == JobState.COMPLETED and outcome == Outcome.SUCCESS

    def state(self, key: str) -> KeyState | None:
        """The state of ``key``'s latest terminal record, or ``None`` when it has none."""
        done = self._states.get(key)
        if done is None:
            return None
        return KeyState.SUCCEEDED if done else KeyState.FAILED

    def skip(self, key: str, retry_failed: bool = False) -> bool:
        """Whether the row of ``key`` is done: it succeeded, or it failed and failed rows are
        not retried."""
        done = self._states.get(key)
        return done is not None and (done or not retry_failed)

    def keys(self) -> list[str]:
        """Every key with a terminal record, in the order first seen."""
        return list(self._states)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def counts(self) -> dict[KeyState, int]:
        """How many keys are in each state."""
        done = sum(self._states.values())
        return {KeyState.SUCCEEDED: done, KeyState.FAILED: len(self._states) - done}

    def report(self) -> str | None:
        """One line about what was skipped while reading (``None`` when nothing was): the bad
        lines with the first few line numbers and reasons, and a torn last line."""
        parts = []
        if self.bad_count:
            shown = "; ".join(f"line {b.line}: {b.reason}" for b in self.bad_lines[:3])
            more = f" and {self.bad_count - 3} more" if self.bad_count > 3 else ""
            parts.append(f"{self.bad_count} bad lines skipped ({shown}{more})")
        if self.torn_offset is not None:
            parts.append(f"a torn last line at byte {self.torn_offset} ignored")
        if not parts:
            return None
        return f"results file {printable(self.path)}: " + ", ".join(parts)
