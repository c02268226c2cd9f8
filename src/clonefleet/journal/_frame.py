"""One journal record on disk: the frame around a msgpack map, and the checks that read it back.

This module only turns records into bytes and bytes into records; it knows nothing of files,
folders or what a record means. Decoding never trusts the bytes: every size, the checksum, the
msgpack limits and the nesting depth are checked, and the first problem ends the decoding with a
:class:`Damage` instead of an exception.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any, cast

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type hints

from clonefleet.errors import JournalError

__all__ = ["DEFAULT_LIMITS", "HEADER_BYTES", "MAGIC", "Damage", "Limits"]
__all__ += ["decode_records", "encode_record"]

MAGIC = b"CFJ1"
"""The four bytes that open every record."""

_HEADER = struct.Struct(">4sII")
HEADER_BYTES = _HEADER.size
"""Magic, payload length and CRC32 of the payload: 12 bytes, big-endian."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The most a record may hold; a record past any limit is refused on write and damage on read.

    The defaults admit any record the scheduler writes and bound what a hostile or corrupt file
    can make the reader allocate.
    """

    max_record_bytes: int = 64 << 20
    """Largest msgpack payload of one record, in bytes (the frame header not counted)."""
    max_str_len: int = 64 << 20
    """Longest string, in UTF-8 bytes."""
    max_bin_len: int = 64 << 20
    """Longest byte string, in bytes."""
    max_array_len: int = 1_000_000
    """Most items in one array."""
    max_map_len: int = 1_000_000
    """Most keys in one map."""
    max_depth: int = 64
    """Deepest nesting of maps and arrays; the record's own map is depth 1."""


DEFAULT_LIMITS = Limits()
"""The limits used when none are given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Damage:
    """Bytes that could not be read as records; nothing from ``offset`` on in that file was used."""

    path: str
    """The file (``"?"`` when decoding bytes that came from no named file)."""
    offset: int
    """Byte offset of the start of the bad record: where the good data ends."""
    reason: str
    """What was wrong, in words (``"checksum mismatch"``, ``"torn tail: ..."``)."""

    def __str__(self) -> str:
        return f"{self.path}: offset {self.offset}: {self.reason}"


_CONTAINERS = (dict, list, tuple)


def _shape_problem(record: object, max_depth: int) -> str | None:
    """Why ``record`` is not a map of string keys nested at most ``max_depth`` deep, or ``None``.

    Iterative, with the depth bound checked before descending, so hostile nesting (or a cycle in
    a caller's object) costs at most ``max_depth`` levels and never recursion.
    """
    if not isinstance(record, dict):
        return "record is not a map"
    stack: list[tuple[Any, int]] = [(record, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return f"nesting deeper than {max_depth}"
        if isinstance(node, dict):
            # Written out (no generators, exact-type test first): this runs on every append.
            for key in node:
                if key.__class__ is not str and not isinstance(key, str):
                    return "non-string map key"
            node = node.values()
        for value in node:
            if isinstance(value, _CONTAINERS):
                stack.append((value, depth + 1))  # noqa: PERF401 - a loop is faster here
    return None


def _unpack(payload: bytes | memoryview, limits: Limits) -> dict[str, Any] | str:
    """The record in ``payload``, or the reason it is not one."""
    record, failure = _unpack_within(payload, limits)
    if failure is not None:
        return failure
    problem = _shape_problem(record, limits.max_depth)
    if problem is not None:
        return problem
    return cast(dict[str, Any], record)


def _unpack_within(payload: bytes | memoryview, limits: Limits) -> tuple[Any, str | None]:
    """What msgpack reads from ``payload`` under ``limits`` and ``None``, or ``None`` and the
    reason it cannot; the value's shape is not checked."""
    try:
        record: Any = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,
        )
    except msgpack.StackError:
        return None, f"nesting deeper than {limits.max_depth}"
    except Exception as exc:  # msgpack raises ValueError, TypeError, UnicodeDecodeError, ...
        text = f"{type(exc).__name__}: {exc}"
        if "map key" in str(exc):
            return None, f"non-string map key ({text})"
        return None, f"undecodable msgpack: {text}"
    return record, None


def encode_record(record: dict[str, Any], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Frame one record: magic, payload length, CRC32 of the payload, then the msgpack payload.

    Anything this returns reads back with :func:`decode_records` under the same limits.

    Args:
        record: a map with string keys; values are what msgpack packs (None, bool, int, float,
            str, bytes, lists, tuples and maps with string keys).
        limits: the limits the record must fit.

    Raises:
        JournalError: the record is not a map of string keys, nests too deep, holds a value
            msgpack cannot pack, or is larger than a limit allows.
    """
    problem = _shape_problem(record, limits.max_depth)
    if problem is not None:
        raise JournalError(f"cannot journal this record: {problem}")
    try:
        payload: bytes = msgpack.packb(record, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise JournalError(f"cannot journal this record: {exc}") from exc
    if len(payload) > limits.max_record_bytes:
        raise JournalError(
            f"cannot journal this record: {len(payload)} bytes exceeds the limit of "
            f"{limits.max_record_bytes}"
        )
    # A string, byte string, array or map needs at least one payload byte per byte or item, so a
    # payload smaller than every such limit cannot break one; only larger ones are read back.
    if len(payload) > min(
        limits.max_str_len, limits.max_bin_len, limits.max_array_len, limits.max_map_len
    ):
        # The shape was checked above: only msgpack's own limits are left to check.
        _, failure = _unpack_within(payload, limits)
        if failure is not None:
            raise JournalError(f"cannot journal this record: {failure}")
    return _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def _frame_problem(view: memoryview, at: int, limits: Limits) -> tuple[int, str | None]:
    """The payload length of the frame at ``at`` and what is wrong with its header, if anything."""
    left = len(view) - at
    if left < HEADER_BYTES:
        return 0, f"torn tail: record header needs {HEADER_BYTES} bytes, {left} left"
    magic, length, crc = _HEADER.unpack_from(view, at)
    if magic != MAGIC:
        return 0, f"bad magic {bytes(magic)!r}"
    if length > limits.max_record_bytes:
        return 0, f"record length {length} exceeds limit {limits.max_record_bytes}"
    if HEADER_BYTES + length > left:
        return 0, f"torn tail: record needs {HEADER_BYTES + length} bytes, {left} left"
    start = at + HEADER_BYTES
    if zlib.crc32(view[start : start + length]) != crc:
        return 0, "checksum mismatch"
    return length, None


def decode_records(
    data: bytes, *, path: str = "?", limits: Limits = DEFAULT_LIMITS
) -> tuple[list[dict[str, Any]], Damage | None, int]:
    """Read the records framed in ``data``, in order, up to the first damage.

    Never raises for bad bytes: a bad header, a length over the limit, a torn tail, a checksum
    mismatch, msgpack that does not unpack within the limits, nesting deeper than
    ``limits.max_depth`` and a top level that is not a map of string keys all end the reading
    with a :class:`Damage` at the start of the bad record.

    Args:
        data: the bytes of a journal file (or any part of one that starts at a record).
        path: the file name to put in the damage report.
        limits: the limits each record must fit.

    Returns:
        The records read, the first damage met (``None`` when all of ``data`` was read), and the
        offset where good data ends (``len(data)`` when there was no damage).
    """
    view = memoryview(data)
    records: list[dict[str, Any]] = []
    at = 0
    while at < len(view):
        length, problem = _frame_problem(view, at, limits)
        if problem is None:
            start = at + HEADER_BYTES
            decoded = _unpack(view[start : start + length], limits)
            if isinstance(decoded, dict):
                records.append(decoded)
                at = start + length
                continue
            problem = decoded
        return records, Damage(path=path, offset=at, reason=problem), at
    return records, None, at
