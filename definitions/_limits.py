"""The caps a template render runs under, and the checks the guarded sandbox enforces them with.

A template is untrusted input (a nested spawn's prompt is written by a model), so its work and
memory are bounded. Two kinds of check do it:

* **Between operations**: a wall-clock :class:`Budget` per render, held in a context variable and
  checked by every loop iteration, call, filter, attribute or item access, comparison and join.
  The budget also counts the bytes of every value the render's operations make
  (:func:`charge`) and stops the render past :data:`MAX_RENDER_MEMORY` (so values kept in
  variables cannot pile up), and it samples the process's resident memory every couple of
  milliseconds as a second net.
* **Before each operation**: one C-level call (``str.replace``, ``%``, ``==``, ``sorted``, an
  encoder...) cannot be interrupted, so its worst case is computed from its operands' sizes
  *before* it runs, and an operation that could produce more than :data:`MAX_OUTPUT_CHARS`
  characters, hold more than :data:`MAX_ITEMS` objects or take superlinear time is refused. Every
  value a template holds stays within these caps (each is checked where it is made), so the
  worst case of every operation on them is a linear pass over a few MiB.

``_sandbox`` wires these checks into Jinja2; ``_render`` sets the budget and counts output.
"""

from __future__ import annotations

import codecs
import contextvars
import os
import re
import string
import sys
import time
from _string import formatter_field_name_split  # type: ignore[import-not-found]
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from jinja2.exceptions import SecurityError
from jinja2.utils import Cycler

__all__ = [
    "MAX_DICT_LITERAL",
    "MAX_FORMAT_FIELDS",
    "MAX_HASH_COLLISIONS",
    "MAX_INT_BITS",
    "MAX_ITEMS",
    "MAX_OUTPUT_CHARS",
    "MAX_RANGE",
    "MAX_RENDER_MEMORY",
    "MAX_SLOW_TEXT_CHARS",
    "MAX_WIDTH",
    "RENDER_TIMEOUT_S",
    "TEXT_CODECS",
    "Budget",
    "Size",
    "TemplateLimitError",
    "bounded_iterable",
    "charge",
    "charge_shell",
    "check_budget",
    "check_comparable",
    "check_format_call",
    "check_format_spec",
    "check_keys",
    "check_len",
    "check_multiply",
    "check_power",
    "check_printf",
    "check_text",
    "check_width",
    "current_budget",
    "deep_size",
    "format_size",
    "guard_method",
    "join_checked",
    "measure",
    "printf_size",
    "replace_size",
    "reset_budget",
    "resident_bytes",
    "set_budget",
    "text_size",
    "too_big",
]

MAX_OUTPUT_CHARS = 1 << 20
"""Largest rendered text, and largest string or list a template may build (1 MiB)."""
MAX_ITEMS = 100_000
"""Most objects one list, tuple or dict a template holds may contain (all levels, a shared
reference counted each time), and most items a filter may iterate (a string counts its
characters): filters do per-item work in Python that no deadline check can interrupt."""
MAX_RANGE = 10_000
"""Longest ``range()`` a template may create."""
MAX_INT_BITS = 65_536
"""Largest integer (in bits) ``*`` and ``**`` may produce."""
MAX_WIDTH = 10_000
"""Largest padding width or precision in format specs and width-like filter arguments."""
MAX_FORMAT_FIELDS = 10_000
"""Most conversions in one ``%`` or ``str.format`` format string."""
MAX_SLOW_TEXT_CHARS = 64 * 1024
"""Longest text ``wordwrap`` takes (``textwrap`` works word by word in Python)."""
MAX_HASH_COLLISIONS = 256
"""Most keys of one dict, or items of one ``|unique``, that may share a hash value: integers
that differ by a multiple of 2**61 - 1 share one, and a hash table of n such keys takes n² steps
to build."""
MAX_DICT_LITERAL = 1_000
"""Most entries one dict literal in a template may have."""
MAX_RENDER_MEMORY = 64 << 20
"""Most bytes the values one render makes may add up to (counted as they are made, never given
back), and most the process's resident memory may grow during one render."""
MEMORY_SAMPLE_S = 0.002
"""How often (at most) a render's budget check reads the process's resident memory."""
RENDER_TIMEOUT_S = 0.5
"""Wall-clock budget of one template render, in seconds."""

TEXT_CODECS = frozenset(
    {
        "utf-8", "utf-8-sig", "ascii", "latin-1", "iso8859-1", "cp1252",
        "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be",
    }
)  # fmt: skip
"""The codecs ``encode``/``decode`` may name: plain text codecs, linear and at most four bytes a
character. Others are refused: ``punycode`` and ``idna`` take quadratic time, the escaping codecs
multiply the size tenfold."""
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
_PRINTF = re.compile(
    r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])?", re.ASCII
)
_FLOAT_TEXT = 450
"""Longest text of a float without precision (``'{:,f}'.format(1e308)`` has 418 characters)."""
_OTHER_TEXT = 256
"""Assumed longest ``str()`` of an object that is not a string, number or container (jinja2's
loop, cycler, namespace and macro objects, clone info, iterators)."""
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()))
_CONTAINERS = (list, tuple, set, frozenset, dict, Cycler, *_VIEWS)
_SCALARS = (str, bytes, int, float, type(None))
_CACHED_LEN = 64
"""Containers at least this long have their size remembered for the rest of the render."""


_T = TypeVar("_T")


class TemplateLimitError(Exception):
    """A template went over a time, size or work cap (turned into ``TemplateError`` by callers)."""


# ---- the budget --------------------------------------------------------------------------------


_STATM: dict[int, int] = {}
"""Per process id, an open descriptor of ``/proc/self/statm`` (reopened after a fork)."""


def resident_bytes() -> int:
    """The process's resident memory in bytes, or ``-1`` where it cannot be read (not Linux)."""
    pid = os.getpid()
    fd = _STATM.get(pid)
    try:
        if fd is None:
            _STATM.clear()
            fd = _STATM[pid] = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return -1


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(slots=True)
class Budget:
    """The deadline and memory allowance of the render in progress."""

    deadline: float
    clock: Callable[[], float] = time.monotonic
    memory_limit: int = MAX_RENDER_MEMORY
    baseline: int = -1
    """Resident memory when the render started (``-1``: not measured)."""
    next_sample: float = 0.0
    sizes: dict[int, tuple[Any, Size]] = field(default_factory=dict)
    """Sizes of the large containers measured last, by ``id`` (the object is kept alive, and
    the sandbox lets no template mutate a container); see :meth:`remember`."""
    remembered: int = 0
    """Objects held by the containers in :attr:`sizes`."""
    allocated: int = 0
    """Bytes of the values made so far (:func:`charge`)."""

    def __post_init__(self) -> None:
        self.baseline = resident_bytes()

    def check(self) -> None:
        now = self.clock()
        if now > self.deadline:
            raise TemplateLimitError(
                "rendering took longer than its time budget (a loop or recursion too large?)"
            )
        if now >= self.next_sample and self.baseline >= 0:
            self.next_sample = now + MEMORY_SAMPLE_S
            grown = resident_bytes() - self.baseline
            if grown > self.memory_limit:
                raise TemplateLimitError(
                    f"rendering grew the process's memory by {grown >> 20:,} MiB, over the"
                    f" template limit of {self.memory_limit >> 20:,} MiB"
                )

    def remember(self, value: Any, size: Size) -> None:
        """Keep ``value``'s size for the rest of the render, dropping the oldest sizes so that the
        containers kept alive hold at most twice :data:`MAX_ITEMS` objects."""
        while self.sizes and self.remembered + size.objects > 2 * MAX_ITEMS:
            oldest = next(iter(self.sizes))
            self.remembered -= self.sizes.pop(oldest)[1].objects
        self.sizes[id(value)] = (value, size)
        self.remembered += size.objects


    def charge(self, size: int) -> None:
        self.allocated += size
        if self.allocated > self.memory_limit:
            raise TemplateLimitError(
                f"rendering made values of over {self.memory_limit >> 20:,} MiB in all, the"
                " template limit"
            )


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "clonefleet_template_budget", default=None
)


def check_budget() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.check()


def set_budget(budget: Budget | None) -> contextvars.Token[Budget | None]:
    """Install the deadline for the render in progress; reset with the returned token."""
    return _BUDGET.set(budget)


def reset_budget(token: contextvars.Token[Budget | None]) -> None:
    _BUDGET.reset(token)


def current_budget() -> Budget | None:
    """The deadline of the render in progress in this context, if any."""
    return _BUDGET.get()


# ---- sizes -------------------------------------------------------------------------------------


def too_big(what: str, size: int, cap: int = MAX_OUTPUT_CHARS) -> TemplateLimitError:
    return TemplateLimitError(f"{what} would be {size:,} long, over the template limit of {cap:,}")


class Size(NamedTuple):
    """What :func:`measure` found."""

    units: int
    """Characters of every string plus one per object: the size caps count these."""
    objects: int
    """Objects, a shared reference counted each time."""
    text: int
    """At least the length of ``str()`` of the value."""


def _repr_len(s: str | bytes) -> int:
    """At least ``len(repr(s))``: printable text may double (quotes, backslashes), the rest may
    become ``\\U0001f600``-style escapes."""
    if isinstance(s, bytes):
        return 4 * len(s) + 3
    return 2 * len(s) + 2 if s.isprintable() else 10 * len(s) + 2


def _scalar(item: Any, nested: bool) -> tuple[int, int]:
    """(units, text) of one non-container."""
    if isinstance(item, str):
        return len(item) + 1, _repr_len(item) if nested else len(item)
    if isinstance(item, bytes):
        return len(item) + 1, _repr_len(item)
    if isinstance(item, int):
        digits = item.bit_length() // 3 + 2
        return 1 + item.bit_length() // 3, digits
    if isinstance(item, float) or item is None:
        return 1, 26
    return 1, _OTHER_TEXT


def _members(item: Any) -> list[Any]:
    if isinstance(item, dict):
        return [*item.keys(), *item.values()]
    if isinstance(item, Cycler):
        return list(item.items)
    return item if isinstance(item, list) else list(item)


def _length(item: Any) -> int:
    return len(item.items) if isinstance(item, Cycler) else len(item)


def _over(what: str, units: int, objects: int, limit: int, max_objects: int) -> None:
    if units > limit:
        raise TemplateLimitError(f"{what} is over the template size limit of {MAX_OUTPUT_CHARS:,}")
    if objects > max_objects:
        raise TemplateLimitError(f"{what} holds over {MAX_ITEMS:,} objects, the template limit")


def measure(
    value: Any, what: str, limit: int = MAX_OUTPUT_CHARS, max_objects: int = MAX_ITEMS
) -> Size:
    """Size of ``value`` counting shared references every time (as ``str()`` would see it).

    Raises ``TemplateLimitError`` as soon as the characters pass ``limit`` or the objects pass
    ``max_objects``, so the walk itself is bounded even for a structure that nests shared lists a
    thousand-fold per level. Lists of only strings or only integers are measured with C-level
    passes; a large container's size is remembered for the rest of the render (the sandbox lets
    no template change a container).
    """
    if not isinstance(value, _CONTAINERS):
        units, text = _scalar(value, nested=False)
        if units > limit:
            raise too_big(what, units - 1, limit)
        return Size(units, 1, text)
    budget = _BUDGET.get()
    cache = budget.sizes if budget is not None else None
    units = objects = text = 0
    stack = [value]
    while stack:
        item = stack.pop()
        hit = cache.get(id(item)) if cache is not None else None
        if hit is not None and hit[0] is item:
            units, objects, text = (
                units + hit[1].units,
                objects + hit[1].objects,
                text + hit[1].text,
            )
        elif item is not value and cache is not None and _length(item) >= _CACHED_LEN:
            # Measured on its own, so that its size is remembered.
            sub = measure(item, what, limit - units, max_objects - objects)
            units, objects, text = units + sub.units, objects + sub.objects, text + sub.text
        else:
            if budget is not None:
                budget.check()
            members = _members(item)
            units, objects = units + 1, objects + 1 + len(members)
            text += 2 + 4 * len(members)
            kinds = set(map(type, members))
            if kinds <= {str}:
                chars = sum(map(len, members))
                units += chars + len(members)
                text += 2 * chars if all(map(str.isprintable, members)) else 10 * chars
            elif kinds <= {int, bool}:
                bits = sum(map(int.bit_length, members)) // 3
                units, text = units + len(members) + bits, text + bits + 2 * len(members)
            else:
                for member in members:
                    if isinstance(member, _CONTAINERS):
                        stack.append(member)
                        objects -= 1  # counted again when it is walked
                    else:
                        u, t = _scalar(member, nested=True)
                        units, text = units + u, text + t
        _over(what, units, objects, limit, max_objects)
    size = Size(units, objects, text)
    if budget is not None and _length(value) >= _CACHED_LEN and id(value) not in budget.sizes:
        budget.remember(value, size)
    return size


def deep_size(value: Any, what: str, limit: int = MAX_OUTPUT_CHARS) -> int:
    """Characters of ``value`` plus one per object (see :func:`measure`)."""
    return measure(value, what, limit).units


def charge(value: _T, sources: tuple[Any, ...] = ()) -> _T:
    """Count a value an operation made against the render's memory allowance (a string's bytes;
    a container's own and its items'; nothing when it is one of ``sources``, the operands, as
    when ``s[:]`` returns ``s``).

    Raises:
        TemplateLimitError: the render's values add up past :data:`MAX_RENDER_MEMORY`.
    """
    budget = _BUDGET.get()
    if budget is None or any(value is source for source in sources):
        return value
    if isinstance(value, (str, bytes)):
        budget.charge(sys.getsizeof(value))
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        members = _members(value)
        budget.charge(sys.getsizeof(value) + sum(map(sys.getsizeof, members)))
    return value


def charge_shell(value: _T) -> _T:
    """Count a container a literal made, without its items (they were counted where made)."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.charge(sys.getsizeof(value))
    return value


def check_len(value: _T, what: str) -> _T:
    """Reject a string over the cap, or a container whose full (shared-counted) size or object
    count is."""
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_OUTPUT_CHARS:
            raise too_big(what, len(value))
    elif isinstance(value, _CONTAINERS):
        measure(value, what)
    return value


def text_size(value: Any, what: str = "a value") -> int:
    """At least ``len(str(value))``, found without building the text."""
    if isinstance(value, str):
        return len(value)
    return measure(value, what).text


def check_text(value: _T, what: str) -> _T:
    """Reject a value whose text (``str(value)``) could be over the cap, before making it."""
    size = text_size(value, what)
    if size > MAX_OUTPUT_CHARS:
        raise TemplateLimitError(
            f"{what} as text could be {size:,} long, over the template limit of {MAX_OUTPUT_CHARS:,}"
        )
    return value


def check_keys(keys: Iterable[Any], what: str) -> None:
    """Refuse keys of which more than :data:`MAX_HASH_COLLISIONS` share one hash value, before a
    hash table is built from them (hash values are small integers: counting them never collides)."""
    counts = Counter(map(hash, keys))
    if counts and max(counts.values()) > MAX_HASH_COLLISIONS:
        raise TemplateLimitError(
            f"{what} has over {MAX_HASH_COLLISIONS:,} keys with one hash value (a hash table of them"
            " would take quadratic time)"
        )


def check_width(value: Any, what: str) -> None:
    if isinstance(value, int) and value > MAX_WIDTH:
        raise TemplateLimitError(f"{what} {value:,} is over the template limit of {MAX_WIDTH:,}")


def check_comparable(left: Any, right: Any) -> None:
    """Bound a comparison (``==``, ``<``, ``in``...) before it runs: comparing containers walks
    them in C, so both must be within the caps (strings and numbers always are)."""
    for side in (left, right):
        if not isinstance(side, _SCALARS):
            check_len(side, "a compared value")


def bounded_iterable(value: Any, what: str) -> Any:
    """The input of a filter that iterates it: a string of at most :data:`MAX_ITEMS`
    characters, a container within the caps, or an iterator that stops the render when it passes
    :data:`MAX_ITEMS` items (it is returned wrapped)."""
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_ITEMS:
            raise TemplateLimitError(
                f"{what} would go through {len(value):,} characters one by one, over the"
                f" template limit of {MAX_ITEMS:,} items"
            )
        return value
    if isinstance(value, _CONTAINERS):
        return check_len(value, what)
    if isinstance(value, Iterator):
        return _counted(value, what)
    return value


def _counted(items: Iterator[Any], what: str) -> Iterator[Any]:
    units = 0
    for i, item in enumerate(items):
        if not i & 255:
            check_budget()
        if i >= MAX_ITEMS:
            raise TemplateLimitError(
                f"{what} would go through over {MAX_ITEMS:,} items, the template limit"
            )
        if isinstance(item, (str, bytes)):
            units += len(item) + 1
        else:
            units += measure(item, what).units
        if units > MAX_OUTPUT_CHARS:
            raise TemplateLimitError(
                f"{what} is over the template size limit of {MAX_OUTPUT_CHARS:,}"
            )
        yield item


# ---- formatting ----------------------------------------------------------------------------


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


# ---- operators and methods -------------------------------------------------------------------


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
            check_budget()
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
