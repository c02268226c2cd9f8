"""A quick yes for the common exit schema: a plain Python check compiled from a schema that uses
only simple keywords.

Every clone of a batch ends with one ``exit_tool`` call, and nearly every payload is valid. The
full Draft 2020-12 validator takes tens of microseconds a payload (its keyword dispatch, its
deadline checks); the compiled check takes a few. It only ever says "valid": a payload it does
not accept, or a schema with any keyword it does not know, goes through the full validator,
which also writes the error message. So it must never accept what the full validator refuses;
``tests/unit/clone/exit/test_exit_quick.py`` compares the two on generated schemas and payloads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["Check", "quick_check"]

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_KNOWN = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
}
_MAX_NODES = 200
"""Schemas larger than this get no quick check (compiling one is not worth it)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": _is_number,
    "integer": lambda v: _is_number(v) and (isinstance(v, int) or v.is_integer()),
}


class _Unsupported(Exception):
    """The schema uses something the quick check does not do."""


def quick_check(schema: Any) -> Check | None:
    """A function that returns ``True`` only for payloads ``schema`` accepts (``False`` means
    "ask the full validator"), or ``None`` when ``schema`` uses a keyword it does not handle."""
    try:
        return _compile(schema, [0])
    except _Unsupported:
        return None


def _compile(schema: Any, nodes: list[int]) -> Check:
    nodes[0] += 1
    if nodes[0] > _MAX_NODES:
        raise _Unsupported
    if schema is True or schema == {}:
        return lambda v: True
    if schema is False:
        return lambda v: False
    if not isinstance(schema, dict) or not _KNOWN.issuperset(schema):
        raise _Unsupported
    checks = [_type(schema["type"])] if "type" in schema else []
    checks += _object_checks(schema, nodes)
    if "items" in schema:
        item = _compile(schema["items"], nodes)
        checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    if "enum" in schema:
        checks.append(_enum(schema["enum"]))
    checks += _bounds(schema)
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(check(v) for check in checks)


def _type(spec: Any) -> Check:
    names = [spec] if isinstance(spec, str) else spec
    if not isinstance(names, list) or not names or any(n not in _TYPES for n in names):
        raise _Unsupported
    tests = [_TYPES[n] for n in names]
    if len(tests) == 1:
        return tests[0]
    return lambda v: any(test(v) for test in tests)


def _object_checks(schema: dict[str, Any], nodes: list[int]) -> list[Check]:
    out: list[Check] = []
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise _Unsupported
    compiled = {name: _compile(sub, nodes) for name, sub in props.items()}
    if compiled:
        out.append(
            lambda v: (
                not isinstance(v, dict)
                or all(check(v[k]) for k, check in compiled.items() if k in v)
            )
        )
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _Unsupported
    if required:
        out.append(lambda v: not isinstance(v, dict) or all(r in v for r in required))
    if "additionalProperties" in schema:
        extra = (
            _compile(schema["additionalProperties"], nodes)
            if schema["additionalProperties"] is not False
            else None
        )
        known = frozenset(props)
        if extra is None:
            out.append(lambda v: not isinstance(v, dict) or known.issuperset(v))
        else:
            out.append(
                lambda v: (
                    not isinstance(v, dict) or all(extra(x) for k, x in v.items() if k not in known)
                )
            )
    return out


def _enum(values: Any) -> Check:
    # Only strings: the full validator's equality tells 1 from True and 1.0 from 1 in ways a
    # set lookup does not.
    if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
        raise _Unsupported
    allowed = frozenset(values)
    return lambda v: isinstance(v, str) and v in allowed


def _bounds(schema: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    for key, low in (("minLength", True), ("maxLength", False)):
        if key in schema:
            n = schema[key]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise _Unsupported
            out.append(_length(n, low))
    for key, low in (("minimum", True), ("maximum", False)):
        if key in schema:
            n = schema[key]
            if not _is_number(n) or not math.isfinite(n):
                raise _Unsupported
            out.append(_limit(n, low))
    return out


def _length(n: int, low: bool) -> Check:
    if low:
        return lambda v: not isinstance(v, str) or len(v) >= n
    return lambda v: not isinstance(v, str) or len(v) <= n


def _limit(n: float, low: bool) -> Check:
    if low:
        return lambda v: not _is_number(v) or (math.isfinite(v) and v >= n)
    return lambda v: not _is_number(v) or (math.isfinite(v) and v <= n)
