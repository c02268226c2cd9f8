"""Rows of an inputs file: JSONL objects, CSV or TSV records under a header, or lines of text.

Reading streams: the file is read in binary one line at a time, each row decoded and parsed on
its own, and a row that cannot be parsed is a :class:`RowError` of its own while the rows around
it are read as usual. Problems of the whole file (it cannot be opened, a CSV header that cannot
be read, a key that is not a column) are one :class:`UsageError` at once.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from clonefleet.errors import UsageError
from clonefleet.inputs._format import InputFormat
from clonefleet.inputs._lines import MIB, STDIN, content_length, physical_lines, size_text

__all__ = ["Row", "RowError", "open_checked", "read_rows", "row_keys", "source_error"]


@dataclass(frozen=True, slots=True)
class Row:
    """One row of an inputs file: the input of one clone."""

    line: int
    """The 1-based line of the file where the row starts."""
    key: str
    """What identifies the row: its key field's value, or its line number as text."""
    data: dict[str, Any] | str
    """The row's fields (JSONL, CSV, TSV), or the line's text without its ending (text)."""


@dataclass(frozen=True, slots=True)
class RowError:
    """A row that could not be read: it fails alone, the other rows are read as usual."""

    line: int
    """The 1-based line of the file where the row starts."""
    key: str | None
    """The row's key when it is known (its line number as text without a key field), else
    ``None`` (the row could not be parsed, or lacks its key field)."""
    reason: str
    """Why, in plain words: ``not valid JSON: Expecting value at column 1``."""

    @property
    def message(self) -> str:
        """The reason with its line: ``line 7: not valid JSON: ...``."""
        return f"line {self.line}: {self.reason}"


def read_rows(
    path: str | os.PathLike[str],
    fmt: InputFormat | str,
    *,
    key: str | None = None,
    limit: int | None = None,
    max_row_bytes: int = MIB,
    name: str | None = None,
) -> Generator[Row | RowError, None, None]:
    """Stream the rows of the inputs file ``path`` (``-``: standard input) in file order.

    ``key`` names the field whose value is a row's key (default: the row's line number); a row
    without it, or with a null, empty or non-scalar value, is a :class:`RowError`. ``limit`` stops
    after that many rows (a :class:`RowError` counts as a row). A row longer than
    ``max_row_bytes`` is a :class:`RowError` and is skipped without being held in memory.
    ``name`` is the file's name in messages (default ``path``; give the user's name when ``path``
    is a spooled copy).

    The file is opened, and a CSV or TSV header read, before this returns: a file that cannot be
    read, a header that cannot be read or repeats a column, a key that is not a column, or any key
    for text rows is a :class:`UsageError` here. The file is closed when the iterator ends or is
    closed.
    """
    shown = name or os.fspath(path)
    fmt = InputFormat(fmt)
    if limit is not None and limit < 1:
        raise UsageError(f"{shown}: the limit must be at least 1, not {limit}")
    if max_row_bytes < 1:
        raise UsageError(f"{shown}: the largest row must be at least 1 byte, not {max_row_bytes}")
    if key is not None and fmt is InputFormat.TEXT:
        raise UsageError(f"{shown}: cannot use the key field {key!r}: text rows have no fields")
    if key is not None and not key:
        raise UsageError(f"{shown}: the key field's name is empty")
    stack = contextlib.ExitStack()
    try:
        stream = stack.enter_context(open_checked(path, shown))
        rows: Iterator[Row | RowError]
        if fmt is InputFormat.JSONL:
            rows = _jsonl_rows(stream, key, max_row_bytes)
        elif fmt is InputFormat.TEXT:
            rows = _text_rows(stream, max_row_bytes)
        else:
            rows = _csv_rows(stream, fmt, key, max_row_bytes, shown)
    except BaseException:
        stack.close()
        raise
    return _taken(rows, limit, stack)


def row_keys(
    path: str | os.PathLike[str],
    fmt: InputFormat,
    *,
    key: str,
    max_row_bytes: int = MIB,
    name: str | None = None,
) -> Generator[tuple[int, str | None], None, None]:
    """``(line, key)`` of every row of ``path``, as :func:`read_rows` reads them (``None`` for a
    row that fails), for the key pass: JSONL rows are not built, only their key field read."""
    if fmt is not InputFormat.JSONL:
        rows = read_rows(path, fmt, key=key, max_row_bytes=max_row_bytes, name=name)
        return ((row.line, row.key) for row in rows)
    shown = name or os.fspath(path)
    stack = contextlib.ExitStack()
    stream = stack.enter_context(open_checked(path, shown))
    return _jsonl_keys(stream, key, max_row_bytes, stack)


def _jsonl_keys(
    stream: BinaryIO, key: str, max_bytes: int, stack: contextlib.ExitStack
) -> Generator[tuple[int, str | None], None, None]:
    with stack:
        for number, raw in physical_lines(stream, max_bytes):
            if raw is None:
                yield number, None
                continue
            if not raw.strip():
                continue
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                value = None  # read again below, as read_rows does
            if type(value) is dict:
                field = value.get(key)
                if type(field) is str:
                    yield number, field or None
                    continue
                if type(field) is int:
                    yield number, str(field)
                    continue
            value, reason = _json_value(raw)  # a float may be a long integer orjson rounded
            row = _keyed(number, key, value) if not reason and isinstance(value, dict) else None
            yield number, (row.key if isinstance(row, Row) else None)


def source_error(path: str, exc: OSError) -> UsageError:
    """The usage error for an inputs file that cannot be opened or read."""
    if isinstance(exc, FileNotFoundError):
        return UsageError(f"inputs file {path}: no such file")
    if isinstance(exc, IsADirectoryError):
        return UsageError(f"inputs file {path}: is a directory, not a file")
    if isinstance(exc, PermissionError):
        return UsageError(f"inputs file {path}: cannot be read (permission denied)")
    return UsageError(f"inputs file {path}: cannot be read ({exc.strerror or exc})")


@contextlib.contextmanager
def open_checked(path: str | os.PathLike[str], shown: str) -> Iterator[BinaryIO]:
    """Open an inputs file for binary reading (``-``: standard input); an error is a usage error
    naming the file as ``shown``."""
    if os.fspath(path) == STDIN:
        yield sys.stdin.buffer
        return
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise source_error(shown, exc) from None
    with stream:
        yield stream


def _taken(
    rows: Iterator[Row | RowError], limit: int | None, stack: contextlib.ExitStack
) -> Generator[Row | RowError, None, None]:
    with stack:
        for count, row in enumerate(rows, 1):
            yield row
            if limit is not None and count >= limit:
                return


def _jsonl_rows(stream: BinaryIO, key: str | None, max_bytes: int) -> Iterator[Row | RowError]:
    too_long = f"longer than {size_text(max_bytes)}"
    for number, raw in physical_lines(stream, max_bytes):
        if raw is None:
            yield RowError(number, _line_key(key, number), too_long)
            continue
        if not raw.strip():
            continue
        value, reason = _json_value(raw)
        if reason:
            yield RowError(number, _line_key(key, number), reason)
            continue
        if not isinstance(value, dict):
            reason = f"{_json_kind(value)}, not a JSON object"
            yield RowError(number, _line_key(key, number), reason)
            continue
        yield _keyed(number, key, value)


def _json_value(raw: bytes) -> tuple[Any, str]:
    """The JSON value of one line, or ``(None, reason)`` when it is not valid UTF-8 JSON.

    orjson parses (fast) unless the line has a run of 19 digits or more (orjson would read an
    integer past 64 bits as a float); the standard library parses those lines, and again a line
    orjson refuses, to word the error with a column. NaN and Infinity are refused.
    """
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw), ""
        except orjson.JSONDecodeError:
            pass
    try:
        return _STRICT_JSON.decode(raw.decode()), ""
    except UnicodeDecodeError as exc:
        return None, _utf8_reason(exc)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg} at column {exc.colno}"
    except ValueError as exc:
        return None, f"not valid JSON: {exc}"
    except RecursionError:
        return None, "not valid JSON: nested too deeply"


def _text_rows(stream: BinaryIO, max_bytes: int) -> Iterator[Row | RowError]:
    too_long = f"longer than {size_text(max_bytes)}"
    for number, raw in physical_lines(stream, max_bytes):
        if raw is None:
            yield RowError(number, str(number), too_long)
            continue
        if not raw.strip():
            continue
        try:
            text = raw[: content_length(raw)].decode()
        except UnicodeDecodeError as exc:
            yield RowError(number, str(number), _utf8_reason(exc))
            continue
        yield Row(number, str(number), text)


class _TooLong(Exception):
    """A CSV record grew past the bound on a row."""


class _Feed:
    """The decoded lines of a CSV file for :func:`csv.reader`, one record's worth at a time.

    It notes where the record being read starts, stops a record that grows past the bound, and
    notes (rather than raises) bad UTF-8 so the record's other lines are still read as its own.
    """

    def __init__(self, lines: Iterator[tuple[int, bytes | None]], max_bytes: int) -> None:
        self._lines = lines
        self._max_bytes = max_bytes
        self.start = 0
        self.used = 0
        self.quotes = 0
        self.bad: str | None = None

    def begin(self) -> None:
        """Start a new record."""
        self.start, self.used, self.quotes, self.bad = 0, 0, 0, None

    def skip_quoted(self) -> None:
        """After a record grew too long inside a quoted field, skip lines until the field ends
        (quote characters come in pairs, so it ends after a line that makes their count even);
        the lines are not kept. A skipped line's own quotes cannot be counted."""
        while self.quotes % 2:
            try:
                _number, raw = next(self._lines)
            except StopIteration:
                return
            if raw is not None:
                self.quotes += raw.count(b'"')

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> str:
        number, raw = next(self._lines)
        if not self.start:
            self.start = number
        if raw is None:
            raise _TooLong
        self.quotes += raw.count(b'"')
        if self.used + content_length(raw) > self._max_bytes:
            raise _TooLong
        self.used += len(raw)
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            if self.bad is None:
                self.bad = _utf8_reason(exc)
            return raw.decode(errors="surrogateescape")


def _records(
    feed: _Feed, fmt: InputFormat, max_bytes: int
) -> Iterator[tuple[int, list[str] | None, str]]:
    """Yield ``(start line, fields, "")`` per record, or ``(start line, None, reason)``."""
    dialect = csv.excel if fmt is InputFormat.CSV else csv.excel_tab
    reader = csv.reader(feed, dialect)
    while True:
        feed.begin()
        try:
            fields = next(reader)
        except StopIteration:
            return
        except _TooLong:
            yield feed.start, None, f"longer than {size_text(max_bytes)}"
            feed.skip_quoted()
            reader = csv.reader(feed, dialect)
            continue
        except csv.Error as exc:
            yield feed.start, None, f"not valid {fmt.value.upper()}: {exc}"
            reader = csv.reader(feed, dialect)
            continue
        if not fields:
            continue  # a blank line
        if feed.bad is not None:
            yield feed.start, None, feed.bad
            continue
        yield feed.start, fields, ""


def _csv_rows(
    stream: BinaryIO, fmt: InputFormat, key: str | None, max_bytes: int, shown: str
) -> Iterator[Row | RowError]:
    if csv.field_size_limit() < max_bytes:
        csv.field_size_limit(max_bytes)  # process-wide: a field may be as long as a row
    records = _records(_Feed(physical_lines(stream, max_bytes), max_bytes), fmt, max_bytes)
    first = next(records, None)
    if first is None:
        return iter(())
    line, header, reason = first
    if header is None:
        raise UsageError(f"inputs file {shown}: line {line}: the header is {reason}")
    seen: set[str] = set()
    for column in header:
        if column in seen:
            raise UsageError(
                f"inputs file {shown}: line {line}: the column {column!r} is twice in the header"
            )
        seen.add(column)
    if key is not None and key not in seen:
        raise UsageError(
            f"inputs file {shown}: the key field {key!r} is not a column of the header "
            f"(line {line}: {', '.join(header)})"
        )
    return _csv_body(records, header, key)


def _csv_body(
    records: Iterator[tuple[int, list[str] | None, str]], header: list[str], key: str | None
) -> Iterator[Row | RowError]:
    width = len(header)
    for line, fields, reason in records:
        if fields is None:
            yield RowError(line, _line_key(key, line), reason)
        elif len(fields) != width:
            got = f"{len(fields)} field" + ("" if len(fields) == 1 else "s")
            yield RowError(line, _line_key(key, line), f"{got}, the header has {width}")
        else:
            yield _keyed(line, key, dict(zip(header, fields, strict=True)))


def _keyed(line: int, key: str | None, data: dict[str, Any]) -> Row | RowError:
    """The row, keyed by its line or by its ``key`` field; a bad key field fails the row."""
    if key is None:
        return Row(line, str(line), data)
    value = data.get(key)
    if isinstance(value, str):
        if value:
            return Row(line, value, data)
        return RowError(line, None, f"the key field {key!r} is empty")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Row(line, json.dumps(value), data)
    if key not in data:
        return RowError(line, None, f"no key field {key!r}")
    kind = _json_kind(value)
    return RowError(line, None, f"the key field {key!r} is {kind}, not a string or number")


def _line_key(key: str | None, line: int) -> str | None:
    return str(line) if key is None else None


def _utf8_reason(exc: UnicodeDecodeError) -> str:
    bad = exc.object[exc.start : exc.start + 1]
    return f"not valid UTF-8 (byte 0x{bad.hex()} at column {exc.start + 1})"


def _json_kind(value: object) -> str:
    """What a JSON value is, with its article: ``an array``, ``a number``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_LONG_DIGITS = re.compile(rb"[0-9]{19}")
"""Digits enough to be an integer past 64 bits."""

_STRICT_JSON = json.JSONDecoder(parse_constant=_refuse_constant)
"""The standard library's decoder, refusing NaN and Infinity as orjson does."""
