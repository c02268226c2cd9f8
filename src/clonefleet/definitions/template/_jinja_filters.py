"""The filters and tests a guarded template gets: each filter checks its input and arguments
before it runs (the amplifying ones size their result first) and its result after; comparing
tests check their operands. ``_jinja_env`` installs them in the guarded environment."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

from jinja2.exceptions import SecurityError
from jinja2.filters import (
    FILTERS,
    do_batch,
    do_center,
    do_format,
    do_indent,
    do_replace,
    do_round,
    do_striptags,
    do_tojson,
    do_urlencode,
    do_wordwrap,
    do_xmlattr,
    ignore_case,
    make_attrgetter,
    sync_do_slice,
    sync_do_sum,
)
from jinja2.tests import TESTS
from jinja2.utils import pass_environment, pass_eval_context

from clonefleet.definitions.template._format_limits import check_printf
from clonefleet.definitions.template._limits import (
    MAX_HASH_COLLISIONS,
    MAX_ITEMS,
    MAX_OUTPUT_CHARS,
    MAX_SLOW_TEXT_CHARS,
    MAX_WIDTH,
    TemplateLimitError,
    too_big,
)
from clonefleet.definitions.template._operator_limits import join_checked, replace_size
from clonefleet.definitions.template._render_budget import check_render
from clonefleet.definitions.template._sizes import (
    bounded_iterable,
    charge,
    check_comparable,
    check_len,
    check_text,
    check_width,
)

__all__ = ["guard_arg", "guarded_filters", "guarded_tests"]

_MAX_PAIRS = 10_000
"""Most pairs ``urlencode`` and ``xmlattr`` take (each costs several Python calls)."""
_LINE_BREAKS = ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_MAX_NUMBER_TEXT = 5_000
"""Longest text ``|int`` parses (decimal parsing of long numbers is quadratic)."""


def guard_arg(value: Any, what: str) -> Any:
    """A call's or filter's argument within the caps; an iterator comes back counted."""
    if isinstance(value, Iterator):
        return bounded_iterable(value, what)
    return check_len(value, what)


# ---- filters ---------------------------------------------------------------------------------


def _f_center(value: Any, width: int = 80) -> str:
    check_width(width, "center width")
    return do_center(value, width)


def _f_indent(s: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    check_width(width, "indent width")
    text = str(s)
    pad = len(width) if isinstance(width, str) else int(width)
    lines = sum(map(text.count, _LINE_BREAKS)) + 1  # what str.splitlines splits at
    if lines > MAX_ITEMS:
        raise TemplateLimitError(
            f"|indent of {lines:,} lines is over the template limit of {MAX_ITEMS:,}"
        )
    size = len(text) + lines * pad
    if size > MAX_OUTPUT_CHARS:
        raise too_big("the result of |indent", size)
    return do_indent(s, width, first, blank)


@pass_environment
def _f_wordwrap(env: Any, s: str, width: int = 79, break_long_words: bool = True, wrapstring: str | None = None,
                break_on_hyphens: bool = True) -> str:  # fmt: skip
    if len(s) > MAX_SLOW_TEXT_CHARS:
        raise TemplateLimitError(
            f"|wordwrap of {len(s):,} characters is over the template limit of {MAX_SLOW_TEXT_CHARS:,}"
        )
    wrap = wrapstring if wrapstring is not None else env.newline_sequence
    size = len(s) + (len(s) // max(int(width), 1) + 1) * len(wrap)
    if size > MAX_OUTPUT_CHARS:
        raise too_big("the result of |wordwrap", size)
    return do_wordwrap(env, s, width, break_long_words, wrapstring, break_on_hyphens)


def _f_format(value: str, *args: Any, **kwargs: Any) -> str:
    check_printf(str(value), kwargs or args)
    return do_format(value, *args, **kwargs)


@pass_eval_context
def _f_join(
    eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: str | int | None = None
) -> str:
    if attribute is not None:
        value = map(make_attrgetter(eval_ctx.environment, attribute), value)
    return join_checked(d, value)


@pass_eval_context
def _f_replace(eval_ctx: Any, s: str, old: str, new: str, count: int | None = None) -> str:
    size = replace_size(str(s), old, new, -1 if count is None else count)
    if size > MAX_OUTPUT_CHARS:
        raise too_big("the result of |replace", size)
    return do_replace(eval_ctx, s, old, new, count)


def _f_batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Iterator[list[Any]]:
    check_width(linecount, "batch size")
    return do_batch(value, linecount, fill_with)


def _f_slice(value: Iterable[Any], slices: int, fill_with: Any = None) -> Iterator[list[Any]]:
    check_width(slices, "slice count")
    return sync_do_slice(list(value), slices, fill_with)


@pass_environment
def _f_sum(
    env: Any, iterable: Iterable[Any], attribute: str | int | None = None, start: int | float = 0
) -> Any:
    # Summing lists or strings is quadratic; numbers are all a prompt needs.
    if isinstance(start, bool) or not isinstance(start, (int, float)):
        raise SecurityError("|sum only adds numbers in templates")
    return sync_do_sum(env, iterable, attribute, start)


def _indented_json_size(value: Any, indent: int) -> int:
    """The characters indentation adds to ``json.dumps(value, indent=indent)`` (each element on
    its own line, indented by its depth), plus three per element."""
    total, stack, steps = 0, [(value, 1)], 0
    while stack:
        item, depth = stack.pop()
        steps += 1
        if not steps & 1023:
            check_render()
        total += indent * depth + 3
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
        if total > MAX_OUTPUT_CHARS:
            raise too_big("the result of |tojson", total)
    return total


@pass_eval_context
def _f_tojson(eval_ctx: Any, value: Any, indent: int | str | None = None) -> Any:
    width = len(indent) if isinstance(indent, str) else indent
    if isinstance(width, int) and width > 16:
        raise TemplateLimitError("|tojson indent is limited to 16 in templates")
    if isinstance(width, int):
        _indented_json_size(value, width)  # the pure-Python encoder: bounded by MAX_ITEMS too
    json = do_tojson(eval_ctx, value, indent)  # type: ignore[arg-type]  # json.dumps takes str indents
    return check_len(str.__str__(json), "the result of |tojson")


_WORD_START = re.compile(r"([-\s({\[<]+)")  # jinja2's own split for |title


def _f_title(s: Any) -> str:
    """``|title``, a slice of about 64 KiB at a time (each cut after a run of word separators,
    so no word is split) with a deadline check between slices."""
    text, pos = str(s), 0
    out: list[str] = []
    while pos < len(text):
        check_render()
        cut = _WORD_START.search(text, pos + 65536)
        end = cut.end() if cut is not None else len(text)
        out.append(
            "".join(w[0].upper() + w[1:].lower() for w in _WORD_START.split(text[pos:end]) if w)
        )
        pos = end
    return "".join(out)


def _f_striptags(value: Any) -> str:
    text = str(value)
    work = text.count("<") + text.count("&")
    if work > MAX_ITEMS:
        raise TemplateLimitError(
            f"|striptags of text with {work:,} tags and entities is over the template limit of {MAX_ITEMS:,}"
        )
    return do_striptags(text)


def _pairs(value: Any, name: str) -> list[Any]:
    items = list(value.items() if isinstance(value, Mapping) else value)
    if len(items) > _MAX_PAIRS:
        raise TemplateLimitError(
            f"|{name} of {len(items):,} pairs is over the template limit of {_MAX_PAIRS:,}"
        )
    return items


def _f_urlencode(value: Any) -> str:
    if isinstance(value, str):
        if (
            4 * len(value) > MAX_OUTPUT_CHARS
            and len(value.encode("utf-8", "surrogatepass")) > MAX_OUTPUT_CHARS
        ):
            raise too_big("the result of |urlencode", len(value))
        return do_urlencode(value)
    if isinstance(value, Iterable):
        return do_urlencode(_pairs(value, "urlencode"))
    return do_urlencode(value)


@pass_eval_context
def _f_xmlattr(eval_ctx: Any, d: Mapping[str, Any], autospace: bool = True) -> str:
    if isinstance(d, Mapping) and len(d) > _MAX_PAIRS:
        raise TemplateLimitError(
            f"|xmlattr of {len(d):,} pairs is over the template limit of {_MAX_PAIRS:,}"
        )
    return str(do_xmlattr(eval_ctx, d, autospace))


@pass_environment
def _f_unique(
    env: Any, value: Iterable[Any], case_sensitive: bool = False, attribute: str | int | None = None
) -> Iterator[Any]:
    """``|unique`` that stops before a hash table of colliding keys gets slow."""
    getter = make_attrgetter(env, attribute, postprocess=None if case_sensitive else ignore_case)
    seen: set[Any] = set()
    classes: dict[int, int] = {}
    for item in value:
        key = getter(item)
        if key not in seen:  # walks at most MAX_HASH_COLLISIONS keys of one hash value
            digest = hash(key)
            same = classes.get(digest, 0)
            if same >= MAX_HASH_COLLISIONS:
                raise TemplateLimitError(
                    f"|unique met over {MAX_HASH_COLLISIONS:,} values with one hash value"
                )
            classes[digest] = same + 1
            seen.add(key)
            yield item


def _f_round(value: float, precision: int = 0, method: str = "common") -> float:
    if isinstance(precision, int) and abs(precision) > MAX_WIDTH:
        raise TemplateLimitError(f"|round precision is limited to {MAX_WIDTH:,} in templates")
    return do_round(value, precision, method)  # type: ignore[arg-type]


def _f_int(value: Any, default: int = 0, base: int = 10) -> int:
    if isinstance(value, (str, bytes)) and len(value) > _MAX_NUMBER_TEXT:
        raise TemplateLimitError(
            f"|int of {len(value):,} characters is over the template limit of {_MAX_NUMBER_TEXT:,}"
        )
    return FILTERS["int"](value, default, base)  # type: ignore[no-any-return]


_SPECIAL_FILTERS: dict[str, Callable[..., Any]] = {
    "center": _f_center,
    "indent": _f_indent,
    "wordwrap": _f_wordwrap,
    "format": _f_format,
    "join": _f_join,
    "replace": _f_replace,
    "batch": _f_batch,
    "slice": _f_slice,
    "sum": _f_sum,
    "tojson": _f_tojson,
    "title": _f_title,
    "striptags": _f_striptags,
    "urlencode": _f_urlencode,
    "xmlattr": _f_xmlattr,
    "round": _f_round,
    "int": _f_int,
    "unique": _f_unique,
}
# Left out on purpose: `pprint` (slow on big values), `urlize`, and the Markup makers (`safe`,
# `e`/`escape`, `forceescape`): prompts are plain text and Markup's methods would dodge the guards.
_ITERATING = frozenset(
    "batch dictsort groupby list map max min reject rejectattr select selectattr slice sort sum unique".split()
)
"""Filters that go through their input item by item (a string: character by character)."""
_TEXT = frozenset(
    "capitalize center format indent lower replace string striptags title trim truncate upper wordcount"
    " wordwrap".split()
)
"""Filters that turn their input into text first."""
_SELECTORS = frozenset(
    "abs attr count d default first float int last length max min random round sum wordcount".split()
)
"""Filters that return (part of) their input or a number: nothing new to count (``charge``)."""
_OTHER = frozenset(
    "abs attr count d default filesizeformat first float int items join last length random reverse round"
    " tojson urlencode xmlattr".split()
)


def _guarded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its input and arguments checked first (see the module doc) and its result
    after."""
    offset = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0
    what = f"the value given to |{name}"
    where = f"an argument of |{name}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check_render()
        if len(args) > offset:
            value = args[offset]
            if name in _ITERATING:
                value = bounded_iterable(value, what)
            elif name in _TEXT:
                check_text(value, what)
            else:
                value = guard_arg(value, what)
            rest = [guard_arg(a, where) for a in args[offset + 1 :]]
            args = (*args[:offset], value, *rest)
        kwargs = {k: guard_arg(v, where) for k, v in kwargs.items()}
        result = check_len(fn(*args, **kwargs), f"the result of |{name}")
        if name in _SELECTORS:
            return result
        return charge(result, (*args, *kwargs.values()))

    return wrapper


def guarded_filters() -> dict[str, Callable[..., Any]]:
    names = _ITERATING | _TEXT | _OTHER
    return {
        name: _guarded_filter(name, _SPECIAL_FILTERS.get(name) or FILTERS[name]) for name in names
    }


# ---- tests -----------------------------------------------------------------------------------


def _guarded_test(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(value: Any, *args: Any) -> Any:
        check_render()
        for other in args:
            check_comparable(value, other)
        return fn(value, *args)

    return wrapper


_COMPARING_TESTS = frozenset(
    "== != < <= > >= eq ne lt le gt ge equalto lessthan greaterthan in divisibleby".split()
)


def guarded_tests() -> dict[str, Any]:
    table = cast(Mapping[str, Callable[..., Any]], TESTS)
    return {
        name: _guarded_test(fn) if name in _COMPARING_TESTS else fn for name, fn in table.items()
    }
