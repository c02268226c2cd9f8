"""Fuzzing the exit classifier and the exit judge with hypothesis, over arbitrary JSON values.

``classify`` never raises and returns an :class:`Outcome` or the unrecognised status string
itself; ``ExitJudge.judge`` with the default schema never raises (it documents no exception)
and returns a decision consistent with ``classify``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.clone import ExitJudge, Verdict, classify
from clonefleet.definitions import DEFAULT_EXIT_SCHEMA
from clonefleet.vocab import Outcome, status_family

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,  # nothing is written into the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

STATUS_WORDS = ["success", "ok", "DONE", "Completed", "failure", "failed", "error", "cancel"]
STATUS_WORDS += ["canceled", "Cancelled", "shipped", "", " done", "ÖK", "ı", "\x00"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.sampled_from(STATUS_WORDS)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=30,
)
status_keys = st.sampled_from(["success", "kind", "outcome", "status", "summary"])
conforming = st.fixed_dictionaries(  # fits the default schema, with status fields besides
    {"success": st.booleans(), "summary": st.text(max_size=20)},
    optional={"kind": json_values, "outcome": json_values, "status": json_values},
)
payloads = (
    json_values
    | st.dictionaries(status_keys | st.text(max_size=8), json_values, max_size=6)
    | conforming
)


def _status_fields(payload: Any) -> list[Any]:
    if not isinstance(payload, dict):
        return []
    return [payload[k] for k in ("kind", "outcome", "status") if k in payload]


@FUZZ
@given(payloads)
def test_classify_returns_an_outcome_or_the_unrecognised_string(payload: Any) -> None:
    result = classify(payload)
    if isinstance(result, Outcome):
        return
    assert isinstance(result, str) and status_family(result) is None
    assert result in _status_fields(payload) and not isinstance(payload.get("success"), bool)


@FUZZ
@given(payloads)
def test_the_judge_with_the_default_schema_decides_every_payload(payload: Any) -> None:
    decision = ExitJudge(DEFAULT_EXIT_SCHEMA).judge(payload)
    if decision.verdict is Verdict.ACCEPT:
        assert decision.outcome == classify(payload) and isinstance(decision.outcome, Outcome)
        assert isinstance(payload, dict) and isinstance(payload.get("success"), bool)
    else:  # one call: a fresh judge neither salvages nor breaks
        assert decision.verdict is Verdict.RETRY
        assert decision.error is not None and decision.error.startswith("exit_tool rejected: ")


@FUZZ
@given(st.lists(payloads, min_size=1, max_size=6))
def test_a_sequence_of_calls_never_raises_and_ends_as_documented(calls: list[Any]) -> None:
    judge = ExitJudge(DEFAULT_EXIT_SCHEMA, retry_budget=1, breaker_threshold=2)
    for payload in calls:
        decision = judge.judge(payload)
        assert decision.verdict in (Verdict.ACCEPT, Verdict.RETRY, Verdict.BREAK)
        if decision.verdict is not Verdict.RETRY:
            break  # the run ends here
