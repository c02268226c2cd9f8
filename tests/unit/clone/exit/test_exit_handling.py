"""Exit handling (docs/definitions.md), through the judge and through whole clone runs (no Ray, no network)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from clonefleet.clone import (
    Clone,
    ExitJudge,
    Verdict,
    classify,
    schema_errors,
)
from clonefleet.definitions import DEFAULT_EXIT_SCHEMA
from clonefleet.errors import DefinitionError
from clonefleet.testing import ScriptedModel, call, make_spec, reply
from clonefleet.vocab import Outcome, StopReason

pytestmark = pytest.mark.timeout(20)

STATUS_SCHEMA = {
    "type": "object",
    "properties": {"status": {"type": "string"}, "summary": {"type": "string"}},
    "required": ["status", "summary"],
}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"success": True, "kind": "weird"}, Outcome.SUCCESS),  # the boolean wins over any string
        ({"success": False, "status": "ok"}, Outcome.FAILURE),
        (
            {"kind": "weird", "status": "done"},
            "weird",
        ),  # the first present field decides, recognised or not
        ({"outcome": "DONE", "status": "failed"}, Outcome.SUCCESS),  # lower-cased
        ({"outcome": "Canceled"}, Outcome.CANCELLED),
        ({"status": "FAILURE"}, Outcome.FAILURE),
        ({"status": "ok"}, Outcome.SUCCESS),
        ({"kind": True, "status": "failed"}, Outcome.SUCCESS),  # non-string stops the search
        ({"kind": ["failed"], "outcome": "failed"}, Outcome.SUCCESS),
        ({"status": {"nested": "failed"}}, Outcome.SUCCESS),
        ({}, Outcome.SUCCESS),
        (["not", "an", "object"], Outcome.SUCCESS),
        ({"status": " done"}, " done"),  # no trimming: only case is normalised
        ({"success": False, "kind": "done"}, Outcome.FAILURE),
        ({"success": "yes", "status": "done"}, Outcome.SUCCESS),  # a non-boolean success is skipped
        ({"kind": "OK", "status": "failed"}, Outcome.SUCCESS),
        ({"outcome": "Failed"}, Outcome.FAILURE),
        ({"status": "canceled"}, Outcome.CANCELLED),
        ({"status": "cancel"}, Outcome.CANCELLED),
        ({"status": "Completed"}, Outcome.SUCCESS),
        ({"status": "error"}, Outcome.FAILURE),
        ({"kind": 3, "status": "failed"}, Outcome.SUCCESS),
        ({"outcome": None, "status": "failed"}, Outcome.SUCCESS),
        ({"summary": "no status"}, Outcome.SUCCESS),
        ({"status": "weird"}, "weird"),
    ],
)
def test_status_normalisation_table(payload, expected):
    assert classify(payload) == expected


def test_schema_failures_go_back_to_the_model_and_do_not_use_the_status_budget():
    judge = ExitJudge(STATUS_SCHEMA)
    for i in range(4):
        decision = judge.judge({"summary": f"missing status {i}"})
        assert decision.verdict is Verdict.RETRY and "status" in decision.error
    assert judge.judge({"status": "odd", "summary": "a"}).verdict is Verdict.RETRY
    assert judge.judge({"status": "odd", "summary": "b"}).verdict is Verdict.RETRY
    assert judge.judge({"status": "odd", "summary": "c"}).verdict is Verdict.SALVAGE


def test_corrective_retry_names_the_recognised_families():
    error = ExitJudge(STATUS_SCHEMA).judge({"status": "shipped", "summary": "x"}).error
    assert "shipped" in error and "success" in error and "failure" in error and "cancelled" in error


def test_breaker_is_checked_before_salvage():
    judge = ExitJudge(STATUS_SCHEMA, retry_budget=0)
    assert (
        judge.judge({"status": "odd", "summary": "x"}).verdict is Verdict.SALVAGE
    )  # budget 0: first one salvaged
    judge = ExitJudge(STATUS_SCHEMA, retry_budget=2, breaker_threshold=2)
    payload = {"status": "odd", "summary": "same"}
    assert [judge.judge(payload).verdict for _ in range(2)] == [Verdict.RETRY, Verdict.BREAK]


def test_identical_schema_failures_trip_the_breaker_too():
    judge = ExitJudge(STATUS_SCHEMA)
    verdicts = [judge.judge({"summary": "same"}).verdict for _ in range(3)]
    assert verdicts == [Verdict.RETRY, Verdict.RETRY, Verdict.BREAK]


def test_other_activity_restarts_the_breakers_count():
    judge = ExitJudge(STATUS_SCHEMA)
    assert [judge.judge({"summary": 1}).verdict for _ in range(2)] == [Verdict.RETRY] * 2
    judge.note_other_activity()
    verdicts = [judge.judge({"summary": 1}).verdict for _ in range(3)]
    assert verdicts == [Verdict.RETRY, Verdict.RETRY, Verdict.BREAK]


def test_a_payload_that_fits_the_default_schema_is_accepted():
    decision = ExitJudge(DEFAULT_EXIT_SCHEMA).judge({"success": True, "summary": "x"})
    assert decision.verdict is Verdict.ACCEPT and decision.outcome is Outcome.SUCCESS


def test_alternating_failing_payloads_never_trip_the_breaker():
    judge = ExitJudge(STATUS_SCHEMA, retry_budget=5)
    verdicts = [judge.judge({"status": "odd", "summary": "ab"[i % 2]}).verdict for i in range(6)]
    assert Verdict.BREAK not in verdicts and verdicts[-1] is Verdict.SALVAGE


def test_declared_enum_outside_the_families_is_enforced_by_the_schema():
    schema = {
        "type": "object",
        "properties": {"status": {"enum": ["shipped", "blocked"]}},
        "required": ["status"],
    }
    judge = ExitJudge(schema)
    assert (
        judge.judge({"status": "done"}).verdict is Verdict.RETRY
    )  # recognised, but not in the declared enum
    assert (
        judge.judge({"status": "shipped"}).verdict is Verdict.RETRY
    )  # in the enum, but unrecognised


def test_local_refs_resolve_inside_the_document():
    schema = {
        "$defs": {"s": {"type": "string", "enum": ["done", "failed"]}},
        "type": "object",
        "properties": {"status": {"$ref": "#/$defs/s"}},
    }
    judge = ExitJudge(schema)
    assert judge.judge({"status": "nope"}).verdict is Verdict.RETRY
    decision = judge.judge({"status": "failed"})
    assert decision.verdict is Verdict.ACCEPT and decision.outcome is Outcome.FAILURE


@pytest.fixture
def schema_server():
    """A loopback HTTP server that serves a permissive schema and counts requests."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            body = json.dumps({"type": "string"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/schema+json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def test_remote_ref_is_never_fetched(schema_server):
    base, hits = schema_server
    schema = {"type": "object", "properties": {"status": {"$ref": f"{base}/status.json"}}}
    decision = ExitJudge(schema).judge({"status": "done"})
    assert decision.verdict is Verdict.BREAK and "never fetched" in decision.error
    assert "$ref" in (schema_errors({"status": "done"}, schema) or "")
    relative = {
        "$id": f"{base}/root.json",
        "type": "object",
        "properties": {"status": {"$ref": "other.json"}},
    }
    assert ExitJudge(relative).judge({"status": "done"}).verdict is Verdict.BREAK
    assert hits == []


async def test_a_run_whose_schema_has_a_remote_ref_ends_abnormal_without_fetching(schema_server):
    base, hits = schema_server
    schema = {"type": "object", "properties": {"status": {"$ref": f"{base}/s.json"}}}
    model = ScriptedModel([reply("", call("exit_tool", status="done"))])
    result = await Clone(make_spec(exit_schema=schema, exit_schema_declared=True), model).run()
    assert result.stop_reason is StopReason.ABNORMAL and "never fetched" in result.error
    assert result.result is None and hits == []


def test_an_invalid_schema_is_a_definition_error_before_the_run():
    with pytest.raises(DefinitionError, match="exit_tool_schema"):
        ExitJudge({"type": "not-a-type"})
    with pytest.raises(DefinitionError):
        Clone(make_spec(exit_schema={"properties": 5}), ScriptedModel([]))


# -- whole runs -------------------------------------------------------------------------------
async def test_salvaged_run_is_completed_with_concerns_and_the_full_last_payload():
    model = ScriptedModel(
        [
            reply("", call("exit_tool", f"c{i}", status=s, summary=f"try {i}"))
            for i, s in enumerate(["shipped", "landed", "merged"])
        ]
    )
    events = []
    result = await Clone(
        make_spec(exit_schema=STATUS_SCHEMA, exit_schema_declared=True), model, emit=events.append
    ).run()
    model.assert_complete()
    assert (result.status, result.stop_reason, result.error) == (
        "completed",
        StopReason.COMPLETED,
        None,
    )
    assert result.salvaged and result.nonconforming and result.concerns
    assert result.result == {"status": "merged", "summary": "try 2"}
    corrective = [m for m in model.calls[2].messages if m.role == "tool"]
    assert len(corrective) == 2 and all(
        m.is_error and "unrecognised status" in m.content for m in corrective
    )
    assert events[-1]["type"] == "result" and events[-1]["status"] == "completed"


async def test_breaker_run_is_abnormal_and_never_salvaged():
    model = ScriptedModel(
        [reply("", call("exit_tool", f"c{i}", status="shipped", summary="same")) for i in range(3)]
    )
    result = await Clone(
        make_spec(exit_schema=STATUS_SCHEMA, exit_schema_declared=True), model
    ).run()
    assert (
        result.stop_reason is StopReason.ABNORMAL
        and result.status == "failed"
        and result.outcome == "failure"
    )
    assert not result.salvaged and not result.nonconforming and result.result is None
    assert (
        result.error
        == "Error: subagent run ended abnormally (no progress: repeated failing exit_tool calls)"
    )


async def test_other_tool_activity_between_failing_exit_calls_resets_the_breaker():
    steps = [
        reply("", call("exit_tool", "c1", status="shipped", summary="same")),
        reply("", call("progress_update", "c2", summary="trying again")),
        reply("", call("exit_tool", "c3", status="shipped", summary="same")),
        reply("", call("exit_tool", "c4", status="shipped", summary="same")),
    ]
    result = await Clone(make_spec(exit_schema=STATUS_SCHEMA), ScriptedModel(steps)).run()
    # Without the reset this is the third identical failing call in a row (breaker); with it, the
    # status budget (2 retries) is spent and the payload is salvaged.
    assert result.stop_reason is StopReason.COMPLETED and result.salvaged


@pytest.mark.parametrize(
    ("status", "outcome"), [("Done", "success"), ("error", "failure"), ("CANCEL", "cancelled")]
)
async def test_recognised_status_is_accepted_at_once(status, outcome):
    model = ScriptedModel([reply("", call("exit_tool", status=status, summary="s"))])
    result = await Clone(
        make_spec(exit_schema=STATUS_SCHEMA, exit_schema_declared=True), model
    ).run()
    model.assert_complete()
    assert (result.status, result.outcome, result.salvaged) == ("completed", outcome, False)


async def test_plain_text_with_a_declared_schema_warns_without_changing_the_result():
    declared = await Clone(
        make_spec(exit_schema=STATUS_SCHEMA, exit_schema_declared=True),
        ScriptedModel([reply("just text")]),
    ).run()
    default = await Clone(make_spec(), ScriptedModel([reply("just text")])).run()
    for result in (declared, default):
        assert (result.status, result.outcome, result.result, result.error) == (
            "completed",
            "success",
            "just text",
            None,
        )
    assert [w for w in declared.warnings if "declared structured result was not produced" in w]
    assert not default.warnings
