"""The records of a results file, read as bytes in one pass: one physical line per record in
JSONL, one or more in CSV (a quoted field may hold line breaks), each with its line number and
byte offset, and whether it ended with a line break (a record that did not is a torn tail, or a
last line someone saved without one)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["MAX_RECORD_BYTES", "Piece", "pieces"]

MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The longest record a results file is read with; a longer one is skipped as bad, and at most
this much of it is held in memory."""

_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Piece:
    """One record's bytes in a results file, as read."""

    line: int
    """The 1-based number of the record's first line."""
    offset: int
    """The byte offset of its first byte."""
    data: bytes
    """Its bytes without the final line break; empty when :attr:`overlong`."""
    terminated: bool
    """Whether a line break ended it (the last record of a torn file has none)."""
    overlong: bool = False
    """It was longer than the limit and was skipped unread."""


def pieces(f: BinaryIO, *, csv: bool, limit: int = MAX_RECORD_BYTES) -> Iterator[Piece]:
    """The records of ``f`` from its current position, holding at most ``limit`` + 1 bytes of
    one record at a time.

    In CSV a record goes on over line breaks while its count of ``"`` is odd (inside a quoted
    field, since quotes inside one are doubled).
    """
    line, offset = 1, 0
    while True:
        start_line, start, buf, quotes, overlong = line, offset, bytearray(), 0, False
        terminated = False
        while True:
            room = limit + 1 - len(buf) if not overlong else _CHUNK
            chunk = f.readline(max(room, 1))
            if not chunk:
                break
            offset += len(chunk)
            ended = chunk.endswith(b"\n")
            if overlong:
                pass  # skipping to the record's end
            elif len(buf) + len(chunk) > limit + (1 if ended else 0):
                overlong, buf = True, bytearray()
            else:
                buf += chunk
                if csv:
                    quotes += chunk.count(b'"')
            if ended:
                line += 1
                if csv and quotes % 2 and not overlong:
                    continue  # a line break inside a quoted field
                terminated = True
                break
        if not terminated and not buf and not overlong:
            return  # the end of the file
        data = b"" if overlong else bytes(buf[:-1] if terminated else buf)
        if data.endswith(b"\r") and terminated:
            data = data[:-1]
        yield Piece(start_line, start, data, terminated, overlong)
        if not terminated:
            return
