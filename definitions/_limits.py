"""The caps a template render runs under, and the checks the guarded sandbox enforces them with.

A template is untrusted input that runs on the host rendering a whole batch, so its work and
memory are bounded: a wall-clock :class:`Budget` per render (held in a context variable, checked by
loops, calls and joins), and size checks that refuse an oversized string, list, number or format
width *before* it is built. ``_sandbox`` wires these checks into Jinja2; ``_render`` sets the
budget and counts output characters.
"""

from __future__ import annotations

import contextvars
import re
import string
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from jinja2.exceptions import SecurityError

__all__ = [
    "MAX_INT_BITS",
    "MAX_OUTPUT_CHARS",
    "MAX_RANGE",
    "MAX_WIDTH",
    "RENDER_TIMEOUT_S",
    "Budget",
    "TemplateLimitError",
    "check_budget",
    "check_format_spec",
    "check_len",
    "check_multiply",
    "check_power",
    "check_printf",
    "check_width",
    "current_budget",
    "deep_size",
    "guard_str_method",
    "join_checked",
    "replace_size",
    "reset_budget",
    "set_budget",
    "too_big",
]

MAX_OUTPUT_CHARS = 1 << 20
"""Largest rendered text, and largest string or list a template may build (1 MiB)."""
MAX_RANGE = 10_000
"""Longest ``range()`` a template may create."""
MAX_INT_BITS = 65_536
"""Largest integer (in bits) ``*`` and ``**`` may produce."""
MAX_WIDTH = 10_000
"""Largest padding width or precision in format specs and width-like filter arguments."""
RENDER_TIMEOUT_S = 0.5
"""Wall-clock budget of one template render, in seconds."""

# Methods of str/bytes a template may call; the amplifying ones are checked in `_guard_str_method`.
_STR_METHODS = frozenset(
    {
        "capitalize", "casefold", "center", "count", "endswith", "find", "index", "isalnum", "isalpha",
        "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable",
        "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "partition", "removeprefix",
        "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
        "splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill", "decode", "encode",
    }
)  # fmt: skip
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


_T = TypeVar("_T")


class TemplateLimitError(Exception):
    """A template went over a time, size or work cap (turned into ``TemplateError`` by callers)."""


@dataclass(slots=True)
class Budget:
    """The deadline of the render in progress."""

    deadline: float
    clock: Callable[[], float] = time.monotonic

    def check(self) -> None:
        if self.clock() > self.deadline:
            raise TemplateLimitError(
                "rendering took longer than its time budget (a loop or recursion too large?)"
            )


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "clonefleet_template_budget", default=None
)


def check_budget() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.check()


def too_big(what: str, size: int, cap: int = MAX_OUTPUT_CHARS) -> TemplateLimitError:
    return TemplateLimitError(f"{what} would be {size:,} long, over the template limit of {cap:,}")


def deep_size(value: Any, what: str, limit: int = MAX_OUTPUT_CHARS) -> int:
    """Size of ``value`` counting shared references every time (as ``str()`` would see it).

    Raises ``TemplateLimitError`` as soon as the count passes ``limit``, so the walk itself is
    bounded even for a structure that nests shared lists a thousand-fold per level.
    """
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item) + 1
        elif isinstance(item, int):
            total += 1 + item.bit_length() // 3
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 1
            stack.extend(item)
        elif isinstance(item, dict):
            total += 1
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += 1
        if total > limit:
            raise TemplateLimitError(
                f"{what} is over the template size limit of {MAX_OUTPUT_CHARS:,}"
            )
    return total


def check_len(value: _T, what: str) -> _T:
    """Reject a string over the cap, or a container whose full (shared-counted) size is."""
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_OUTPUT_CHARS:
            raise too_big(what, len(value))
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        deep_size(value, what)
    return value


def check_width(value: Any, what: str) -> None:
    if isinstance(value, int) and value > MAX_WIDTH:
        raise TemplateLimitError(f"{what} {value:,} is over the template limit of {MAX_WIDTH:,}")


def check_printf(fmt: str) -> None:
    for match in _PRINTF.finditer(fmt):
        for group in match.groups():
            if group == "*":
                raise SecurityError("`*` widths in % formatting are not allowed in templates")
            if group and (len(group) > 6 or int(group) > MAX_WIDTH):
                raise TemplateLimitError(
                    f"% format width {group} is over the template limit of {MAX_WIDTH:,}"
                )


def check_format_spec(fmt: str) -> None:
    for _, field_name, spec, _ in string.Formatter().parse(fmt):
        if field_name is None or not spec:
            continue
        if "{" in spec:
            raise SecurityError(
                "nested replacement fields in format specs are not allowed in templates"
            )
        for digits in re.findall(r"\d+", spec):
            if len(digits) > 6 or int(digits) > MAX_WIDTH:
                raise TemplateLimitError(
                    f"format width {digits} is over the template limit of {MAX_WIDTH:,}"
                )


def replace_size(text: str | bytes, old: Any, new: Any, count: Any = -1) -> int:
    if not isinstance(old, (str, bytes)) or not isinstance(new, (str, bytes)):
        return len(text)
    hits = len(text) + 1 if not old else text.count(old)  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


def join_checked(separator: Any, items: Iterable[Any]) -> str:
    sep = str(separator)
    parts: list[str] = []
    total = 0
    for i, item in enumerate(items):
        if not i & 255:
            check_budget()
        text = item if isinstance(item, str) else str(check_len(item, "a joined value"))
        total += len(text) + (len(sep) if parts else 0)
        if total > MAX_OUTPUT_CHARS:
            raise too_big("a joined string", total)
        parts.append(text)
    return sep.join(parts)


def guard_str_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    owner, name = method.__self__, method.__name__
    if name not in _STR_METHODS:
        raise SecurityError(f"the string method {name!r} is not allowed in templates")
    if name in ("center", "ljust", "rjust", "zfill") and args:
        check_width(args[0], f"{name}() width")
    elif name == "replace" and len(args) >= 2:
        size = replace_size(owner, *args[:3])
        if size > MAX_OUTPUT_CHARS:
            raise too_big("replace() result", size)


def check_multiply(left: Any, right: Any) -> None:
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, (str, bytes)) and isinstance(times, int):
            size = len(seq) * max(times, 0)
            if size > MAX_OUTPUT_CHARS:
                raise too_big("a repeated sequence", size)
            return
        if isinstance(seq, (list, tuple)) and isinstance(times, int):
            if times > 0:
                deep_size(seq, "a repeated list", MAX_OUTPUT_CHARS // times)
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


def set_budget(budget: Budget | None) -> contextvars.Token[Budget | None]:
    """Install the deadline for the render in progress; reset with the returned token."""
    return _BUDGET.set(budget)


def reset_budget(token: contextvars.Token[Budget | None]) -> None:
    _BUDGET.reset(token)


def current_budget() -> Budget | None:
    """The deadline of the render in progress in this context, if any."""
    return _BUDGET.get()
