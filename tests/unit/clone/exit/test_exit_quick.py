"""The exit judge's quick check never accepts a payload the full Draft 2020-12 validator refuses,
and it does accept the ordinary valid payload, so the fast path is really taken."""

from __future__ import annotations

import math
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.clone import ExitJudge, Verdict
from clonefleet.clone.exit._quick import quick_check
from clonefleet.definitions import DEFAULT_EXIT_SCHEMA

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=600,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

KEYS = ["success", "summary", "n", "items", "status", ""]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | st.sampled_from([0.0, 1.0, -1.0, 2.5, math.inf, 10.0**300])
    | st.text(max_size=6)
    | st.sampled_from(["ok", "done", "success", ""])
)
payloads = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner),
    max_leaves=12,
)

TYPE_NAMES = ["object", "array", "string", "boolean", "null", "number", "integer"]
leaf_schemas = st.one_of(
    st.just({}),
    st.booleans(),
    st.builds(lambda t: {"type": t}, st.sampled_from(TYPE_NAMES)),
    st.builds(
        lambda ts: {"type": ts}, st.lists(st.sampled_from(TYPE_NAMES), min_size=1, unique=True)
    ),
    st.builds(
        lambda e: {"enum": e},
        st.lists(st.sampled_from(["ok", "done", "", "1"]), min_size=1, unique=True),
    ),
    st.builds(lambda n: {"minLength": n}, st.integers(0, 4)),
    st.builds(lambda n: {"maxLength": n}, st.integers(0, 4)),
    st.builds(lambda n: {"minimum": n}, st.integers(-3, 3) | st.floats(-3, 3)),
    st.builds(lambda n: {"maximum": n}, st.integers(-3, 3) | st.floats(-3, 3)),
    st.just({"type": "string", "description": "annotations are ignored", "default": 1}),
)


def _object(props: dict[str, Any], required: list[str], extra: Any, typed: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {"properties": props, "required": sorted(set(required))}
    if extra is not None:
        schema["additionalProperties"] = extra
    if typed:
        schema["type"] = "object"
    return schema


schemas = st.recursive(
    leaf_schemas,
    lambda inner: (
        st.builds(
            _object,
            st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
            st.lists(st.sampled_from(KEYS), max_size=2),
            st.none() | st.booleans() | inner,
            st.booleans(),
        )
        | st.builds(lambda item: {"type": "array", "items": item}, inner)
    ),
    max_leaves=6,
)


def _agrees(schema: Any, payload: Any) -> None:
    check = quick_check(schema)
    assert check is not None  # every generated schema uses only what the quick check does
    try:
        accepted = check(payload)
    except Exception:  # noqa: BLE001 - the judge treats a raise as "ask the full validator"
        accepted = False
    if accepted:
        assert jsonschema.Draft202012Validator(schema).is_valid(payload)


@FUZZ
@given(schema=schemas, payload=payloads)
def test_the_quick_check_never_accepts_what_the_full_validator_refuses(
    schema: Any, payload: Any
) -> None:
    _agrees(schema, payload)


@FUZZ
@given(schema=leaf_schemas, payload=scalars)
def test_each_keyword_alone_agrees_with_the_full_validator(schema: Any, payload: Any) -> None:
    _agrees(schema, payload)


@pytest.mark.parametrize(
    ("schema", "payload"),
    [
        ({"maxLength": 2}, "abc"),
        ({"minLength": 2}, "a"),
        ({"type": "integer"}, 1.5),
        ({"type": "integer"}, True),
        ({"type": "number"}, False),
        ({"minimum": 1}, 0.5),
        ({"maximum": 1}, math.inf),
        ({"enum": ["ok"]}, "OK"),
        ({"properties": {"a": {"type": "string"}}}, {"a": 1}),
        ({"required": ["a"]}, {"b": 1}),
        ({"properties": {"a": {}}, "additionalProperties": False}, {"a": 1, "b": 2}),
        ({"additionalProperties": {"type": "string"}}, {"b": 2}),
        ({"type": "array", "items": {"type": "string"}}, ["a", 1]),
        ({"type": ["string", "null"]}, 0),
    ],
)
def test_each_keyword_refuses_what_it_should(schema: Any, payload: Any) -> None:
    check = quick_check(schema)
    assert check is not None and check(payload) is False


@FUZZ
@given(schema=schemas, payload=payloads)
def test_the_judge_decides_the_same_with_or_without_the_quick_check(
    schema: Any, payload: Any
) -> None:
    quick, full = ExitJudge(schema), ExitJudge(schema, quick=False)
    assert quick.judge(payload) == full.judge(payload)


@pytest.mark.parametrize(
    "payload",
    [
        {"success": True, "summary": "read 3 files"},
        {"success": False, "summary": "", "extra": [1, {"a": None}]},
    ],
)
def test_ordinary_payloads_pass_the_quick_check(payload: Any) -> None:
    check = quick_check(DEFAULT_EXIT_SCHEMA)
    assert check is not None and check(payload) is True
    assert ExitJudge(DEFAULT_EXIT_SCHEMA).judge(payload).verdict is Verdict.ACCEPT


@pytest.mark.parametrize(
    "payload",
    [{"success": "yes", "summary": "x"}, {"summary": "x"}, [], None, {"success": 1, "summary": ""}],
)
def test_invalid_payloads_fall_through_to_the_worded_problem(payload: Any) -> None:
    check = quick_check(DEFAULT_EXIT_SCHEMA)
    assert check is not None and check(payload) is False
    decision = ExitJudge(DEFAULT_EXIT_SCHEMA).judge(payload)
    assert decision.verdict is Verdict.RETRY and decision.error
    assert decision.error.startswith("exit_tool rejected:")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^a"},
        {"$ref": "#/$defs/x", "$defs": {"x": {}}},
        {"enum": [1, True]},
        {"type": "object", "properties": {"a": {"format": "email"}}},
        {"anyOf": [{"type": "string"}]},
        {"minimum": math.nan},
        {"type": "decimal"},
        {"type": []},
    ],
)
def test_schemas_with_other_keywords_get_no_quick_check(schema: Any) -> None:
    assert quick_check(schema) is None


def test_an_oversized_payload_is_never_taken_by_the_quick_check() -> None:
    deep: Any = "leaf"
    for _ in range(200):
        deep = [deep]
    decision = ExitJudge({"type": "object"}).judge({"success": True, "summary": "x", "d": deep})
    assert decision.verdict is Verdict.RETRY
    assert decision.error is not None and "deeper than" in decision.error
