"""Exit payload classification table (SPEC §2.6)."""

from __future__ import annotations

import pytest

from clonefleet.actors import ExitJudge, Verdict, classify
from clonefleet.vocab import Outcome

DEFAULT = {
    "type": "object",
    "properties": {"success": {"type": "boolean"}, "summary": {"type": "string"}},
    "required": ["success", "summary"],
}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"success": True, "status": "failed"}, Outcome.SUCCESS),
        ({"success": False, "kind": "done"}, Outcome.FAILURE),
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
        ({"success": "yes", "status": "done"}, Outcome.SUCCESS),
    ],
)
def test_classification_table(payload, expected):
    assert classify(payload) == expected


def test_judge_retries_budget_then_salvages_varied_payloads():
    judge = ExitJudge({"type": "object"}, retry_budget=2)
    verdicts = [judge.judge({"status": "odd", "n": i}).verdict for i in range(3)]
    assert verdicts == [Verdict.RETRY, Verdict.RETRY, Verdict.SALVAGE]


def test_breaker_counts_only_identical_calls_without_other_activity():
    judge = ExitJudge(DEFAULT)
    assert judge.judge({"summary": 1}).verdict is Verdict.RETRY
    assert judge.judge({"summary": 1}).verdict is Verdict.RETRY
    judge.note_other_activity()
    assert judge.judge({"summary": 1}).verdict is Verdict.RETRY
    assert judge.judge({"summary": 1}).verdict is Verdict.RETRY
    assert judge.judge({"summary": 1}).verdict is Verdict.BREAK


def test_valid_payload_is_accepted():
    decision = ExitJudge(DEFAULT).judge({"success": True, "summary": "x"})
    assert decision.verdict is Verdict.ACCEPT and decision.outcome is Outcome.SUCCESS
