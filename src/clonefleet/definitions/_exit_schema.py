"""Checks of a declared ``exit_tool_schema``: a valid Draft 2020-12 schema that fetches nothing
and that a clone can apply to any payload in bounded time.

A schema must be plain JSON data, pass the Draft 2020-12 meta-schema and keep every ``$ref``
inside itself (refs are never fetched). Because the clone validates every ``exit_tool`` call
against it, with a payload the model chooses, the schema is also held to limits: its size and
nesting, the work a full expansion of its ``$ref`` graph would do (and no ``$ref`` cycle that
never moves into the payload), and no regular expression that a static check flags as able to
backtrack catastrophically (``_regex_risk``). Enums of ``status``/``kind``/``outcome`` outside
the recognised status families only warn: the exit check would not understand them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from clonefleet.definitions._rules import rule_error
from clonefleet.definitions.template._regex_risk import MAX_PATTERN_CHARS, regex_risk
from clonefleet.json_schema import Subschema, resolve_pointer, schema_nodes, subschemas
from clonefleet.vocab import STATUS_FAMILIES

__all__ = [
    "MAX_SCHEMA_CHARS",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_EXPANSION",
    "MAX_SCHEMA_NODES",
    "check_exit_schema",
    "exit_schema_enum_warnings",
]

MAX_SCHEMA_CHARS = 65_536
"""Longest exit schema, as compact JSON text."""
MAX_SCHEMA_NODES = 10_000
"""Most JSON values (objects, arrays, strings, numbers...) in an exit schema."""
MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of objects and arrays in an exit schema."""
MAX_SCHEMA_EXPANSION = 50_000
"""Most subschemas a full expansion of the schema may visit, every ``$ref`` followed each time."""


def _members(node: object) -> Iterator[tuple[object, object]]:
    """Every ``(key, value)`` of every object inside a JSON document."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                yield k, v
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)


def _walk_refs(node: object) -> list[str]:
    return [v for k, v in _members(node) if k in ("$ref", "$dynamicRef") and isinstance(v, str)]


def _anchors(node: object) -> set[str]:
    return {
        v for k, v in _members(node) if k in ("$anchor", "$dynamicAnchor") and isinstance(v, str)
    }


def _measure(schema: object) -> str | None:
    """Why ``schema`` is too big or too deep, or ``None``; stops early, so any object is safe."""
    nodes, stack = 0, [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            return f"the exit schema has more than {MAX_SCHEMA_NODES} values"
        if isinstance(node, (dict, list, tuple)):
            if depth > MAX_SCHEMA_DEPTH:
                return f"the exit schema nests objects and arrays deeper than {MAX_SCHEMA_DEPTH}"
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return None


def _check_patterns(schema: object, key: str, path: str | None) -> None:
    for node, pointer in schema_nodes(schema):
        found = (
            [(node["pattern"], f"{pointer}/pattern")]
            if isinstance(node.get("pattern"), str)
            else []
        )
        if isinstance(node.get("patternProperties"), dict):
            found += [(p, f"{pointer}/patternProperties") for p in node["patternProperties"]]
        for pattern, where in found:
            risk = regex_risk(pattern)
            if risk is not None:
                shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
                raise rule_error(
                    "exit-schema-pattern",
                    key,
                    f"the regular expression {shown!r} at {where or '/'} {risk}",
                    path,
                )


@dataclass(slots=True)
class _Frame:
    node: object
    pointer: str
    descents: int
    """Subschema edges into parts of the payload between the root and this node."""
    children: list[Subschema] = field(default_factory=list)
    next: int = 0
    total: int = 1


class _Expansion:
    """Counts the subschemas a full expansion visits, following every ``$ref`` each time it is
    met (each node's count is memoised, so a fan-out of 2**40 costs a few steps to count). A
    ``$ref`` back to a node being expanded counts once; a cycle of such refs that never moves
    into a part of the payload (``{"anyOf": [{"$ref": "#"}]}``) would recurse forever."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.anchors: dict[str, object] = {}
        for node, _ in schema_nodes(root):
            for kw in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(kw), str):
                    self.anchors.setdefault(node[kw], node)

    def _target(self, ref: str) -> object | None:
        fragment = ref[1:] if ref.startswith("#") else None
        if fragment is None:
            return None
        if fragment and not fragment.startswith("/"):
            return self.anchors.get(fragment)
        try:
            return resolve_pointer(self.root, fragment)
        except LookupError:
            return None

    def _children(self, frame: _Frame) -> list[Subschema]:
        node = frame.node
        if not isinstance(node, dict):
            return []
        found = [c for c in subschemas(node, frame.pointer) if isinstance(c.schema, (dict, bool))]
        for kw in ("$ref", "$dynamicRef"):
            target = self._target(node[kw]) if isinstance(node.get(kw), str) else None
            if isinstance(target, (dict, bool)):
                found.append(Subschema(target, f"{frame.pointer}/{kw}", True))
        return found

    def count(self) -> tuple[int, str | None]:
        """``(count, pointer of an in-place cycle or None)``; stops once over the cap."""
        memo: dict[int, int] = {}
        stack = [_Frame(self.root, "", 0)]
        stack[0].children = self._children(stack[0])
        open_at = {id(self.root): 0}
        while stack:
            frame = stack[-1]
            if frame.next < len(frame.children):
                child, where, in_place = frame.children[frame.next]
                frame.next += 1
                if id(child) in memo:
                    frame.total += memo[id(child)]
                elif id(child) in open_at:
                    if in_place and open_at[id(child)] == frame.descents:
                        return frame.total, where
                    frame.total += 1
                else:
                    descents = frame.descents + (0 if in_place else 1)
                    stack.append(_Frame(child, where, descents))
                    stack[-1].children = self._children(stack[-1])
                    open_at[id(child)] = descents
                continue
            stack.pop()
            del open_at[id(frame.node)]
            memo[id(frame.node)] = frame.total
            if frame.total > MAX_SCHEMA_EXPANSION:
                return frame.total, None
            if stack:
                stack[-1].total += frame.total
        return memo[id(self.root)], None


def _check_expansion(plain: dict[str, Any], key: str, path: str | None) -> None:
    total, cycle = _Expansion(plain).count()
    if cycle is not None:
        raise rule_error(
            "exit-schema-expansion",
            key,
            f"the $ref at {cycle} leads back to where it started without moving into the payload"
            " (validation would never end)",
            path,
        )
    if total > MAX_SCHEMA_EXPANSION:
        raise rule_error(
            "exit-schema-expansion",
            key,
            f"a full expansion of the schema's $ref graph visits more than {MAX_SCHEMA_EXPANSION}"
            " subschemas",
            path,
        )


def _plain_json(schema: object, key: str, path: str | None) -> dict[str, Any]:
    """``schema`` as plain JSON data, within the size and depth limits."""
    if not isinstance(schema, dict):
        raise rule_error("exit-schema-invalid", key, "the exit schema must be a JSON object", path)
    problem = _measure(schema)
    if problem is not None:
        raise rule_error("exit-schema-size", key, problem, path)
    try:
        text = json.dumps(schema, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise rule_error(
            "exit-schema-invalid", key, f"the exit schema is not JSON data ({exc})", path
        ) from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise rule_error(
            "exit-schema-size",
            key,
            f"the exit schema is {len(text)} characters of JSON, over {MAX_SCHEMA_CHARS}",
            path,
        )
    plain: dict[str, Any] = json.loads(text)
    return plain


def _check_meta_schema(plain: dict[str, Any], key: str, path: str | None) -> None:
    for node, pointer in schema_nodes(plain):  # long patterns are refused before compiling them
        names = node.get("patternProperties")
        for pattern in [node.get("pattern"), *(names if isinstance(names, dict) else ())]:
            if isinstance(pattern, str) and len(pattern) > MAX_PATTERN_CHARS:
                raise rule_error(
                    "exit-schema-pattern",
                    key,
                    f"a regular expression at {pointer or '/'} is longer than {MAX_PATTERN_CHARS}"
                    " characters",
                    path,
                )
    try:
        jsonschema.Draft202012Validator.check_schema(plain)
    except jsonschema.SchemaError as exc:
        raise rule_error(
            "exit-schema-invalid",
            key,
            f"not a valid Draft 2020-12 JSON Schema at {exc.json_path}: {exc.message}",
            path,
        ) from None
    except RecursionError:
        raise rule_error(
            "exit-schema-invalid", key, "a regular expression nests groups too deeply", path
        ) from None


def _check_refs(plain: dict[str, Any], key: str, path: str | None) -> None:
    anchors = _anchors(plain)
    subschemas = {id(node) for node, _ in schema_nodes(plain)}
    for ref in _walk_refs(plain):
        if not ref.startswith("#"):
            raise rule_error(
                "exit-schema-ref",
                key,
                f"$ref {ref!r} points outside the schema document (refs are never fetched)",
                path,
            )
        fragment = ref[1:]
        if fragment and not fragment.startswith("/"):
            if fragment not in anchors:
                raise rule_error(
                    "exit-schema-ref", key, f"$ref {ref!r} names no anchor in the document", path
                )
            continue
        try:
            target = resolve_pointer(plain, fragment)
        except LookupError:
            raise rule_error(
                "exit-schema-ref", key, f"$ref {ref!r} does not resolve inside the document", path
            ) from None
        if not isinstance(target, bool) and id(target) not in subschemas:
            raise rule_error(
                "exit-schema-ref", key, f"$ref {ref!r} does not point at a subschema", path
            )
    for node, pointer in schema_nodes(plain):
        if pointer and isinstance(node.get("$id"), str):
            raise rule_error(
                "exit-schema-ref",
                key,
                f"$id at {pointer} would change what the `#` refs below it mean; only the top"
                " level may have an $id",
                path,
            )


def check_exit_schema(schema: object, key: str, path: str | None) -> dict[str, Any]:
    """Validate a declared ``exit_tool_schema`` and return it as plain JSON data.

    Raises:
        DefinitionError: ``invalid-definition`` with rule ``exit-schema-invalid`` (not a Draft
            2020-12 schema, not JSON data), ``exit-schema-ref`` (a ``$ref`` outside the
            document, a nested ``$id``), ``exit-schema-size`` (too large or too deep),
            ``exit-schema-pattern`` (a regular expression too long or flagged as catastrophic)
            or ``exit-schema-expansion`` (``$ref`` fan-out over the cap, an endless ``$ref`` cycle).
    """
    plain = _plain_json(schema, key, path)
    _check_meta_schema(plain, key, path)
    _check_refs(plain, key, path)
    _check_patterns(plain, key, path)
    _check_expansion(plain, key, path)
    return plain


def exit_schema_enum_warnings(schema: Mapping[str, Any], key: str) -> list[str]:
    """Warn about ``status``/``kind``/``outcome`` string enums outside the recognised families."""
    recognised = frozenset().union(*STATUS_FAMILIES.values())
    warnings: list[str] = []
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return warnings
    for field_name in ("status", "kind", "outcome"):
        prop = properties.get(field_name)
        if (
            isinstance(prop, dict)
            and isinstance(prop.get("$ref"), str)
            and prop["$ref"].startswith("#/")
        ):
            try:
                prop = resolve_pointer(schema, prop["$ref"][1:])
            except LookupError:
                continue
        if not isinstance(prop, dict):
            continue
        values = list(prop.get("enum") or []) if isinstance(prop.get("enum"), list) else []
        if "const" in prop:
            values.append(prop["const"])
        odd = [v for v in values if isinstance(v, str) and v.lower() not in recognised]
        if odd:
            warnings.append(
                f"`{key}` property `{field_name}` allows {', '.join(repr(v) for v in odd)}, outside the recognised"
                " status families (success/ok/done/completed, failure/failed/error, cancelled/canceled/cancel);"
                " the exit check will not recognise them - use recognised values or add a `success` boolean"
            )
    if schema.get("type") not in ("object", None):
        warnings.append(
            f"`{key}` top-level type is not `object`; exit_tool arguments are always an object"
        )
    return warnings
