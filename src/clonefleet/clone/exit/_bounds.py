"""Exit payload validation bounded in size and time.

:func:`payload_problem` refuses a payload over the size and depth caps before any validation.
:class:`BoundedValidator` is a Draft 2020-12 validator whose every keyword and type check looks
at the deadline set by :func:`deadline` (a passed deadline raises :class:`OutOfTime`), whose
regular expressions run on the ``regex`` engine with the time left as their timeout, and whose
``uniqueItems`` hashes each item once. See docs/definitions.md, "Exit schema limits".
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import reprlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jsonschema
import jsonschema.protocols
import regex
from jsonschema.exceptions import ValidationError

from clonefleet.json_schema import defined_schemas, local_ref_target, subschemas

__all__ = [
    "EXIT_VALIDATION_TIMEOUT_S",
    "MAX_PAYLOAD_CHARS",
    "MAX_PAYLOAD_DEPTH",
    "MAX_PAYLOAD_VALUES",
    "BadPattern",
    "BoundedValidator",
    "OutOfTime",
    "deadline",
    "payload_problem",
    "short_repr",
    "without_dialects",
]

EXIT_VALIDATION_TIMEOUT_S = 2.0
"""Wall-clock budget of checking one ``exit_tool`` payload against the exit schema."""
MAX_PAYLOAD_VALUES = 100_000
"""Most JSON values (objects, arrays, strings, numbers...) in an exit payload."""
MAX_PAYLOAD_DEPTH = 64
"""Deepest nesting of objects and arrays in an exit payload."""
MAX_PAYLOAD_CHARS = 1 << 20
"""Most characters in an exit payload's strings and keys, all together."""

_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar(
    "clonefleet_exit_deadline", default=math.inf
)
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = 6


class OutOfTime(Exception):
    """The validation in progress passed its deadline."""


class BadPattern(Exception):
    """A schema pattern that ``re`` accepted (the meta-schema check) but ``regex`` refuses."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bound the validations run inside the block to ``seconds`` in all."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _check() -> None:
    if time.monotonic() > _DEADLINE.get():
        raise OutOfTime


def short_repr(value: object) -> str:
    """``repr`` cut to at most 120 characters, at a cost that does not grow with ``value``."""
    text = _REPR.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def payload_problem(payload: object) -> str | None:
    """Why ``payload`` is over the size or depth caps, or ``None``; stops early at any size."""
    values, chars, stack = 0, 0, [(payload, 1)]
    while stack:
        node, depth = stack.pop()
        values += 1
        if isinstance(node, str):
            chars += len(node)
        elif isinstance(node, (dict, list, tuple)):
            if depth > MAX_PAYLOAD_DEPTH:
                return f"the payload nests objects and arrays deeper than {MAX_PAYLOAD_DEPTH}"
            if values + len(node) > MAX_PAYLOAD_VALUES:
                break
            if isinstance(node, dict):
                chars += sum(len(k) for k in node if isinstance(k, str))
                stack.extend((v, depth + 1) for v in node.values())
            else:
                stack.extend((v, depth + 1) for v in node)
        if chars > MAX_PAYLOAD_CHARS:
            return f"the payload's strings and keys hold more than {MAX_PAYLOAD_CHARS} characters"
    else:
        return None
    return f"the payload has more than {MAX_PAYLOAD_VALUES} values"


# -- regular expressions --------------------------------------------------------------------------
@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> regex.Pattern[str]:
    try:
        return regex.compile(pattern)
    except regex.error as exc:
        raise BadPattern(f"the regex engine refuses pattern {pattern!r} ({exc})") from None


def _search(pattern: str, text: str) -> bool:
    """``re.search`` semantics on the ``regex`` engine, stopped at the deadline."""
    _check()
    left = _DEADLINE.get() - time.monotonic()
    try:
        found = _compiled(pattern).search(
            text, concurrent=True, timeout=None if math.isinf(left) else max(left, 0.001)
        )
    except TimeoutError:
        raise OutOfTime from None
    return found is not None


def _pattern(
    validator: Any, patrn: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{short_repr(instance)} does not match {patrn!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for k, v in instance.items():
            if _search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _matches_any(patterns: Iterable[str], name: str) -> bool:
    return any(_search(p, name) for p in patterns)


def _additional_properties(
    validator: Any, aP: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [p for p in instance if p not in properties and not _matches_any(patterns, p)]
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(p) for p in sorted(patterns))
            yield ValidationError(
                f"{_names(extras)} {verb} not match any of the regexes: {regexes}"
            )
        else:
            yield ValidationError(f"Additional properties are not allowed ({_unexpected(extras)})")


def _names(keys: Iterable[str]) -> str:
    shown = sorted(keys)
    more = f" and {len(shown) - 8} more" if len(shown) > 8 else ""
    return ", ".join(short_repr(k) for k in shown[:8]) + more


def _unexpected(keys: list[str]) -> str:
    return f"{_names(keys)} {'was' if len(keys) == 1 else 'were'} unexpected"


def _evaluated_keys(validator: Any, instance: Mapping[str, Any], schema: Any) -> set[str]:
    """The keys of ``instance`` that ``schema`` evaluates (jsonschema's rule, bounded regexes)."""
    if validator.is_type(schema, "boolean"):  # the type check also looks at the deadline
        return set()
    keys: set[str] = set()
    for kw in ("$ref", "$dynamicRef"):
        if isinstance(schema.get(kw), str):
            resolved = validator._resolver.lookup(schema[kw])
            sub = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(sub, instance, resolved.contents)
    if validator.is_type(schema.get("properties"), "object"):
        keys |= schema["properties"].keys() & instance.keys()
    for kw in ("additionalProperties", "unevaluatedProperties"):
        if (sub := schema.get(kw)) is not None:
            keys |= {k for k, v in instance.items() if _valid(validator.descend(v, sub))}
    if patterns := schema.get("patternProperties"):
        keys |= {k for k in instance if _matches_any(patterns, k)}
    for name, sub in (schema.get("dependentSchemas") or {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, sub)
    for kw in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(kw, []):
            if _valid(validator.descend(instance, sub)):
                keys |= _evaluated_keys(validator, instance, sub)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _unevaluated_properties(
    validator: Any, uP: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    bad = [
        k
        for k in instance
        if k not in evaluated and not _valid(validator.descend(instance[k], uP, path=k))
    ]
    if bad and uP is False:
        yield ValidationError(f"Unevaluated properties are not allowed ({_unexpected(bad)})")
    elif bad:
        yield ValidationError(
            "Unevaluated properties are not valid under the given schema"
            f" ({_names(bad)} {'was' if len(bad) == 1 else 'were'} unevaluated and invalid)"
        )


# -- uniqueItems ----------------------------------------------------------------------------------
def _canonical(value: object) -> object:
    """A hashable key equal for JSON-equal values (``1 == 1.0``; ``true`` is not ``1``)."""
    if value is True or value is False:
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_canonical(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if value is None or isinstance(value, str):
        return value
    return ("other", repr(value))


def _unique_items(
    validator: Any, uI: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not uI or not validator.is_type(instance, "array"):
        return
    seen: set[object] = set()
    for i, item in enumerate(instance):
        if i % 256 == 0:
            _check()
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"{short_repr(instance)} has non-unique elements")
            return
        seen.add(key)


# -- the schema as validated ----------------------------------------------------------------------
def without_dialects(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` with no ``$schema`` in any subschema or ``#/...`` ref target.

    jsonschema picks the validator class of each subschema it enters by that subschema's
    ``$schema``; one naming Draft 2020-12 would bring back the stock, unbounded class. Every
    exit schema is checked as Draft 2020-12 already, so the keyword changes nothing else.
    """
    copy: dict[str, Any] = json.loads(json.dumps(schema))
    seen: set[int] = set()
    stack: list[Any] = [copy]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        node.pop("$schema", None)
        stack.extend(sub.schema for sub in subschemas(node))
        stack.extend(schema for schema, _ in defined_schemas(node))
        stack.extend(local_ref_target(copy, node.get(kw)) for kw in ("$ref", "$dynamicRef"))
    return copy


# -- the validator class --------------------------------------------------------------------------
_Keyword = Callable[[Any, Any, Any, Mapping[str, Any]], Any]


def _timed(keyword: _Keyword) -> _Keyword:
    """``keyword``, refused once the deadline has passed."""

    def timed(validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]) -> Any:
        _check()
        return keyword(validator, value, instance, schema)

    return timed


def _timed_type(name: str) -> Callable[[Any, Any], bool]:
    base = jsonschema.Draft202012Validator.TYPE_CHECKER

    def is_type(checker: Any, instance: Any) -> bool:
        _check()
        result: bool = base.is_type(instance, name)
        return result

    return is_type


_BOUNDED_KEYWORDS: dict[str, _Keyword] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
    "uniqueItems": _unique_items,
}
_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")

_extend: Callable[..., type[jsonschema.protocols.Validator]] = jsonschema.validators.extend

BoundedValidator = _extend(
    jsonschema.Draft202012Validator,
    validators={
        name: _timed(_BOUNDED_KEYWORDS.get(name) or keyword)
        for name, keyword in jsonschema.Draft202012Validator.VALIDATORS.items()
    },
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {name: _timed_type(name) for name in _TYPES}
    ),
)
"""Draft 2020-12, bounded: see the module docstring. Use it inside :func:`deadline`."""
