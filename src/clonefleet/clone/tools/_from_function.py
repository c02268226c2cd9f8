"""Python functions as tools: :func:`tool_from_function`."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Callable
from typing import Any

import pydantic

from clonefleet.clone.tools._tool import Tool, ToolContext
from clonefleet.errors import ToolRetry
from clonefleet.providers import ToolSpec

__all__ = ["tool_from_function"]

_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _doc_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and Google-style ``Args:`` entries of a docstring."""
    doc = inspect.getdoc(fn) or ""
    description = " ".join(doc.split("\n\n")[0].split()) or fn.__name__
    args: dict[str, str] = {}
    lines = doc.splitlines()
    start = next(
        (
            i + 1
            for i, line in enumerate(lines)
            if line.strip() in ("Args:", "Arguments:", "Parameters:")
        ),
        len(lines),
    )
    entry_indent: int | None = None
    current = None
    for raw in lines[start:]:
        if raw.strip() and not raw[0].isspace():
            break  # the next section (Returns:, Raises:, ...)
        indent = len(raw) - len(raw.lstrip())
        match = _ARG_LINE.match(raw.strip())
        if match and (entry_indent is None or indent == entry_indent):
            entry_indent, current = indent, match.group(1).lstrip("*")
            args[current] = match.group(2)
        elif current and raw.strip():
            args[current] = f"{args[current]} {raw.strip()}".strip()
    return description, args


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's generated ``title`` keys (noise for a model); property names are kept."""
    if isinstance(node, list):
        return [_strip_titles(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "patternProperties") and isinstance(value, dict):
            out[key] = {k: _strip_titles(v) for k, v in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


class _FunctionRunner:
    """Runs a Python function as a tool: checks the arguments, calls it, turns the answer into text.

    Module-level and without live state, so a tool pickles with its :class:`CloneSpec` (the
    function itself must be importable or picklable by cloudpickle).
    """

    def __init__(
        self, fn: Callable[..., Any], name: str, ctx_param: str | None, fields: dict[str, Any]
    ) -> None:
        self.fn, self.name, self.ctx_param, self.fields = fn, name, ctx_param, fields
        self._model: type[pydantic.BaseModel] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "fn": self.fn,
            "name": self.name,
            "ctx_param": self.ctx_param,
            "fields": self.fields,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _model=None)

    def model(self) -> type[pydantic.BaseModel]:
        if self._model is None:
            config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
            self._model = pydantic.create_model(
                f"{self.name}_arguments", __config__=config, **self.fields
            )
        return self._model

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            parsed = self.model().model_validate(args)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            raise ToolRetry(f"invalid arguments for {self.name}: {problems}") from None
        kwargs = {k: getattr(parsed, k) for k in self.fields}
        if self.ctx_param:
            kwargs[self.ctx_param] = ctx
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(**kwargs)
        else:
            value = await asyncio.to_thread(self.fn, **kwargs)
        return _as_text(value)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def tool_from_function(
    fn: Callable[..., Any], *, name: str | None = None, parallel_safe: bool = False
) -> Tool:
    """Make a tool of a Python function: its typed parameters become the arguments' JSON Schema.

    Type hints map as pydantic maps them (``int`` → integer, ``list[str]`` → array of strings,
    ``Optional[X]`` → ``X`` or null, ``Literal['a', 'b']`` → an enum, models and dataclasses →
    objects); a parameter without a hint takes any JSON value. Parameters with defaults are
    optional. A parameter annotated :class:`ToolContext` is not shown to the model and receives
    the clone's tool context. The docstring's first paragraph is the description and its
    Google-style ``Args:`` entries describe the parameters. The model's arguments are validated
    first (a mismatch goes back to the model as a tool error). The function may be sync (run in a
    thread) or async; a string answer is returned as it is, anything else as JSON.

    Raises:
        TypeError: the function takes ``*args`` or ``**kwargs``, or a hint cannot be expressed
            as JSON Schema.
    """
    tool_name = name or fn.__name__
    hints = typing.get_type_hints(fn)
    description, arg_docs = _doc_parts(fn)
    fields: dict[str, Any] = {}
    ctx_param = None
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(
                f"tool function {tool_name!r} must take named parameters only, not *{pname}"
            )
        hint = hints.get(pname, Any)
        if hint is ToolContext:
            ctx_param = pname
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hint, pydantic.Field(default, description=arg_docs.get(pname)))
    runner = _FunctionRunner(fn, tool_name, ctx_param, fields)
    try:
        schema = _strip_titles(runner.model().model_json_schema())
    except pydantic.PydanticUserError as exc:
        raise TypeError(
            f"tool function {tool_name!r} has a parameter type without a JSON Schema: {exc}"
        ) from exc
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return Tool(
        spec=ToolSpec(name=tool_name, description=description, parameters=schema),
        run=runner,
        parallel_safe=parallel_safe,
    )
