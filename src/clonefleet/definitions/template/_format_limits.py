"""Bounds on ``%`` formatting and ``str.format``: the length of a result computed from the
value each conversion formats, before the C-level formatting runs."""

from __future__ import annotations

import re
import string
from _string import formatter_field_name_split  # type: ignore[import-not-found]
from collections.abc import Iterator
from typing import Any

from jinja2.exceptions import SecurityError

from clonefleet.definitions.template._limits import (
    MAX_FORMAT_FIELDS,
    MAX_OUTPUT_CHARS,
    MAX_WIDTH,
    TemplateLimitError,
    too_big,
)
from clonefleet.definitions.template._sizes import text_size

__all__ = [
    "check_format_call",
    "check_format_spec",
    "check_printf",
    "format_size",
    "printf_size",
]

_PRINTF = re.compile(
    r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])?", re.ASCII
)
_FLOAT_TEXT = 450
"""Longest text of a float without precision (``'{:,f}'.format(1e308)`` has 418 characters)."""


def _field_size(value: Any, conversion: str, width: int, precision: int | None) -> int:
    """At least the length of one ``%`` or ``{}`` conversion of ``value``."""
    if conversion in ("r", "a"):
        size = 10 * text_size(value, "a formatted value") + 2
    elif conversion == "c":
        size = 1
    elif isinstance(value, int):  # binary digits, with `_` or `,` grouping, are the longest
        size = 2 * value.bit_length() + 4 + (precision or 0)
    elif isinstance(value, float):
        size = _FLOAT_TEXT + (precision or 0)
    else:
        size = text_size(value, "a formatted value")
        if precision is not None:
            size = min(size, precision)
    return max(size, width)


def _number(digits: str | None, what: str) -> int | None:
    if digits is None:
        return None
    if digits == "*":
        raise SecurityError("`*` widths in % formatting are not allowed in templates")
    if len(digits) > 6 or int(digits) > MAX_WIDTH:
        raise TemplateLimitError(f"{what} {digits} is over the template limit of {MAX_WIDTH:,}")
    return int(digits)


def printf_size(fmt: str | bytes, values: Any = ()) -> int:
    """At least ``len(fmt % values)``, computed from each conversion's value without formatting.

    Raises:
        TemplateLimitError: a width or precision over :data:`MAX_WIDTH`, or too many conversions.
        SecurityError: a ``*`` width or a mapping key with parentheses.
    """
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    if text.count("%") > 2 * MAX_FORMAT_FIELDS:
        raise TemplateLimitError(
            f"a % format with over {MAX_FORMAT_FIELDS:,} conversions is over the template limit"
        )
    positional = values if isinstance(values, tuple) else (values,)
    total, index = len(text), 0
    for match in _PRINTF.finditer(text):
        key, width, precision, conversion = match.groups()
        if key is not None and "(" in key:
            raise SecurityError("parentheses in % format keys are not allowed in templates")
        w = _number(width, "% format width") or 0
        p = _number(precision, "% format precision")
        if conversion == "%" or conversion is None:
            continue
        if key is not None:
            value = _item(values, key)
        else:
            value = positional[index] if index < len(positional) else None
            index += 1
        total += _field_size(value, conversion, w, p)
    return total


def check_printf(fmt: str | bytes, values: Any = ()) -> None:
    """Bound ``fmt % values`` (the ``%`` operator and ``|format``) before it runs: widths and
    precisions are capped, ``*`` widths refused, and the result's length is computed from each
    conversion's value (:func:`printf_size`).

    Raises:
        TemplateLimitError: a width over :data:`MAX_WIDTH`, too many conversions, or a result
            that could pass :data:`MAX_OUTPUT_CHARS`.
        SecurityError: a ``*`` width.
    """
    size = printf_size(fmt, values)
    if size > MAX_OUTPUT_CHARS:
        raise too_big("a % formatted string", size)


def _item(container: Any, key: Any) -> Any:
    """``container[key]`` as formatting would look it up, or ``None`` (formatting then fails)."""
    try:
        return container[key]
    except Exception:  # noqa: BLE001 - the formatting itself reports it
        return None


def _field_value(field_name: str, args: tuple[Any, ...], kwargs: Any, auto: int) -> Any:
    """The object a ``str.format`` field converts (attributes and items resolved; only names
    the sandbox allows, so nothing runs that the format call itself would not)."""
    first, rest = formatter_field_name_split(field_name)
    if first == "":
        value = args[auto] if auto < len(args) else None
    elif isinstance(first, int):
        value = args[first] if first < len(args) else None
    else:
        value = _item(kwargs, first)
    for is_attr, key in rest:
        if value is None:
            break
        if is_attr:
            if not isinstance(key, str) or key.startswith("_"):
                return None
            value = getattr(value, key, None)
        else:
            value = _item(value, key)
    return value


def format_size(fmt: str, args: tuple[Any, ...], kwargs: Any) -> int:
    """At least ``len(fmt.format(*args, **kwargs))`` (or ``fmt.format_map(kwargs)``): a field
    may repeat an argument, so each field counts its own value.

    Raises:
        TemplateLimitError: a width over :data:`MAX_WIDTH`, or too many fields.
        SecurityError: nested replacement fields.
    """
    total, auto = len(fmt), 0
    for field_name, conversion, width, precision in _format_fields(fmt):
        value = _field_value(field_name, args, kwargs, auto)
        if field_name == "" or field_name[0] in ".[":
            auto += 1
        total += _field_size(value, conversion, width, precision)
    return total


def check_format_call(fmt: str, args: tuple[Any, ...], kwargs: Any) -> None:
    """Bound ``fmt.format(*args, **kwargs)`` before it runs (:func:`format_size`)."""
    size = format_size(fmt, args, kwargs)
    if size > MAX_OUTPUT_CHARS:
        raise too_big("a formatted string", size)


def check_format_spec(fmt: str) -> None:
    """Refuse nested replacement fields and widths over :data:`MAX_WIDTH` in ``fmt``."""
    for _ in _format_fields(fmt):
        pass


def _format_fields(fmt: str) -> Iterator[tuple[str, str, int, int | None]]:
    """(field name, conversion, width, precision) of each replacement field of ``fmt``."""
    if fmt.count("{") > 2 * MAX_FORMAT_FIELDS:
        raise TemplateLimitError(
            f"a format string with over {MAX_FORMAT_FIELDS:,} fields is over the template limit"
        )
    for _, field_name, spec, conversion in string.Formatter().parse(fmt):
        if field_name is None:
            continue
        spec = spec or ""
        if "{" in spec:
            raise SecurityError(
                "nested replacement fields in format specs are not allowed in templates"
            )
        numbers = [_number(d, "format width") for d in re.findall(r"\d+", spec)]
        precision = None
        if "." in spec:
            after = re.findall(r"\d+", spec.split(".", 1)[1])
            precision = _number(after[0], "format precision") if after else None
        width = max((n or 0 for n in numbers), default=0)
        kind = conversion or (spec[-1] if spec[-1:].isalpha() else "s")
        yield field_name, kind, width, precision
