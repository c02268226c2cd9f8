"""Bounds on the operators and built-in methods a template may use (``*``, ``**``, joins,
``str.replace``, padding, codecs, ``int.to_bytes``), checked from their operands before they run."""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import Any

from jinja2.exceptions import SecurityError

from clonefleet.definitions.template._limits import (
    MAX_INT_BITS,
    MAX_ITEMS,
    MAX_OUTPUT_CHARS,
    TEXT_CODECS,
    TemplateLimitError,
    too_big,
)
from clonefleet.definitions.template._render_budget import check_render
from clonefleet.definitions.template._sizes import charge, check_text, check_width, measure

__all__ = [
    "check_multiply",
    "check_power",
    "guard_method",
    "join_checked",
    "replace_size",
]

_ERROR_HANDLERS = frozenset({"strict", "ignore", "replace"})
"""Codec error handlers that never grow the output (``xmlcharrefreplace`` and friends do)."""

# Methods of str/bytes a template may call; the amplifying ones are checked in `guard_method`.
_STR_METHODS = frozenset(
    {
        "capitalize", "casefold", "center", "count", "endswith", "find", "index", "isalnum", "isalpha",
        "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable",
        "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "partition", "removeprefix",
        "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
        "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill", "decode", "encode",
    }
)  # fmt: skip


def replace_size(text: str | bytes, old: Any, new: Any, count: Any = -1) -> int:
    if not isinstance(old, (str, bytes)) or not isinstance(new, (str, bytes)):
        return len(text)
    hits = len(text) + 1 if not old else text.count(old)  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


def join_checked(separator: Any, items: Iterable[Any]) -> str:
    sep = str(check_text(separator, "a join separator"))
    parts: list[str] = []
    total = 0
    for i, item in enumerate(items):
        if not i & 255:
            check_render()
        text = item if isinstance(item, str) else str(check_text(item, "a joined value"))
        total += len(text) + (len(sep) if parts else 0)
        if total > MAX_OUTPUT_CHARS:
            raise too_big("a joined string", total)
        parts.append(text)
    joined = sep.join(parts)
    return joined if len(parts) == 1 else charge(joined)


def _codec(encoding: Any, errors: Any) -> None:
    if not isinstance(encoding, str) or len(encoding) > 40:
        raise SecurityError("encode() and decode() take the name of a text codec")
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise SecurityError(f"unknown codec {encoding!r}") from None
    if name not in TEXT_CODECS:
        raise SecurityError(
            f"the codec {encoding!r} is not allowed in templates; use one of: utf-8, ascii,"
            " latin-1, utf-16, utf-32"
        )
    if errors not in _ERROR_HANDLERS:
        raise SecurityError(
            f"the codec error handler {errors!r} is not allowed in templates;"
            " use strict, ignore or replace"
        )


def guard_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Check a call of a built-in method before it runs: str/bytes methods come from an
    allow-list, padding widths are capped, ``replace`` is sized, codecs must be plain text codecs,
    and ``int.to_bytes`` may not make more than the cap."""
    owner, name = method.__self__, method.__name__
    if name == "fromkeys":
        raise SecurityError("fromkeys() is not allowed in templates; use dict() of pairs")
    if isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if isinstance(length, int) and length > MAX_OUTPUT_CHARS:
            raise too_big("to_bytes()", length)
        return
    if not isinstance(owner, (str, bytes)):
        return
    if name not in _STR_METHODS:
        raise SecurityError(f"the string method {name!r} is not allowed in templates")
    if name in ("center", "ljust", "rjust", "zfill") and args:
        check_width(args[0], f"{name}() width")
    elif name == "replace" and len(args) >= 2:
        size = replace_size(owner, *args[:3])
        if size > MAX_OUTPUT_CHARS:
            raise too_big("replace() result", size)
    elif name in ("encode", "decode"):
        _codec(
            args[0] if args else kwargs.get("encoding", "utf-8"),
            args[1] if len(args) > 1 else kwargs.get("errors", "strict"),
        )


def check_multiply(left: Any, right: Any) -> None:
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, (str, bytes)) and isinstance(times, int):
            size = len(seq) * max(times, 0)
            if size > MAX_OUTPUT_CHARS:
                raise too_big("a repeated sequence", size)
            return
        if isinstance(seq, (list, tuple)) and isinstance(times, int):
            if times > 0:
                measure(
                    seq,
                    "a repeated list",
                    MAX_OUTPUT_CHARS // times,
                    MAX_ITEMS // times,
                )
            return
    if isinstance(left, int) and isinstance(right, int):
        bits = left.bit_length() + right.bit_length()
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(
                f"a product of about {bits:,} bits is over the template limit of {MAX_INT_BITS:,}"
            )


def check_power(base: Any, exponent: Any) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        bits = base.bit_length() * exponent
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(
                f"a power of about {bits:,} bits is over the template limit of {MAX_INT_BITS:,}"
            )
