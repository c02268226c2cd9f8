"""Sizes of the values a template holds, found without building their text, and the checks
that keep each value within the caps of ``_limits`` (length, objects, text, colliding keys,
iterated items) and count it against the render's memory budget."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from jinja2.utils import Cycler

from clonefleet.definitions.template._limits import (
    MAX_HASH_COLLISIONS,
    MAX_ITEMS,
    MAX_OUTPUT_CHARS,
    MAX_WIDTH,
    Size,
    TemplateLimitError,
    too_big,
)
from clonefleet.definitions.template._render_budget import check_render, current_render_budget

__all__ = [
    "bounded_iterable",
    "charge",
    "charge_shell",
    "check_comparable",
    "check_keys",
    "check_len",
    "check_text",
    "check_width",
    "deep_size",
    "measure",
    "text_size",
]

_OTHER_TEXT = 256
"""Assumed longest ``str()`` of an object that is not a string, number or container (jinja2's
loop, cycler, namespace and macro objects, clone info, iterators)."""
_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()), type({}.items()))
_CONTAINERS = (list, tuple, set, frozenset, dict, Cycler, *_VIEWS)
_SCALARS = (str, bytes, int, float, type(None))
_CACHED_LEN = 64
"""Containers at least this long have their size remembered for the rest of the render."""


_T = TypeVar("_T")


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
    budget = current_render_budget()
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
    budget = current_render_budget()
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
    budget = current_render_budget()
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
            check_render()
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
