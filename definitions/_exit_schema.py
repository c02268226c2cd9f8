"""Checks of a declared ``exit_tool_schema``: a valid Draft 2020-12 schema that fetches nothing.

A schema must be plain JSON data, pass the Draft 2020-12 meta-schema and keep every ``$ref``
inside itself (refs are never fetched). Enums of ``status``/``kind``/``outcome`` outside the
recognised status families only warn: the exit check would not understand them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema

from ..vocab import STATUS_FAMILIES
from ._rules import rule_error

__all__ = ["check_exit_schema", "exit_schema_enum_warnings"]


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


def _resolve_pointer(doc: object, fragment: str) -> object:
    """Resolve ``#/a/b`` inside ``doc``; raise ``LookupError`` when it leads nowhere."""
    node = doc
    for token in fragment.lstrip("/").split("/") if fragment.strip("/") else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise LookupError(token)
    return node


def check_exit_schema(schema: object, key: str, path: str | None) -> dict[str, Any]:
    """Validate a declared ``exit_tool_schema`` and return it as plain JSON data.

    Raises:
        DefinitionError: ``invalid-definition`` with rule ``exit-schema-invalid`` (not a Draft
            2020-12 schema, not JSON data) or ``exit-schema-ref`` (a ``$ref`` outside the document).
    """
    if not isinstance(schema, dict):
        raise rule_error("exit-schema-invalid", key, "the exit schema must be a JSON object", path)
    try:
        plain: dict[str, Any] = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise rule_error(
            "exit-schema-invalid", key, f"the exit schema is not JSON data ({exc})", path
        ) from None
    try:
        jsonschema.Draft202012Validator.check_schema(plain)
    except jsonschema.SchemaError as exc:
        raise rule_error(
            "exit-schema-invalid",
            key,
            f"not a valid Draft 2020-12 JSON Schema at {exc.json_path}: {exc.message}",
            path,
        ) from None
    anchors = _anchors(plain)
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
            _resolve_pointer(plain, fragment)
        except LookupError:
            raise rule_error(
                "exit-schema-ref", key, f"$ref {ref!r} does not resolve inside the document", path
            ) from None
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
                prop = _resolve_pointer(schema, prop["$ref"][1:])
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
