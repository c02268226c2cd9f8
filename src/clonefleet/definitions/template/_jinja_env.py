"""The guarded Jinja2 sandbox every task prompt and native body is rendered in.

On top of ``ImmutableSandboxedEnvironment`` and ``StrictUndefined``, this module routes every
operation a template can do through the checks of ``_render_budget``, ``_sizes``,
``_format_limits`` and ``_operator_limits`` (under the caps of ``_limits``): each operation's
worst case is bounded from its operands' sizes before it runs, the render's deadline and memory
are checked between operations, every result is checked after, and constant folding is off.
The guarded filters and tests are in ``_jinja_filters``; rendering is in ``_render``. See
docs/definitions.md, "Templating".
"""

from __future__ import annotations

import copy
import functools
import operator
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, cast

from jinja2 import StrictUndefined, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Cycler, Joiner, Namespace

from clonefleet.definitions.template._format_limits import check_format_call, check_printf
from clonefleet.definitions.template._jinja_filters import guard_arg, guarded_filters, guarded_tests
from clonefleet.definitions.template._limits import (
    MAX_DICT_LITERAL,
    MAX_ITEMS,
    MAX_OUTPUT_CHARS,
    MAX_RANGE,
    TemplateLimitError,
    too_big,
)
from clonefleet.definitions.template._operator_limits import (
    check_multiply,
    check_power,
    guard_method,
    join_checked,
)
from clonefleet.definitions.template._render_budget import check_render, current_render_budget
from clonefleet.definitions.template._rows import RowData
from clonefleet.definitions.template._sizes import (
    bounded_iterable,
    charge,
    charge_shell,
    check_comparable,
    check_keys,
    check_len,
    check_text,
    measure,
)

__all__ = ["GuardedEnvironment", "guarded_environment"]


# ---- globals ---------------------------------------------------------------------------------


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


def _finalize(value: Any) -> Any:
    return check_text(value, "an output value")


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
        self.filters = guarded_filters()
        self.tests = guarded_tests()
        self.concat = self.guarded_concat  # type: ignore[method-assign]

    # Hooks referenced from generated code ------------------------------------------------------
    def guard_value(self, value: Any) -> Any:
        return charge_shell(check_len(value, "a literal"))

    def guarded_join(self, items: Iterable[Any]) -> str:
        return join_checked("", items)

    def guarded_concat(self, items: Iterable[Any]) -> str:
        return join_checked("", items)

    def guard_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        budget = current_render_budget()
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
        check_render()
        result: Any = True
        for op, right in ops:
            check_comparable(left, right)
            result = _COMPARE[op](left, right)
            if not result:
                return result
            left = right
        return result

    def guarded_slice(self, obj: Any, start: Any, stop: Any, step: Any) -> Any:
        check_render()
        return charge(obj[start:stop:step], (obj,))

    # Sandbox overrides -------------------------------------------------------------------------
    def getitem(self, obj: Any, argument: Any) -> Any:
        check_render()
        if type(obj) is RowData and isinstance(argument, str) and argument not in obj:
            return _no_field(self, obj, argument)
        return super().getitem(obj, argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        check_render()
        if type(obj) is RowData:
            if attribute in obj:
                return obj[attribute]  # a row's field wins over a dict method of its name
            if not hasattr(dict, attribute):
                return _no_field(self, obj, attribute)
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_render()
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
        check_render()
        args = tuple(guard_arg(a, "a call argument") for a in args)
        kwargs = {k: guard_arg(v, "a call argument") for k, v in kwargs.items()}
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
            check_render()
            if is_format_map:
                check_format_call(fmt, (), args[0] if args else {})
            else:
                check_format_call(fmt, args, kwargs)
            return charge(check_len(wrapper(*args, **kwargs), "a formatted string"))

        return checked


def _no_field(env: GuardedEnvironment, row: RowData, name: str) -> Any:
    """What a template gets for a field a dataset row lacks: undefined, saying so when used."""
    return env.undefined(hint=f"the input row has no field {name!r}", obj=row, name=name)


@functools.cache
def guarded_environment() -> GuardedEnvironment:
    """The process-wide guarded environment (it holds no per-render state)."""
    return GuardedEnvironment()
