"""The JSON-pointer walk and the sub-schema walk of ``clonefleet.json_schema``: RFC 6901 pointers
(escapes, array indexes, where they lead nowhere), local refs, and every keyword that holds a
schema, with its pointer and whether it applies in place."""

from __future__ import annotations

from typing import Any

import pytest

from clonefleet.json_schema import (
    Subschema,
    defined_schemas,
    escape_token,
    local_ref_target,
    resolve_pointer,
    schema_nodes,
    subschemas,
)

DOC: dict[str, Any] = {
    "a": {"b": [10, {"c": "deep"}]},
    "x/y": 1,
    "m~n": 2,
    "": {"empty": True},
    "n": None,
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", DOC),
        ("/a/b/0", 10),
        ("/a/b/1/c", "deep"),
        ("/x~1y", 1),
        ("/m~0n", 2),
        ("/", {"empty": True}),
        ("/n", None),
    ],
)
def test_a_pointer_names_the_node_it_leads_to(pointer: str, expected: object) -> None:
    assert resolve_pointer(DOC, pointer) == expected


@pytest.mark.parametrize("pointer", ["/missing", "/a/b/2", "/a/b/-1", "/a/b/x", "/x~1y/z", "a/b"])
def test_a_pointer_that_leads_nowhere_is_a_lookup_error(pointer: str) -> None:
    with pytest.raises(LookupError):
        resolve_pointer(DOC, pointer)


def test_an_escaped_token_reads_back_as_the_name() -> None:
    name = "a/~b~1"
    assert escape_token(name) == "a~1~0b~01"
    assert resolve_pointer({name: 7}, "/" + escape_token(name)) == 7


@pytest.mark.parametrize(
    ("ref", "expected"),
    [("#", DOC), ("#/a/b/0", 10), ("#/missing", None), ("#anchor", None), ("other.json#/a", None)],
)
def test_a_local_ref_names_its_node_and_any_other_ref_none(ref: str, expected: object) -> None:
    assert local_ref_target(DOC, ref) == expected


def test_a_ref_that_is_not_a_string_names_nothing() -> None:
    assert local_ref_target(DOC, 3) is None


SCHEMA: dict[str, Any] = {
    "properties": {"p/q": {"type": "string"}},
    "patternProperties": {"^x": {"type": "integer"}},
    "additionalProperties": False,
    "items": {"type": "number"},
    "prefixItems": [{"const": 1}],
    "allOf": [{"minProperties": 1}],
    "not": {"required": ["z"]},
    "dependentSchemas": {"d": {"required": ["e"]}},
    "$defs": {"t": {"type": "boolean"}},
    "definitions": {"u": {"type": "null"}},
    "description": {"type": "not a schema: an annotation"},
}


def test_every_applied_subschema_is_found_with_its_pointer_and_kind() -> None:
    found = {(sub.pointer, sub.in_place) for sub in subschemas(SCHEMA, "/root")}
    assert found == {
        ("/root/properties/p~1q", False),
        ("/root/patternProperties/^x", False),
        ("/root/additionalProperties", False),
        ("/root/items", False),
        ("/root/prefixItems/0", False),
        ("/root/allOf/0", True),
        ("/root/not", True),
        ("/root/dependentSchemas/d", True),
    }
    assert Subschema(False, "/additionalProperties", False) in list(subschemas(SCHEMA))


def test_definitions_are_apart_from_the_applied_subschemas() -> None:
    assert list(defined_schemas(SCHEMA)) == [
        ({"type": "boolean"}, "/$defs/t"),
        ({"type": "null"}, "/definitions/u"),
    ]


def test_every_pointer_of_the_walk_resolves_to_its_node() -> None:
    nodes = list(schema_nodes({"anyOf": [SCHEMA, True]}))
    assert len(nodes) == 1 + 1 + 9  # the root, SCHEMA, and its nine object subschemas
    for node, pointer in nodes:
        assert resolve_pointer({"anyOf": [SCHEMA, True]}, pointer) is not None
        assert resolve_pointer({"anyOf": [SCHEMA, True]}, pointer) == node


def test_the_walk_does_not_follow_refs_or_enter_annotations() -> None:
    schema = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#"}}, "examples": [{"type": "x"}]}
    assert [pointer for _, pointer in schema_nodes(schema)] == ["", "/$defs/a"]
