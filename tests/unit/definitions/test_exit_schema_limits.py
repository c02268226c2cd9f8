"""Exit schemas that would make exit validation run away are refused at load (docs/definitions.md).

Each case is refused with `invalid-definition` naming the rule and the key, quickly, and without
fetching anything.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clonefleet.definitions import check_exit_schema, load_file
from clonefleet.errors import DefinitionError

pytestmark = pytest.mark.timeout(30)

KEY = "clonefleet.exit_tool_schema"


def _refused(schema: Any) -> str:
    with pytest.raises(DefinitionError) as info:
        check_exit_schema(schema, KEY, "agent.md")
    assert info.value.reason == "invalid-definition" and info.value.field == KEY
    return info.value.message


def fan_out(levels: int, combinator: str = "anyOf") -> dict[str, Any]:
    """A chain of definitions each referencing the next twice: 2**levels subschemas expanded."""
    defs: dict[str, Any] = {
        f"d{i}": {combinator: [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs}


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"properties": {"s": {"pattern": "^(a+)+$"}}}, "/properties/s/pattern"),
        ({"properties": {"s": {"pattern": "(a*)*"}}}, "/properties/s/pattern"),
        ({"properties": {"s": {"pattern": "^(a|a)*$"}}}, "/properties/s/pattern"),
        ({"properties": {"s": {"pattern": "(.*)*x"}}}, "/properties/s/pattern"),
        ({"properties": {"s": {"pattern": r"^(\w+\s?)*$"}}}, "/properties/s/pattern"),
        ({"patternProperties": {"^(a+)+$": {}}}, "/patternProperties"),
        ({"propertyNames": {"pattern": "^(a|aa)+$"}}, "/propertyNames/pattern"),
        ({"$defs": {"p": {"pattern": r"(\d+,?)+$"}}}, "/$defs/p/pattern"),
        ({"properties": {"s": {"pattern": r"(a)\1"}}}, "/properties/s/pattern"),
    ],
)
def test_catastrophic_patterns_are_refused_naming_the_rule_key_and_place(schema, where):
    message = _refused({"type": "object", **schema})
    assert f"[rule exit-schema-pattern, key `{KEY}`]" in message
    assert where in message and "backtrack catastrophically" in message


def test_an_over_long_pattern_is_refused_before_it_is_compiled():
    message = _refused({"properties": {"s": {"pattern": "a" * 1001}}})
    assert "rule exit-schema-pattern" in message and "longer than 1000" in message
    assert "rule exit-schema-pattern" in _refused({"patternProperties": {"b" * 1001: {}}})


@pytest.mark.parametrize(
    "pattern",
    [
        r"^[a-z]+$",
        r"^([a-z0-9-]+\.)+[a-z]{2,}$",  # each pass ends with a dot the inner part cannot match
        r"^(\d+\.)+\d+$",
        r"^(foo|bar)+$",  # branches start differently
        r"^[A-Z][a-z]*( [A-Z][a-z]*)*$",
        r"^(?:\s*\w+\s*,)*\s*\w+\s*$",
        r"^(?:a++)+$",  # possessive and atomic parts never backtrack
        r"^(?>a+)+$",
        r"^sa_[0-9a-f]{8}$",
        r"^(ab){3}$",
    ],
)
def test_patterns_that_cannot_backtrack_catastrophically_load(pattern):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    assert check_exit_schema(schema, KEY, None) == schema


@pytest.mark.parametrize("combinator", ["anyOf", "allOf", "oneOf"])
def test_a_ref_fan_out_of_2_to_the_40_is_refused_without_expanding_it(combinator):
    started = time.monotonic()
    message = _refused(fan_out(40, combinator))
    assert time.monotonic() - started < 10  # counted with memoisation, not expanded
    assert "rule exit-schema-expansion" in message and "more than 50000" in message


def test_a_modest_ref_fan_out_and_a_recursive_schema_load():
    assert check_exit_schema(fan_out(10), KEY, None) == fan_out(10)  # 2**10 subschemas
    tree = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
    }
    assert check_exit_schema(tree, KEY, None) == tree


@pytest.mark.parametrize(
    "schema",
    [
        {"anyOf": [{"$ref": "#"}, {"type": "object"}]},
        {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}}}
        | {"$ref": "#/$defs/a"},
    ],
)
def test_a_ref_cycle_that_never_moves_into_the_payload_is_refused(schema):
    message = _refused(schema)
    assert "rule exit-schema-expansion" in message and "leads back" in message


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"not": schema}
    return schema


def test_schemas_nested_too_deeply_are_refused():
    assert check_exit_schema(_nested(30), KEY, None)
    assert "rule exit-schema-size" in _refused(_nested(70))
    deep_const: list[Any] = []
    for _ in range(100):
        deep_const = [deep_const]
    assert "nests objects and arrays deeper than 64" in _refused({"const": deep_const})


def test_schemas_over_the_size_caps_are_refused():
    assert "more than 10000 values" in _refused({"enum": list(range(20_000))})
    message = _refused({"enum": ["x" * 1000] * 100})
    assert "rule exit-schema-size" in message and "over 65536" in message


def test_a_self_containing_python_object_is_refused_not_looped_on():
    schema: dict[str, Any] = {"type": "object"}
    schema["properties"] = {"me": schema}
    assert "rule exit-schema-size" in _refused(schema)


def test_a_nested_id_and_a_ref_into_non_schema_data_are_refused():
    nested_id = {"$defs": {"a": {"$id": "urn:other", "type": "string"}}, "$ref": "#/$defs/a"}
    assert "only the top level may have an $id" in _refused(nested_id)
    into_const = {
        "properties": {
            "a": {"const": {"pattern": "^(a+)+$"}},
            "b": {"$ref": "#/properties/a/const"},
        }
    }
    assert "does not point at a subschema" in _refused(into_const)


def test_validate_reports_a_pathological_schema_as_invalid_definition(tmp_path: Path):
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "slow.md").write_text(
        "---\nname: slow\ndescription: x\nclonefleet:\n  exit_tool_schema:\n"
        "    type: object\n    properties:\n      s: {type: string, pattern: '^(a+)+$'}\n---\nbody\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "clonefleet", "validate", "--json"],
        cwd=tmp_path,
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stderr
    (error,) = json.loads(out.stdout)["errors"]
    assert error["reason"] == "invalid-definition"
    assert f"[rule exit-schema-pattern, key `{KEY}`]" in error["message"]


def test_load_file_refuses_a_fan_out_declared_in_yaml(write_md: Any, tmp_path: Path):
    lines = ["---", "name: agent", "description: x", "clonefleet:", "  exit_tool_schema:"]
    lines += ["    type: object", "    properties: {x: {$ref: '#/$defs/d0'}}", "    $defs:"]
    lines += [
        f"      d{i}: {{anyOf: [{{$ref: '#/$defs/d{i + 1}'}}, {{$ref: '#/$defs/d{i + 1}'}}]}}"
        for i in range(40)
    ]
    lines += ["      d40: {type: string}", "---", "body", ""]
    path = write_md(tmp_path, "agent.md", "\n".join(lines), dedent=False)
    with pytest.raises(DefinitionError) as info:
        load_file(path)
    assert info.value.reason == "invalid-definition"
    assert f"[rule exit-schema-expansion, key `{KEY}`]" in info.value.message


@pytest.fixture
def recording_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server that serves a schema and records every request."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_a_remote_ref_is_refused_at_load_without_being_fetched(recording_server):
    base, hits = recording_server
    for schema in (
        {"type": "object", "properties": {"s": {"$ref": f"{base}/s.json"}}},
        {"$id": f"{base}/root.json", "properties": {"s": {"$ref": "other.json"}}},
        {"$defs": {"a": {"$dynamicRef": f"{base}/d.json#x"}}},
    ):
        message = _refused(schema)
        assert "rule exit-schema-ref" in message and "never fetched" in message
    assert hits == []
