"""A failure says why: the ``cause`` a run that failed on its provider carries (docs/json.md)."""

from __future__ import annotations

import pickle

import pytest

from clonefleet.clone import Candidate, Clone, FailoverModel
from clonefleet.errors import AllModelsFailed, ModelHTTPError, ModelTimeout
from clonefleet.providers import ModelRequest, SimBrain, SimulatedModel, error_type
from clonefleet.testing import FakeClock, FunctionModel, make_spec, reply
from clonefleet.vocab import RUN_RECORD_FIELDS, StopReason

REQ = ModelRequest(model="", messages=())

OPENAI_401 = (
    '{"error": {"message": "Incorrect API key provided: sk-****", '
    '"type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}'
)
ANTHROPIC_401 = (
    '{"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}'
)
ANTHROPIC_500 = '{"type": "error", "error": {"type": "api_error", "message": "Internal error"}}'


def raising(*errors):
    """A FunctionModel raising ``errors`` in turn (the last one again once they run out)."""
    queue = list(errors)

    def fn(req):
        raise queue.pop(0) if len(queue) > 1 else queue[0]

    return FunctionModel(fn)


def cands(*models, retries=2):
    return [
        Candidate(key=f"m{i}", wire_name=f"w{i}", model=m, provider="p", max_retries=retries)
        for i, m in enumerate(models)
    ]


def test_error_type_reads_both_wires_bodies():
    assert error_type(OPENAI_401) == "invalid_api_key"  # OpenAI: the code first
    assert error_type('{"error": {"type": "server_error", "message": "x"}}') == "server_error"
    assert error_type(ANTHROPIC_401) == "authentication_error"
    assert error_type('{"error": {"code": 500, "type": "api_error"}}') == "api_error"
    assert error_type("<html>bad gateway</html>") == error_type('{"error": "x"}') == ""


async def test_a_401_on_every_candidate_is_the_cause_and_the_error_text_stays():
    err = ModelHTTPError(
        401, "invalid_request_error: Incorrect API key", error_type="invalid_api_key"
    )
    a, b = raising(err), raising(err)
    events = []
    model = FailoverModel(cands(a, b), sleep=FakeClock().sleep)
    result = await Clone(make_spec(), model, emit=events.append).run()
    assert result.stop_reason is StopReason.FAILED and result.error == "Error: subagent run failed"
    cause = result.cause
    assert cause is not None
    assert cause["summary"] == "HTTP 401 invalid_api_key on models m0, m1"
    assert (cause["attempts"], cause["waited_s"]) == (2, 0.0)
    assert cause["candidates"] == [
        {
            "model": m,
            "provider": "p",
            "attempts": 1,
            "last_status": 401,
            "error_type": "invalid_api_key",
            "message": "invalid_request_error: Incorrect API key",
        }
        for m in ("m0", "m1")
    ]
    record = result.to_json()
    assert tuple(record) == RUN_RECORD_FIELDS and record["cause"] == cause
    last = events[-1]
    assert last["type"] == "result" and last["cause"] == cause
    assert last["error"] == "Error: subagent run failed"


async def test_a_500_retried_then_a_401_on_the_next_candidate():
    clock = FakeClock()
    a = raising(ModelHTTPError(500, "api_error: Internal error", error_type="api_error"))
    b = raising(
        ModelHTTPError(401, "authentication_error: bad key", error_type="authentication_error")
    )
    model = FailoverModel(cands(a, b), sleep=clock.sleep)
    with pytest.raises(AllModelsFailed) as info:
        await model.request(REQ)
    cause = info.value.cause
    assert cause is not None
    assert [(c["model"], c["attempts"], c["last_status"]) for c in cause["candidates"]] == [
        ("m0", 3, 500),
        ("m1", 1, 401),
    ]
    assert cause["attempts"] == 4 and cause["waited_s"] == pytest.approx(sum(clock.sleeps))
    assert cause["waited_s"] > 0
    assert cause["summary"] == (
        "HTTP 401 authentication_error on model m1; HTTP 500 api_error on model m0"
    )
    # Clone 1 starts on the other candidate: the same failure reads the same.
    again = FailoverModel(cands(a, b), start=1, sleep=clock.sleep)
    with pytest.raises(AllModelsFailed) as info2:
        await again.request(REQ)
    assert info2.value.cause is not None and info2.value.cause["summary"] == cause["summary"]
    # The error crosses processes whole.
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.cause == cause and copy.failures == info.value.failures


async def test_a_long_message_is_cut_and_a_timeout_has_no_status():
    long = ModelHTTPError(400, "x " * 400, error_type="invalid_request_error")
    model = FailoverModel(
        cands(raising(long), raising(ModelTimeout("no answer")), retries=0),
        sleep=FakeClock().sleep,
    )
    with pytest.raises(AllModelsFailed) as info:
        await model.request(REQ)
    first, second = info.value.cause["candidates"]
    assert len(first["message"]) == 300 and first["message"].endswith("…")
    assert (second["last_status"], second["error_type"]) == (None, "ModelTimeout")
    assert second["message"] == "no answer"
    assert info.value.cause["summary"] == (
        "HTTP 400 invalid_request_error on model m0; ModelTimeout on model m1"
    )
    copy = pickle.loads(pickle.dumps(long))
    assert copy.error_type == "invalid_request_error" and copy.status == 400


async def test_a_bare_model_failing_has_a_cause_and_a_success_has_none():
    err = ModelHTTPError(403, "permission_error: no", error_type="permission_error")
    result = await Clone(make_spec(candidates=("x",)), raising(err)).run()
    assert result.error == "Error: subagent run failed"
    assert (
        result.cause is not None
        and result.cause["summary"] == "HTTP 403 permission_error on model x"
    )
    events = []
    ok = FunctionModel(lambda req: reply("done"))
    done = await Clone(make_spec(), ok, emit=events.append).run()
    assert done.cause is None and done.to_json()["cause"] is None
    assert "cause" not in events[-1]


async def test_the_in_process_simulated_provider_names_its_error_type():
    sim = SimulatedModel(SimBrain(fail_rate=1.0))
    model = FailoverModel(cands(sim, retries=1), sleep=FakeClock().sleep)
    result = await Clone(make_spec(), model).run()
    assert result.error == "Error: subagent run failed"
    assert result.cause is not None
    assert result.cause["summary"] == "HTTP 503 server_error on model m0"
    assert result.cause["attempts"] == 2 and result.cause["waited_s"] == 0.25
