"""The sub-schema walk of a Draft 2020-12 schema: which keywords hold schemas, and where."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from clonefleet.json_schema._pointer import escape_token

__all__ = ["Subschema", "defined_schemas", "schema_nodes", "subschemas"]

_Keywords = tuple[str, ...]
_ON_PARTS: _Keywords = ("additionalProperties", "items", "contains", "propertyNames")
_ON_PARTS += ("unevaluatedItems", "unevaluatedProperties")
"""Keywords whose one schema applies to parts of the instance (items, values, names)."""
_IN_PLACE: _Keywords = ("not", "if", "then", "else")
"""Keywords whose one schema applies to the instance in place."""
_MAPS_ON_PARTS: _Keywords = ("properties", "patternProperties")
_MAPS_IN_PLACE: _Keywords = ("dependentSchemas",)
_LISTS_ON_PARTS: _Keywords = ("prefixItems",)
_LISTS_IN_PLACE: _Keywords = ("allOf", "anyOf", "oneOf")
_DEFINITIONS: _Keywords = ("$defs", "definitions")
"""Keywords whose schemas apply only where a ``$ref`` names them."""


class Subschema(NamedTuple):
    """A schema one schema node applies."""

    schema: object
    """The subschema (a schema is a mapping or a boolean; anything else is yielded as it is)."""
    pointer: str
    """Its JSON pointer, from the pointer given for the node."""
    in_place: bool
    """It applies to the same instance (``allOf``, ``not``...), not to a part of it."""


def subschemas(node: Mapping[str, Any], pointer: str = "") -> Iterator[Subschema]:
    """Every subschema ``node`` applies (definitions not included), with its pointer."""
    for group, in_place in ((_ON_PARTS, False), (_IN_PLACE, True)):
        for kw in group:
            if kw in node:
                yield Subschema(node[kw], f"{pointer}/{kw}", in_place)
    for group, in_place in ((_MAPS_ON_PARTS, False), (_MAPS_IN_PLACE, True)):
        for kw in group:
            if isinstance(node.get(kw), dict):
                for name, sub in node[kw].items():
                    yield Subschema(sub, f"{pointer}/{kw}/{escape_token(name)}", in_place)
    for group, in_place in ((_LISTS_ON_PARTS, False), (_LISTS_IN_PLACE, True)):
        for kw in group:
            if isinstance(node.get(kw), list):
                for i, sub in enumerate(node[kw]):
                    yield Subschema(sub, f"{pointer}/{kw}/{i}", in_place)


def defined_schemas(node: Mapping[str, Any], pointer: str = "") -> Iterator[tuple[object, str]]:
    """Every schema of ``node``'s ``$defs`` and ``definitions``, with its pointer."""
    for kw in _DEFINITIONS:
        if isinstance(node.get(kw), dict):
            for name, sub in node[kw].items():
                yield sub, f"{pointer}/{kw}/{escape_token(name)}"


def schema_nodes(schema: object) -> Iterator[tuple[dict[str, Any], str]]:
    """Every object subschema of ``schema`` (itself included) with its JSON pointer,
    definitions included; ``$ref`` is not followed."""
    stack: list[tuple[object, str]] = [(schema, "")]
    while stack:
        node, pointer = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node, pointer
        stack.extend((sub, where) for sub, where, _ in subschemas(node, pointer))
        stack.extend(defined_schemas(node, pointer))
