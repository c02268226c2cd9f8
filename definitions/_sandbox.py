"""The guarded Jinja2 sandbox every task prompt and native body is rendered in.

On top of ``ImmutableSandboxedEnvironment`` (no ``_``-attributes, no mutation of lists/dicts) and
``StrictUndefined`` this module bounds work and memory, because a template is untrusted input
that runs on the host rendering a whole batch: ``range`` is capped, ``*``, ``**``, ``+`` and ``%``
refuse results over the caps before computing them, amplifying filters and string methods are
checked up front (or left out), every ``for`` loop, call and join checks a wall-clock deadline,
and the caller counts output characters while generating. Rendering itself (variables, batches)
lives in ``_render``.
"""

from __future__ import annotations

import contextvars
import functools
import re
import string
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.filters import (
    FILTERS,
    do_batch,
    do_center,
    do_format,
    do_indent,
    do_replace,
    do_tojson,
    do_wordwrap,
    make_attrgetter,
    sync_do_slice,
    sync_do_sum,
)
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Cycler, Joiner, Namespace, pass_environment, pass_eval_context

__all__ = [
    "MAX_OUTPUT_CHARS",
    "MAX_RANGE",
    "RENDER_TIMEOUT_S",
    "Budget",
    "TemplateLimitError",
    "guarded_environment",
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


def _check_budget() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.check()


def _too_big(what: str, size: int, cap: int = MAX_OUTPUT_CHARS) -> TemplateLimitError:
    return TemplateLimitError(f"{what} would be {size:,} long, over the template limit of {cap:,}")


def _deep_size(value: Any, what: str, limit: int = MAX_OUTPUT_CHARS) -> int:
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


def _check_len(value: _T, what: str) -> _T:
    """Reject a string over the cap, or a container whose full (shared-counted) size is."""
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_OUTPUT_CHARS:
            raise _too_big(what, len(value))
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        _deep_size(value, what)
    return value


def _check_width(value: Any, what: str) -> None:
    if isinstance(value, int) and value > MAX_WIDTH:
        raise TemplateLimitError(f"{what} {value:,} is over the template limit of {MAX_WIDTH:,}")


def _check_printf(fmt: str) -> None:
    for match in _PRINTF.finditer(fmt):
        for group in match.groups():
            if group == "*":
                raise SecurityError("`*` widths in % formatting are not allowed in templates")
            if group and (len(group) > 6 or int(group) > MAX_WIDTH):
                raise TemplateLimitError(
                    f"% format width {group} is over the template limit of {MAX_WIDTH:,}"
                )


def _check_format_spec(fmt: str) -> None:
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


def _replace_size(text: str | bytes, old: Any, new: Any, count: Any = -1) -> int:
    if not isinstance(old, (str, bytes)) or not isinstance(new, (str, bytes)):
        return len(text)
    hits = len(text) + 1 if not old else text.count(old)  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


def _join_checked(separator: Any, items: Iterable[Any]) -> str:
    sep = str(separator)
    parts: list[str] = []
    total = 0
    for i, item in enumerate(items):
        if not i & 255:
            _check_budget()
        text = item if isinstance(item, str) else str(_check_len(item, "a joined value"))
        total += len(text) + (len(sep) if parts else 0)
        if total > MAX_OUTPUT_CHARS:
            raise _too_big("a joined string", total)
        parts.append(text)
    return sep.join(parts)


def _guard_str_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    owner, name = method.__self__, method.__name__
    if name not in _STR_METHODS:
        raise SecurityError(f"the string method {name!r} is not allowed in templates")
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _check_width(args[0], f"{name}() width")
    elif name == "replace" and len(args) >= 2:
        size = _replace_size(owner, *args[:3])
        if size > MAX_OUTPUT_CHARS:
            raise _too_big("replace() result", size)


# ---- filters ---------------------------------------------------------------------------------


def _generic(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _check_budget()
        return _check_len(fn(*args, **kwargs), f"the result of |{name}")

    return wrapper


def _f_center(value: Any, width: int = 80) -> str:
    _check_width(width, "center width")
    return do_center(value, width)


def _f_indent(s: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    _check_width(width, "indent width")
    pad = len(width) if isinstance(width, str) else int(width)
    size = len(str(s)) + (str(s).count("\n") + 1) * pad
    if size > MAX_OUTPUT_CHARS:
        raise _too_big("the result of |indent", size)
    return do_indent(s, width, first, blank)


@pass_environment
def _f_wordwrap(env: Any, s: str, width: int = 79, break_long_words: bool = True, wrapstring: str | None = None,
                break_on_hyphens: bool = True) -> str:  # fmt: skip
    wrap = wrapstring if wrapstring is not None else env.newline_sequence
    size = len(s) + (len(s) // max(int(width), 1) + 1) * len(wrap)
    if size > MAX_OUTPUT_CHARS:
        raise _too_big("the result of |wordwrap", size)
    return do_wordwrap(env, s, width, break_long_words, wrapstring, break_on_hyphens)


def _f_format(value: str, *args: Any, **kwargs: Any) -> str:
    _check_printf(str(value))
    return _check_len(do_format(value, *args, **kwargs), "the result of |format")


@pass_eval_context
def _f_join(
    eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: str | int | None = None
) -> str:
    if attribute is not None:
        value = map(make_attrgetter(eval_ctx.environment, attribute), value)
    return _join_checked(d, value)


@pass_eval_context
def _f_replace(eval_ctx: Any, s: str, old: str, new: str, count: int | None = None) -> str:
    size = _replace_size(str(s), old, new, -1 if count is None else count)
    if size > MAX_OUTPUT_CHARS:
        raise _too_big("the result of |replace", size)
    return do_replace(eval_ctx, s, old, new, count)


def _f_batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Iterator[list[Any]]:
    _check_width(linecount, "batch size")
    return do_batch(value, linecount, fill_with)


def _f_slice(value: Iterable[Any], slices: int, fill_with: Any = None) -> Iterator[list[Any]]:
    _check_width(slices, "slice count")
    return sync_do_slice(list(value), slices, fill_with)


@pass_environment
def _f_sum(
    env: Any, iterable: Iterable[Any], attribute: str | int | None = None, start: int | float = 0
) -> Any:
    # Summing lists or strings is quadratic; numbers are all a prompt needs.
    if isinstance(start, bool) or not isinstance(start, (int, float)):
        raise SecurityError("|sum only adds numbers in templates")
    _check_budget()
    return sync_do_sum(env, iterable, attribute, start)


@pass_eval_context
def _f_tojson(eval_ctx: Any, value: Any, indent: int | None = None) -> Any:
    if isinstance(indent, int) and indent > 16:
        raise TemplateLimitError("|tojson indent is limited to 16 in templates")
    _check_len(value, "the value given to |tojson")
    return _check_len(str.__str__(do_tojson(eval_ctx, value, indent)), "the result of |tojson")


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
}
# Left out on purpose: `pprint` (slow on big values), `urlize`, and the Markup makers (`safe`,
# `e`/`escape`, `forceescape`): prompts are plain text and Markup's methods would dodge the guards.
_PLAIN_FILTERS = (
    "abs attr capitalize count d default dictsort filesizeformat first float groupby int items last length"
    " list lower map max min random reject rejectattr reverse round select selectattr sort string striptags"
    " title trim truncate unique upper urlencode wordcount xmlattr"
).split()


def _filters() -> dict[str, Callable[..., Any]]:
    table = {name: _generic(FILTERS[name], name) for name in _PLAIN_FILTERS}
    table.update(_SPECIAL_FILTERS)
    return table


def _finalize(value: Any) -> Any:
    return _check_len(value, "an output value")


class _Namespace(Namespace):
    """``namespace()`` whose text form is short: its attributes may each hold a capped value, and
    printing them all at once must not add up past the cap."""

    def __repr__(self) -> str:
        return "<namespace>"


def _capped_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise TemplateLimitError(
            f"range() of {len(rng):,} items is over the template limit of {MAX_RANGE:,}"
        )
    return rng


# ---- code generation hooks -------------------------------------------------------------------


class _GuardedCodeGenerator(CodeGenerator):
    """Routes ``~`` through a size-checked join, every ``for`` iterable through a deadline check
    and every list/tuple/dict literal through a size check (so no shared-reference structure can
    grow past the cap and make ``str()`` or ``==`` explode later)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.guarded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _guarded(self, visit: Callable[[Any, Frame], None], node: Any, frame: Frame) -> None:
        self.write("environment.guard_value(")
        visit(node, frame)
        self.write(")")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self._guarded(super().visit_List, node, frame)

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self._guarded(super().visit_Dict, node, frame)

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx == "load":
            self._guarded(super().visit_Tuple, node, frame)
        else:  # an assignment target such as `for a, b in ...`
            super().visit_Tuple(node, frame)

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        wrapped = nodes.Call(nodes.EnvironmentAttribute("guard_iter"), [node.iter], [], None, None)
        guarded = nodes.For(
            node.target,
            wrapped,
            node.body,
            node.else_,
            node.test,
            node.recursive,
            lineno=node.lineno,
        )
        super().visit_For(guarded, frame)


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """``ImmutableSandboxedEnvironment`` with the work and size caps described in the module doc."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(
            undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True, cache_size=0
        )
        self.globals.clear()
        self.globals.update(
            range=_capped_range, dict=dict, namespace=_Namespace, joiner=Joiner, cycler=Cycler
        )
        self.finalize = _finalize
        self.filters = _filters()
        self.concat = self.guarded_concat  # type: ignore[method-assign]

    # Hooks referenced from generated code ------------------------------------------------------
    def guard_value(self, value: Any) -> Any:
        return _check_len(value, "a literal")

    def guarded_join(self, items: Iterable[Any]) -> str:
        return _join_checked("", items)

    def guarded_concat(self, items: Iterable[Any]) -> str:
        return _join_checked("", items)

    def guard_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        budget = _BUDGET.get()
        for item in iterable:
            if budget is not None:
                budget.check()
            yield item

    # Sandbox overrides -------------------------------------------------------------------------
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_budget()
        if operator == "*":
            _check_multiply(left, right)
        elif operator == "**":
            _check_power(left, right)
        elif operator == "+":
            if isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
                if len(left) + len(right) > MAX_OUTPUT_CHARS:
                    raise _too_big("a concatenation", len(left) + len(right))
            elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                _deep_size(
                    right,
                    "a concatenated list",
                    MAX_OUTPUT_CHARS - _deep_size(left, "a concatenated list"),
                )
        elif operator == "%" and isinstance(left, (str, bytes)):
            _check_printf(left if isinstance(left, str) else left.decode("latin-1"))
            return _check_len(self.binop_table[operator](left, right), "a % formatted string")
        return self.binop_table[operator](left, right)

    def call(__self, __context: Any, __obj: Any, /, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check_budget()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, bytes)) and isinstance(
            __obj, (types.BuiltinMethodType, types.MethodType)
        ):
            if __obj.__name__ == "join" and len(args) == 1 and not kwargs:
                if isinstance(owner, str):
                    return _join_checked(owner, args[0])
                items = list(args[0])
                size = sum(len(i) for i in items if isinstance(i, bytes))
                if size > MAX_OUTPUT_CHARS:
                    raise _too_big("a joined byte string", size)
                return owner.join(items)
            _guard_str_method(__obj, args, kwargs)
        return _check_len(super().call(__context, __obj, *args, **kwargs), "a call result")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapper)
        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format_spec(fmt)
            return _check_len(wrapper(*args, **kwargs), "a formatted string")

        return checked


def _check_multiply(left: Any, right: Any) -> None:
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, (str, bytes)) and isinstance(times, int):
            size = len(seq) * max(times, 0)
            if size > MAX_OUTPUT_CHARS:
                raise _too_big("a repeated sequence", size)
            return
        if isinstance(seq, (list, tuple)) and isinstance(times, int):
            if times > 0:
                _deep_size(seq, "a repeated list", MAX_OUTPUT_CHARS // times)
            return
    if isinstance(left, int) and isinstance(right, int):
        bits = left.bit_length() + right.bit_length()
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(
                f"a product of about {bits:,} bits is over the template limit of {MAX_INT_BITS:,}"
            )


def _check_power(base: Any, exponent: Any) -> None:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        bits = base.bit_length() * exponent
        if bits > MAX_INT_BITS:
            raise TemplateLimitError(
                f"a power of about {bits:,} bits is over the template limit of {MAX_INT_BITS:,}"
            )


@functools.cache
def guarded_environment() -> GuardedEnvironment:
    """The process-wide guarded environment (it holds no per-render state)."""
    return GuardedEnvironment()


def set_budget(budget: Budget | None) -> contextvars.Token[Budget | None]:
    """Install the deadline for the render in progress; reset with the returned token."""
    return _BUDGET.set(budget)


def reset_budget(token: contextvars.Token[Budget | None]) -> None:
    _BUDGET.reset(token)
