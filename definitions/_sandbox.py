"""The guarded Jinja2 sandbox every task prompt and native body is rendered in.

On top of ``ImmutableSandboxedEnvironment`` (no ``_``-attributes, no mutation of lists/dicts) and
``StrictUndefined`` this module routes the work a template can do through the checks of
``_limits``: ``range`` is capped, ``*``, ``**``, ``+`` and ``%`` refuse results over the caps
before computing them, amplifying filters and string methods are checked up front (or left out),
and every ``for`` loop, call and join checks the render's deadline. Rendering itself (variables,
batches, the output count) lives in ``_render``.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

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

from ._limits import (
    MAX_OUTPUT_CHARS,
    MAX_RANGE,
    TemplateLimitError,
    check_budget,
    check_format_spec,
    check_len,
    check_multiply,
    check_power,
    check_printf,
    check_width,
    current_budget,
    deep_size,
    guard_str_method,
    join_checked,
    replace_size,
    too_big,
)

__all__ = ["GuardedEnvironment", "guarded_environment"]


# ---- filters ---------------------------------------------------------------------------------


def _generic(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check_budget()
        return check_len(fn(*args, **kwargs), f"the result of |{name}")

    return wrapper


def _f_center(value: Any, width: int = 80) -> str:
    check_width(width, "center width")
    return do_center(value, width)


def _f_indent(s: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    check_width(width, "indent width")
    pad = len(width) if isinstance(width, str) else int(width)
    size = len(str(s)) + (str(s).count("\n") + 1) * pad
    if size > MAX_OUTPUT_CHARS:
        raise too_big("the result of |indent", size)
    return do_indent(s, width, first, blank)


@pass_environment
def _f_wordwrap(env: Any, s: str, width: int = 79, break_long_words: bool = True, wrapstring: str | None = None,
                break_on_hyphens: bool = True) -> str:  # fmt: skip
    wrap = wrapstring if wrapstring is not None else env.newline_sequence
    size = len(s) + (len(s) // max(int(width), 1) + 1) * len(wrap)
    if size > MAX_OUTPUT_CHARS:
        raise too_big("the result of |wordwrap", size)
    return do_wordwrap(env, s, width, break_long_words, wrapstring, break_on_hyphens)


def _f_format(value: str, *args: Any, **kwargs: Any) -> str:
    check_printf(str(value))
    return check_len(do_format(value, *args, **kwargs), "the result of |format")


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
    check_budget()
    return sync_do_sum(env, iterable, attribute, start)


@pass_eval_context
def _f_tojson(eval_ctx: Any, value: Any, indent: int | None = None) -> Any:
    if isinstance(indent, int) and indent > 16:
        raise TemplateLimitError("|tojson indent is limited to 16 in templates")
    check_len(value, "the value given to |tojson")
    return check_len(str.__str__(do_tojson(eval_ctx, value, indent)), "the result of |tojson")


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
    return check_len(value, "an output value")


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
        return check_len(value, "a literal")

    def guarded_join(self, items: Iterable[Any]) -> str:
        return join_checked("", items)

    def guarded_concat(self, items: Iterable[Any]) -> str:
        return join_checked("", items)

    def guard_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        budget = current_budget()
        for item in iterable:
            if budget is not None:
                budget.check()
            yield item

    # Sandbox overrides -------------------------------------------------------------------------
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_budget()
        if operator == "*":
            check_multiply(left, right)
        elif operator == "**":
            check_power(left, right)
        elif operator == "+":
            if isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
                if len(left) + len(right) > MAX_OUTPUT_CHARS:
                    raise too_big("a concatenation", len(left) + len(right))
            elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                deep_size(
                    right,
                    "a concatenated list",
                    MAX_OUTPUT_CHARS - deep_size(left, "a concatenated list"),
                )
        elif operator == "%" and isinstance(left, (str, bytes)):
            check_printf(left if isinstance(left, str) else left.decode("latin-1"))
            return check_len(self.binop_table[operator](left, right), "a % formatted string")
        return self.binop_table[operator](left, right)

    def call(__self, __context: Any, __obj: Any, /, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        check_budget()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, bytes)) and isinstance(
            __obj, (types.BuiltinMethodType, types.MethodType)
        ):
            if __obj.__name__ == "join" and len(args) == 1 and not kwargs:
                if isinstance(owner, str):
                    return join_checked(owner, args[0])
                items = list(args[0])
                size = sum(len(i) for i in items if isinstance(i, bytes))
                if size > MAX_OUTPUT_CHARS:
                    raise too_big("a joined byte string", size)
                return owner.join(items)
            guard_str_method(__obj, args, kwargs)
        return check_len(super().call(__context, __obj, *args, **kwargs), "a call result")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapper)
        def checked(*args: Any, **kwargs: Any) -> str:
            check_format_spec(fmt)
            return check_len(wrapper(*args, **kwargs), "a formatted string")

        return checked


@functools.cache
def guarded_environment() -> GuardedEnvironment:
    """The process-wide guarded environment (it holds no per-render state)."""
    return GuardedEnvironment()
