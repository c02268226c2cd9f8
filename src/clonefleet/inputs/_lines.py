"""Physical lines of an inputs file, read in binary with a bound on each line's length.

A line longer than the bound is reported as too long and the rest of it is skipped in bounded
reads, so a 100 MB line costs no more memory than the bound. Nothing here decodes text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["MIB", "STDIN", "content_length", "physical_lines", "size_text"]

MIB = 1 << 20
"""One mebibyte: the default bound on a row."""

STDIN = "-"
"""The path that means standard input."""

_BOM = b"\xef\xbb\xbf"
_SKIP_BYTES = 64 * 1024


def physical_lines(stream: BinaryIO, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """Yield ``(line number, raw bytes)`` for each line of ``stream``, numbered from 1.

    The raw bytes keep their ``\\n`` (and ``\\r``) ending. A line whose text (without its ending)
    is longer than ``max_bytes`` is yielded as ``None`` and its remainder skipped without being
    kept. A UTF-8 byte-order mark at the start of the first line is dropped.
    """
    cap = max_bytes + 2  # room for "\r\n" after a line of exactly max_bytes
    number = 0
    while True:
        raw = stream.readline(cap)
        if not raw:
            return
        number += 1
        if len(raw) == cap and not raw.endswith(b"\n"):
            while True:
                more = stream.readline(_SKIP_BYTES)
                if not more or more.endswith(b"\n"):
                    break
            yield number, None
            continue
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        short = len(raw) <= max_bytes or content_length(raw) <= max_bytes
        yield number, (raw if short else None)


def content_length(raw: bytes) -> int:
    """The length of a raw line without its ``\\n`` or ``\\r\\n`` ending."""
    size = len(raw)
    if raw.endswith(b"\n"):
        size -= 2 if raw.endswith(b"\r\n") else 1
    return size


def size_text(size: int) -> str:
    """A byte count in plain words: ``1 MiB``, ``64 KiB`` or ``1000 bytes``."""
    if size % MIB == 0:
        return f"{size // MIB} MiB"
    if size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} bytes"
