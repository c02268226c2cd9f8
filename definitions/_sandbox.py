"""The guarded Jinja2 sandbox every task prompt and native body is rendered in.

On top of ``ImmutableSandboxedEnvironment`` (no ``_``-attributes, no mutation of lists/dicts) and
``StrictUndefined`` this module routes *every* operation a template can do through the checks of
``_limits``, because one C-level call (``str.replace``, ``%``, ``==``, ``sorted``, an encoder) runs
to its end once started, whatever the deadline says:

* before it runs, each operation's worst case is bounded from its operands' sizes: ``range`` is
  capped; ``*``, ``**``, ``+`` and ``%`` refuse results over the caps; ``str.format`` and ``%``
  size their result from the values each field converts (a field may repeat a value); comparisons
  and ``in`` walk only values within the caps; string methods come from an allow-list with padding
  widths, ``replace`` and codecs checked (only plain text codecs); every filter checks its input
  and arguments (a filter that iterates takes at most ``MAX_ITEMS`` items, an iterator is counted
  as it is consumed) and the amplifying ones size their result first; call arguments are checked,
  and ``*args``/``**kwargs`` are counted before they are expanded;
* between operations, every loop iteration, call, filter, comparison, attribute/item access,
  slice and join checks the render's deadline and memory;
* after it runs, every result is checked against the caps (``_limits.check_len``);
* constant folding is off, so nothing runs at compile time, outside the budget.

Rendering itself (variables, batches, the output count) lives in ``_render``.
"""

from __future__ import annotations

import copy
import functools
import operator
import re
import types
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

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
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.tests import TESTS
from jinja2.utils import Cycler, Joiner, Namespace, pass_environment, pass_eval_context

from ._limits import (
    MAX_DICT_LITERAL,
    MAX_HASH_COLLISIONS,
    MAX_ITEMS,
    MAX_OUTPUT_CHARS,
    MAX_RANGE,
    MAX_SLOW_TEXT_CHARS,
    MAX_WIDTH,
    TemplateLimitError,
    bounded_iterable,
    charge,
    charge_shell,
    check_budget,
    check_comparable,
    check_format_call,
    check_keys,
    check_len,
    check_multiply,
    check_power,
    check_printf,
    check_text,
    check_width,
    current_budget,
    guard_method,
    join_checked,
    measure,
    replace_size,
    too_big,
)

__all__ = ["GuardedEnvironment", "guarded_environment"]

_MAX_PAIRS = 10_000
"""Most pairs ``urlencode`` and ``xmlattr`` take (each costs several Python calls)."""
_MAX_NUMBER_TEXT = 5_000
"""Longest text ``|int`` parses (decimal parsing of long numbers is quadratic)."""


def _guard_arg(value: Any, what: str) -> Any:
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
    lines = text.count("\n") + 1
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
            check_budget()
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
        check_budget()
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
    classes: Counter[int] = Counter()
    for item in value:
        key = getter(item)
        digest = hash(key)
        if classes[digest] >= MAX_HASH_COLLISIONS:
            raise TemplateLimitError(
                f"|unique met over {MAX_HASH_COLLISIONS:,} values with one hash value"
            )
        if key not in seen:
            seen.add(key)
            classes[digest] += 1
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
        check_budget()
        if len(args) > offset:
            value = args[offset]
            if name in _ITERATING:
                value = bounded_iterable(value, what)
            elif name in _TEXT:
                check_text(value, what)
            else:
                value = _guard_arg(value, what)
            rest = [_guard_arg(a, where) for a in args[offset + 1 :]]
            args = (*args[:offset], value, *rest)
        kwargs = {k: _guard_arg(v, where) for k, v in kwargs.items()}
        result = check_len(fn(*args, **kwargs), f"the result of |{name}")
        if name in _SELECTORS:
            return result
        return charge(result, (*args, *kwargs.values()))

    return wrapper


def _filters() -> dict[str, Callable[..., Any]]:
    names = _ITERATING | _TEXT | _OTHER
    return {
        name: _guarded_filter(name, _SPECIAL_FILTERS.get(name) or FILTERS[name]) for name in names
    }


# ---- tests -----------------------------------------------------------------------------------


def _guarded_test(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(value: Any, *args: Any) -> Any:
        check_budget()
        for other in args:
            check_comparable(value, other)
        return fn(value, *args)

    return wrapper


_COMPARING_TESTS = frozenset(
    "== != < <= > >= eq ne lt le gt ge equalto lessthan greaterthan in divisibleby".split()
)


def _tests() -> dict[str, Any]:
    table = cast(Mapping[str, Callable[..., Any]], TESTS)
    return {
        name: _guarded_test(fn) if name in _COMPARING_TESTS else fn for name, fn in table.items()
    }


# ---- globals ---------------------------------------------------------------------------------


def _finalize(value: Any) -> Any:
    return check_text(value, "an output value")


def _keys_of(source: Any, what: str) -> Any:
    """``source`` of ``dict(source)``, checked for colliding keys; an iterable of pairs comes back
    as a list."""
    if type(source) is dict:
        return source  # copied as it is: no hashing
    if isinstance(source, Mapping):
        check_keys(list(source.keys()), what)
        return source
    pairs = list(bounded_iterable(source, what))
    check_keys([pair[0] for pair in pairs if isinstance(pair, (list, tuple)) and pair], what)
    return pairs


def _dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
    """``dict()``, refusing colliding keys before the table is built."""
    if args:
        args = (_keys_of(args[0], "dict()"), *args[1:])
    return dict(*args, **kwargs)


class _Namespace(Namespace):
    """``namespace()`` whose text form is short (its attributes may each hold a capped value, and
    printing them all at once must not add up past the cap) and whose initial attributes are
    checked like ``dict()``'s."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - as jinja2's Namespace
        self, rest = args[0], args[1:]
        if rest:
            rest = (_keys_of(rest[0], "namespace()"), *rest[1:])
        Namespace.__init__(self, *rest, **kwargs)

    def __repr__(self) -> str:
        return "<namespace>"


def _capped_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise TemplateLimitError(
            f"range() of {len(rng):,} items is over the template limit of {MAX_RANGE:,}"
        )
    return rng


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "gteq": operator.ge,
    "lt": operator.lt,
    "lteq": operator.le,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}


# ---- code generation hooks -------------------------------------------------------------------


def _env_call(name: str, *args: nodes.Node, lineno: int | None = None) -> nodes.Call:
    """``environment.<name>(*args)`` as a node of the template's syntax tree."""
    exprs = [cast(nodes.Expr, a) for a in args]
    call = nodes.Call(nodes.EnvironmentAttribute(name), exprs, [], None, None)
    if lineno is not None:
        call.set_lineno(lineno)
    return call


class _GuardedCodeGenerator(CodeGenerator):
    """Routes ``~`` through a size-checked join, every ``for`` iterable through a deadline check,
    every list/tuple/dict literal through a size check (so no shared-reference structure can
    grow past the cap and make ``str()`` or ``==`` explode later), every comparison and slice
    through the environment, and ``*args``/``**kwargs`` through a count before they expand."""

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
        if len(node.items) > MAX_DICT_LITERAL:
            raise TemplateLimitError(
                f"a dict literal of {len(node.items):,} entries is over the template limit of"
                f" {MAX_DICT_LITERAL:,} (line {node.lineno})"
            )
        self._guarded(super().visit_Dict, node, frame)

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx == "load":
            self._guarded(super().visit_Tuple, node, frame)
        else:  # an assignment target such as `for a, b in ...`
            super().visit_Tuple(node, frame)

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        guarded = nodes.For(
            node.target,
            _env_call("guard_iter", node.iter),
            node.body,
            node.else_,
            node.test,
            node.recursive,
            lineno=node.lineno,
        )
        super().visit_For(guarded, frame)

    def _output_child_to_const(self, node: nodes.Expr, frame: Frame, finalize: Any) -> str:
        # jinja2 evaluates constant output expressions (filters included) while compiling,
        # outside any budget: only literal template text is folded here.
        if not isinstance(node, nodes.TemplateData):
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def visit_EvalContextModifier(self, node: nodes.EvalContextModifier, frame: Frame) -> None:
        # Its value is evaluated while compiling; prompts never need autoescaping.
        raise SecurityError("{% autoescape %} is not available in templates")

    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        # Every operand is evaluated before comparing (chained comparisons are rare in prompts).
        self.write("environment.guarded_compare(")
        self.visit(node.expr, frame)
        self.write(", (")
        for op in node.ops:
            self.write(f"({op.op!r}, ")
            self.visit(op.expr, frame)
            self.write("), ")
        self.write("))")

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        self.write("environment.guarded_slice(")
        self.visit(node.node, frame)
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            self.write(", ")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write(")")

    def signature(
        self,
        node: nodes.Call | nodes.Filter | nodes.Test,
        frame: Frame,
        extra_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if node.dyn_args is not None or node.dyn_kwargs is not None:
            node = copy.copy(node)
            if node.dyn_args is not None:
                node.dyn_args = _env_call("guard_star", node.dyn_args, lineno=node.lineno)
            if node.dyn_kwargs is not None:
                node.dyn_kwargs = _env_call("guard_star", node.dyn_kwargs, lineno=node.lineno)
        super().signature(node, frame, extra_kwargs)


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """``ImmutableSandboxedEnvironment`` with the work and size caps described in the module doc."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(
            undefined=StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
            cache_size=0,
            optimized=False,  # constant folding would run filters at compile time
        )
        self.globals.clear()
        self.globals.update(
            range=_capped_range, dict=_dict, namespace=_Namespace, joiner=Joiner, cycler=Cycler
        )
        self.finalize = _finalize
        self.filters = _filters()
        self.tests = _tests()
        self.concat = self.guarded_concat  # type: ignore[method-assign]

    # Hooks referenced from generated code ------------------------------------------------------
    def guard_value(self, value: Any) -> Any:
        return charge_shell(check_len(value, "a literal"))

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

    def guard_star(self, value: Any) -> Any:
        """``*args`` or ``**kwargs`` of a call, filter or test, before Python expands them."""
        if isinstance(value, Mapping):
            return check_len(value, "keyword arguments")
        return charge_shell(tuple(bounded_iterable(value, "star-expanded arguments")))

    def guarded_compare(self, left: Any, ops: tuple[tuple[str, Any], ...]) -> Any:
        check_budget()
        result: Any = True
        for op, right in ops:
            check_comparable(left, right)
            result = _COMPARE[op](left, right)
            if not result:
                return result
            left = right
        return result

    def guarded_slice(self, obj: Any, start: Any, stop: Any, step: Any) -> Any:
        check_budget()
        return charge(obj[start:stop:step], (obj,))

    # Sandbox overrides -------------------------------------------------------------------------
    def getitem(self, obj: Any, argument: Any) -> Any:
        check_budget()
        return super().getitem(obj, argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        check_budget()
        return super().getattr(obj, attribute)

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
                first = measure(left, "a concatenated list")
                measure(
                    right,
                    "a concatenated list",
                    MAX_OUTPUT_CHARS - first.units,
                    MAX_ITEMS - first.objects,
                )
        elif operator == "%" and isinstance(left, (str, bytes)):
            check_printf(left, right)
        return charge(self.binop_table[operator](left, right), (left, right))

    def call(__self, __context: Any, __obj: Any, /, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        check_budget()
        args = tuple(_guard_arg(a, "a call argument") for a in args)
        kwargs = {k: _guard_arg(v, "a call argument") for k, v in kwargs.items()}
        is_method = isinstance(__obj, (types.BuiltinMethodType, types.MethodType))
        owner = getattr(__obj, "__self__", None) if is_method else None
        if is_method:
            if isinstance(owner, (str, bytes)) and __obj.__name__ == "join" and len(args) == 1:
                if isinstance(owner, str) and not kwargs:
                    return join_checked(owner, args[0])
                items = list(bounded_iterable(args[0], "a joined value"))
                size = sum(len(i) for i in items if isinstance(i, bytes))
                if size > MAX_OUTPUT_CHARS:
                    raise too_big("a joined byte string", size)
                return charge(owner.join(items))
            guard_method(__obj, args, kwargs)
        result = check_len(super().call(__context, __obj, *args, **kwargs), "a call result")
        # What macros, dict() and str/bytes methods return is new (or one of their operands);
        # what other calls return is mostly an object the template already has (`d.get(k)`).
        if isinstance(__obj, Macro) or __obj is _dict or isinstance(owner, (str, bytes)):
            return charge(result, (owner, *args, *kwargs.values()))
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__
        is_format_map = value.__name__ == "format_map"

        @functools.wraps(wrapper)
        def checked(*args: Any, **kwargs: Any) -> str:
            check_budget()
            if is_format_map:
                check_format_call(fmt, (), args[0] if args else {})
            else:
                check_format_call(fmt, args, kwargs)
            return charge(check_len(wrapper(*args, **kwargs), "a formatted string"))

        return checked


@functools.cache
def guarded_environment() -> GuardedEnvironment:
    """The process-wide guarded environment (it holds no per-render state)."""
    return GuardedEnvironment()
