"""The four formats of an inputs file and how one is chosen: by name, by extension, by a sniff."""

from __future__ import annotations

import enum
import io
import os
import sys
from pathlib import PurePath

from clonefleet.errors import UsageError
from clonefleet.inputs._lines import MIB, STDIN, physical_lines

__all__ = ["InputFormat", "input_format"]

_SNIFF_BYTES = 64 * 1024


class InputFormat(enum.StrEnum):
    """The format of an inputs file: what one row is."""

    JSONL = "jsonl"
    """One JSON object a line (``.jsonl``, ``.ndjson``)."""
    CSV = "csv"
    """Comma-separated values with a header row (``.csv``)."""
    TSV = "tsv"
    """Tab-separated values with a header row (``.tsv``, ``.tab``)."""
    TEXT = "text"
    """One value a line (``.txt`` and any other name)."""


_BY_EXTENSION = {
    ".jsonl": InputFormat.JSONL,
    ".ndjson": InputFormat.JSONL,
    ".csv": InputFormat.CSV,
    ".tsv": InputFormat.TSV,
    ".tab": InputFormat.TSV,
}


def input_format(
    path: str | os.PathLike[str],
    explicit: str | None = None,
    *,
    content: str | os.PathLike[str] | None = None,
) -> InputFormat:
    """The format of the inputs file ``path``.

    ``explicit`` (the ``--inputs-format`` value) wins when given; a name that is not one of the
    four is a :class:`UsageError`. Otherwise the extension decides (``.jsonl``/``.ndjson``,
    ``.csv``, ``.tsv``/``.tab``; anything else is text). Standard input (``-``) has no extension:
    its first non-blank line is sniffed (``{`` starts JSONL, anything else is text), read from
    ``content`` (the spooled copy of standard input) when given, else peeked from standard input
    without consuming it.
    """
    if explicit is not None:
        try:
            return InputFormat(explicit.strip().lower())
        except ValueError:
            names = ", ".join(member.value for member in InputFormat)
            raise UsageError(f"unknown inputs format {explicit!r}; use one of {names}") from None
    if os.fspath(path) != STDIN:
        return _BY_EXTENSION.get(PurePath(os.fspath(path)).suffix.lower(), InputFormat.TEXT)
    if content is not None:
        with open(content, "rb") as stream:
            head = _first_text(stream.read(_SNIFF_BYTES))
    else:
        stdin = sys.stdin.buffer
        peek = getattr(stdin, "peek", None)  # a BufferedReader's; a plain stream has none
        head = _first_text(peek(_SNIFF_BYTES)[:_SNIFF_BYTES] if peek is not None else b"")
    return InputFormat.JSONL if head.startswith(b"{") else InputFormat.TEXT


def _first_text(head: bytes) -> bytes:
    """The first non-blank line of ``head``, stripped (empty when there is none)."""
    for _number, raw in physical_lines(io.BytesIO(head), MIB):
        if raw is None:
            return b""
        if raw.strip():
            return raw.strip()
    return b""
