"""Whole-file checks of an inputs file before anything starts: can it be read, does it hold rows,
how many, and are their keys unique; and the spooled copy of an input that cannot be read twice.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from clonefleet.errors import UsageError
from clonefleet.inputs._format import InputFormat
from clonefleet.inputs._lines import MIB, STDIN, physical_lines
from clonefleet.inputs._rows import open_checked, read_rows, row_keys, source_error

__all__ = ["check_source", "count_and_check_keys", "spool"]

_HEAD_BYTES = 64 * 1024
"""How much of the start of a file is searched for a NUL byte (the sign of a binary file)."""


def check_source(
    path: str | os.PathLike[str],
    fmt: InputFormat | str,
    *,
    max_row_bytes: int = MIB,
    name: str | None = None,
) -> None:
    """Raise one :class:`UsageError` naming the file (and line) when the inputs file ``path``
    cannot be used at all: it is missing, a directory, unreadable, binary (a NUL byte in its
    first 64 KiB) or has no rows (for CSV and TSV: no record under the header).

    Standard input (``-``) and a FIFO are accepted without reading them (they can be read only
    once): :func:`spool` them and check the spooled copy, with ``name`` the name the user gave.
    """
    shown = name or os.fspath(path)
    fmt = InputFormat(fmt)
    if os.fspath(path) == STDIN:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise source_error(shown, exc) from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"inputs file {shown}: is a directory, not a file")
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return
    if not stat.S_ISREG(mode):
        raise UsageError(f"inputs file {shown}: is not a regular file, a FIFO or standard input")
    with open_checked(path, shown) as stream:
        try:
            head = stream.read(_HEAD_BYTES)
        except OSError as exc:
            raise source_error(shown, exc) from None
    nul = head.find(b"\0")
    if nul >= 0:
        line = head.count(b"\n", 0, nul) + 1
        raise UsageError(
            f"inputs file {shown}: line {line}: a NUL byte, so this looks like a binary file; "
            "inputs must be UTF-8 text"
        )
    if not head:
        raise UsageError(f"inputs file {shown}: is empty (no rows)")
    with contextlib.closing(read_rows(path, fmt, max_row_bytes=max_row_bytes, name=shown)) as rows:
        first = next(rows, None)
    if first is None:
        if fmt in (InputFormat.CSV, InputFormat.TSV):
            raise UsageError(
                f"inputs file {shown}: has no rows (a header line and at least one record under "
                "it are needed)"
            )
        raise UsageError(f"inputs file {shown}: has no rows (only blank lines)")


def count_and_check_keys(
    path: str | os.PathLike[str],
    fmt: InputFormat | str,
    *,
    key: str | None,
    limit: int | None,
    max_count: int,
    max_row_bytes: int = MIB,
    name: str | None = None,
) -> int:
    """The number of rows of the inputs file ``path`` (at most ``limit``), read in one pass.

    Raises a :class:`UsageError` when there are more than ``max_count`` rows (the config's
    ``limits.max_count``), and, with a ``key``, when two rows have one key (naming both lines).
    Rows that fail (:class:`RowError`) count as rows and take part in no key check. Without a
    key, JSONL and text files are counted by their non-blank lines, without parsing.

    ``path`` must be a regular file (a duplicate is confirmed by reading the earlier row again):
    :func:`spool` standard input or a FIFO first and pass the copy, with ``name`` the user's name.
    Memory: one 64-bit digest per keyed row (about 60 bytes each).
    """
    shown = name or os.fspath(path)
    fmt = InputFormat(fmt)
    if limit is not None and limit < 1:
        raise UsageError(f"{shown}: the limit must be at least 1, not {limit}")
    if os.fspath(path) == STDIN or not os.path.isfile(path):
        check_source(path, fmt, max_row_bytes=max_row_bytes, name=shown)
        raise UsageError(f"inputs file {shown}: not a regular file; spool it to a file first")
    stop = max_count + 1 if limit is None else min(limit, max_count + 1)
    if key is None and fmt in (InputFormat.JSONL, InputFormat.TEXT):
        count = _count_lines(path, shown, stop, max_row_bytes)
    else:
        count = _count_keyed(path, fmt, key, stop, max_row_bytes, shown)
    if count > max_count:
        raise UsageError(
            f"inputs file {shown}: more than {max_count:,} rows, the most one batch may have "
            "(limits.max_count); raise limits.max_count in the config, or take the first rows "
            "with --limit"
        )
    return count


def _count_lines(path: str | os.PathLike[str], shown: str, stop: int, max_bytes: int) -> int:
    """Non-blank lines (and overlong ones) up to ``stop``: the rows of JSONL or text."""
    count = 0
    with open_checked(path, shown) as stream:
        for _number, raw in physical_lines(stream, max_bytes):
            if raw is None or raw.strip():
                count += 1
                if count >= stop:
                    break
    return count


def _count_keyed(
    path: str | os.PathLike[str],
    fmt: InputFormat,
    key: str | None,
    stop: int,
    max_bytes: int,
    shown: str,
    digest: Callable[[str], int] = hash,
) -> int:
    """Count the rows up to ``stop`` and raise on two rows with one key.

    A set of each key's 64-bit ``digest`` is kept. When a key's digest is in it already, the
    rows before are read again to find that exact key: found, the two rows are a duplicate;
    not found, the key is kept as text (with its line) so that a later copy of it needs no
    reading again. The tests pass a poor ``digest`` to check that a shared hash alone is no
    duplicate.
    """
    count = 0
    if key is None:
        rows = read_rows(path, fmt, limit=stop, max_row_bytes=max_bytes, name=shown)
        with contextlib.closing(rows):
            for _row in rows:
                count += 1
        return count
    seen: set[int] = set()
    exact: dict[str, int] = {}  # keys sharing a digest with an earlier, other key -> their line
    keys = row_keys(path, fmt, key=key, max_row_bytes=max_bytes, name=shown)
    with contextlib.closing(keys):
        for line, value in keys:
            count += 1
            if count > stop:
                return stop
            if value is None:
                continue
            hashed = digest(value)
            if hashed not in seen:
                seen.add(hashed)
                continue
            earlier = exact.get(value)
            if earlier is None:
                earlier = _line_of(path, fmt, key, value, line, max_bytes, shown)
            if earlier is not None:
                raise UsageError(
                    f"inputs file {shown}: lines {earlier} and {line} have the same key "
                    f"{value!r} (field {key!r}); each row needs a key of its own"
                )
            exact[value] = line
    return count


def _line_of(
    path: str | os.PathLike[str],
    fmt: InputFormat,
    key: str,
    value: str,
    before: int,
    max_bytes: int,
    shown: str,
) -> int | None:
    """The first line before ``before`` whose row has the key ``value``, or ``None``."""
    keys = row_keys(path, fmt, key=key, max_row_bytes=max_bytes, name=shown)
    with contextlib.closing(keys):
        for line, other in keys:
            if line >= before:
                return None
            if other == value:
                return line
    return None


def spool(
    path: str | os.PathLike[str], dest_dir: str | os.PathLike[str], *, name: str | None = None
) -> Path:
    """Copy the inputs ``path`` (``-``: standard input, or a FIFO) into a new file in
    ``dest_dir`` as it is read, and return that file's path; the caller deletes it.

    Standard input and FIFOs can be read only once; the count pass and the row pass then both
    read the copy, so they see the same bytes. A failed copy leaves no file behind.
    """
    shown = name or os.fspath(path)
    try:
        handle, spooled = tempfile.mkstemp(prefix="inputs-", suffix=".spool", dir=dest_dir)
    except OSError as exc:
        raise UsageError(
            f"inputs file {shown}: cannot make a copy in {os.fspath(dest_dir)} "
            f"({exc.strerror or exc})"
        ) from None
    try:
        with os.fdopen(handle, "wb") as out, open_checked(path, shown) as source:
            try:
                shutil.copyfileobj(source, out, MIB)
            except OSError as exc:
                raise UsageError(
                    f"inputs file {shown}: cannot be copied to {spooled} ({exc.strerror or exc})"
                ) from None
    except BaseException:
        Path(spooled).unlink(missing_ok=True)
        raise
    return Path(spooled)
