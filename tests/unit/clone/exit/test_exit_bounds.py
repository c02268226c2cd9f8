"""Exit validation is bounded in size and time, whatever the schema and payload (docs/definitions.md).

The schemas here bypass the definition loader (which would refuse most of them): the clone's own
check must end anyway. A short deadline keeps each case fast; without the bounds, each would run
for hours (``^(a|aa)+$`` against 60 ``a`` and a ``b`` backtracks about 10**12 times).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from clonefleet.clone import Clone, ExitJudge, Verdict, schema_errors
from clonefleet.definitions import DEFAULT_EXIT_SCHEMA
from clonefleet.testing import ScriptedModel, call, make_spec, reply
from clonefleet.vocab import Outcome, StopReason

pytestmark = pytest.mark.timeout(30)

SLOW = "^(a|aa)+$"
"""Exponential on the backtracking engines (``re`` and ``regex``) for a non-matching text."""
SLOW_TEXT = "a" * 60 + "b"
TIMEOUT_S = 0.2
TIMED_OUT = "took longer than 0.2 s"


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def _judged(schema: dict[str, Any], payload: Any, **judge_args: Any) -> tuple[Any, float]:
    judge = ExitJudge(schema, timeout_s=TIMEOUT_S, **judge_args)
    started = time.monotonic()
    decision = judge.judge(payload)
    return decision, time.monotonic() - started


def fan_out(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "string"}
    return {**_object(x={"$ref": "#/$defs/d0"}), "$defs": defs}


@pytest.mark.parametrize(
    ("schema", "payload"),
    [
        (_object(s={"type": "string", "pattern": SLOW}), {"s": SLOW_TEXT}),
        ({"type": "object", "patternProperties": {SLOW: {"type": "string"}}}, {SLOW_TEXT: 1}),
        ({"type": "object", "propertyNames": {"pattern": SLOW}}, {SLOW_TEXT: 1}),
        (
            {"type": "object", "patternProperties": {SLOW: {}}, "additionalProperties": False},
            {SLOW_TEXT: 1},
        ),
        (
            {"type": "object", "patternProperties": {SLOW: {}}, "unevaluatedProperties": False},
            {SLOW_TEXT: 1},
        ),
        # A subschema naming its dialect must not bring back jsonschema's stock, unbounded class.
        (
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                **_object(s={"pattern": SLOW}, c={"$ref": "#"}),
            },
            {"c": {"c": {"s": SLOW_TEXT}}},
        ),
        (fan_out(40), {"x": 1}),  # 2**40 subschemas to visit
        (fan_out(40) | {"unevaluatedProperties": False}, {"x": 1}),
    ],
    ids=[
        "pattern",
        "patternProperties",
        "propertyNames",
        "additionalProperties",
        "unevaluatedProperties",
        "dollar-schema",
        "ref-fan-out",
        "ref-fan-out-unevaluated",
    ],
)
def test_a_check_that_runs_out_of_time_goes_back_to_the_model_as_a_tool_error(schema, payload):
    decision, elapsed = _judged(schema, payload)
    assert decision.verdict is Verdict.RETRY
    assert decision.error.startswith("exit_tool rejected: ") and TIMED_OUT in decision.error
    assert elapsed < 10  # bounded: the deadline plus scheduling noise on a busy machine


def test_a_matching_text_still_passes_the_bounded_pattern():
    schema = _object(s={"type": "string", "pattern": SLOW}, status={"type": "string"})
    decision, _ = _judged(schema, {"s": "a" * 60, "status": "done"})
    assert (decision.verdict, decision.outcome) == (Verdict.ACCEPT, Outcome.SUCCESS)
    decision, _ = _judged(schema, {"s": "b"})
    assert decision.verdict is Verdict.RETRY and "does not match" in decision.error


def test_unique_items_over_a_huge_array_is_linear_and_keeps_json_equality():
    schema = _object(items={"type": "array", "uniqueItems": True})
    many = [{"k": i} for i in range(20_000)]  # stock jsonschema: 2*10**8 pairs, minutes
    decision = ExitJudge(schema, timeout_s=5).judge({"items": many})
    assert decision.verdict is Verdict.ACCEPT, decision.error
    for items, unique in [
        ([[1], [1.0]], False),  # 1 and 1.0 are equal in JSON Schema
        ([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}], False),
        ([1, True, 0, False, None, "1"], True),  # true is not 1
        ([{"a": 1}, {"a": True}], True),
    ]:
        problem = schema_errors({"items": items}, schema)
        assert (problem is None) is unique, (items, problem)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"items": list(range(100_001))}, "more than 100000 values"),
        ({"text": "x" * (1 << 20) + "y"}, "more than 1048576 characters"),
        ({"x" * (1 << 20): 0, "y": 1}, "more than 1048576 characters"),
    ],
)
def test_a_payload_over_the_size_caps_is_refused_before_validation(payload, problem):
    decision, elapsed = _judged({"type": "object"}, payload)
    assert decision.verdict is Verdict.RETRY and problem in decision.error
    assert elapsed < 5


def test_a_payload_nested_too_deeply_is_refused_and_identical_ones_trip_the_breaker():
    deep: Any = []
    for _ in range(200):
        deep = [deep]
    judge = ExitJudge({"type": "object"})
    verdicts = [judge.judge({"deep": deep}) for _ in range(3)]
    assert "deeper than 64" in (verdicts[0].error or "")
    assert [d.verdict for d in verdicts] == [Verdict.RETRY, Verdict.RETRY, Verdict.BREAK]


def test_timed_out_checks_spend_the_retry_budget_and_then_end_the_run_abnormal():
    schema = _object(s={"type": "string", "pattern": SLOW})
    judge = ExitJudge(schema, timeout_s=TIMEOUT_S, retry_budget=2)
    verdicts = [judge.judge({"s": SLOW_TEXT + str(i)}) for i in range(3)]  # all different
    assert [d.verdict for d in verdicts] == [Verdict.RETRY, Verdict.RETRY, Verdict.BREAK]
    assert "could not be checked" in (verdicts[2].error or "")
    # The budget is the one unrecognised statuses use: once spent, such a payload is salvaged.
    judge = ExitJudge(
        _object(s={"type": "string", "pattern": SLOW}, status={"type": "string"}),
        timeout_s=TIMEOUT_S,
    )
    assert [judge.judge({"s": SLOW_TEXT + str(i)}).verdict for i in range(2)] == [Verdict.RETRY] * 2
    assert judge.judge({"status": "shipped"}).verdict is Verdict.SALVAGE


def test_identical_timed_out_calls_trip_the_breaker():
    judge = ExitJudge(_object(s={"pattern": SLOW}), timeout_s=TIMEOUT_S, retry_budget=5)
    verdicts = [judge.judge({"s": SLOW_TEXT}).verdict for _ in range(3)]
    assert verdicts == [Verdict.RETRY, Verdict.RETRY, Verdict.BREAK]


def test_the_problem_sent_back_is_short_whatever_the_payload():
    schema = _object(s={"type": "integer"})
    problem = schema_errors({"s": ["x" * 10_000] * 50}, schema)
    assert problem is not None and len(problem) <= 500
    assert problem.startswith("s: ['xxx") and problem.endswith("is not of type 'integer'")
    long_key = "k" * 10_000
    problem = schema_errors({long_key: {"s": 1.5}}, {"additionalProperties": _object(s=schema)})
    assert problem is not None and len(problem) <= 500


async def test_the_check_runs_off_the_event_loop():
    judge = ExitJudge(_object(s={"pattern": SLOW}), timeout_s=0.3)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        decision = await judge.judge_off_loop({"s": SLOW_TEXT})
    finally:
        task.cancel()
    assert decision.verdict is Verdict.RETRY and "took longer than 0.3 s" in (decision.error or "")
    assert ticks >= 3  # the loop kept running while the check did


async def test_a_run_gets_the_timeout_as_a_tool_error_and_can_then_finish():
    schema = _object(s={"type": "string", "pattern": SLOW}, status={"type": "string"})
    model = ScriptedModel(
        [
            reply("", call("exit_tool", "c1", s=SLOW_TEXT, status="done")),
            reply("", call("exit_tool", "c2", s="aaa", status="done")),
        ]
    )
    clone = Clone(make_spec(exit_schema=schema, exit_schema_declared=True), model)
    clone.judge.timeout_s = TIMEOUT_S
    result = await clone.run()
    model.assert_complete()
    assert (result.stop_reason, result.outcome) == (StopReason.COMPLETED, "success")
    assert result.result == {"s": "aaa", "status": "done"}
    (error,) = [m for m in model.calls[1].messages if m.role == "tool"]
    assert error.is_error and TIMED_OUT in error.content


def test_a_pattern_the_regex_engine_refuses_ends_the_run_instead_of_crashing(monkeypatch):
    import regex

    from clonefleet.clone.exit import _bounds as _exit_bounds

    def refuse(pattern: str) -> Any:
        raise regex.error("unsupported here")

    monkeypatch.setattr(_exit_bounds.regex, "compile", refuse)
    _exit_bounds._compiled.cache_clear()
    try:
        decision, _ = _judged(_object(s={"pattern": "^only-here-[0-9]$"}), {"s": "x"})
    finally:
        _exit_bounds._compiled.cache_clear()
    assert decision.verdict is Verdict.BREAK and "regex engine refuses" in (decision.error or "")


async def test_a_small_payload_against_a_plain_schema_is_judged_without_a_thread_hop():
    import threading

    judge = ExitJudge(DEFAULT_EXIT_SCHEMA)
    seen: list[str] = []
    real = judge.judge

    def spy(payload):
        seen.append(threading.current_thread().name)
        return real(payload)

    judge.judge = spy  # type: ignore[method-assign]
    await judge.judge_off_loop({"success": True, "summary": "ok"})
    await judge.judge_off_loop({"success": True, "summary": "x" * 5000})  # a long string: thread
    assert seen[0] == threading.current_thread().name
    assert seen[1] != threading.current_thread().name
    assert judge.cheap_schema
    assert not ExitJudge({"properties": {"s": {"pattern": "^a+$"}}}).cheap_schema
