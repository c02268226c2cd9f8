"""Model-group failover: retries, Retry-After, move-on rules and the cursor."""

from __future__ import annotations

import pytest

from clonefleet.clone import Candidate, FailoverModel
from clonefleet.errors import AllModelsFailed, ModelHTTPError, ModelTimeout
from clonefleet.providers import ModelRequest
from clonefleet.testing import FakeClock, ScriptedModel, reply

REQ = ModelRequest(model="", messages=())


def cands(*models, retries=2):
    return [
        Candidate(key=f"m{i}", wire_name=f"wire{i}", model=m, max_retries=retries)
        for i, m in enumerate(models)
    ]


async def test_transient_failures_are_retried_on_same_candidate_honouring_retry_after():
    clock = FakeClock()
    first = ScriptedModel(
        [ModelHTTPError(429, retry_after_s=3.0), ModelHTTPError(503), reply("ok")]
    )
    model = FailoverModel(cands(first, ScriptedModel([])), sleep=clock.sleep)
    resp = await model.request(REQ)
    assert resp.text == "ok" and resp.model == "m0"
    assert clock.sleeps[0] == 3.0 and len(clock.sleeps) == 2
    assert [c.model for c in first.calls] == ["wire0"] * 3


async def test_non_transient_failure_moves_on_at_once():
    clock = FakeClock()
    moves = []
    first = ScriptedModel([ModelHTTPError(401)])
    second = ScriptedModel([reply("from second")])
    model = FailoverModel(
        cands(first, second), sleep=clock.sleep, on_failover=lambda a, b, r: moves.append((a, b))
    )
    resp = await model.request(REQ)
    assert resp.model == "m1" and clock.sleeps == [] and moves == [("m0", "m1")]
    assert model.current == "m1"  # the cursor stays on the candidate that answered


async def test_clone_start_offsets_the_cursor():
    ms = [ScriptedModel([reply(str(i))]) for i in range(3)]
    model = FailoverModel(cands(*ms), start=4)
    assert model.current == "m1"
    assert (await model.request(REQ)).text == "1"


async def test_every_candidate_and_fallback_failing_lists_each_last_failure():
    clock = FakeClock()
    a = ScriptedModel([ModelTimeout("t1"), ModelTimeout("t2"), ModelTimeout("t3")])
    b = ScriptedModel([ModelHTTPError(403, "denied")])
    fb = [
        Candidate(
            key="fb",
            wire_name="fb",
            model=ScriptedModel([ModelHTTPError(500), ModelHTTPError(500), ModelHTTPError(502)]),
        )
    ]
    model = FailoverModel(cands(a, b), fallbacks=fb, sleep=clock.sleep)
    with pytest.raises(AllModelsFailed) as info:
        await model.request(REQ)
    assert set(info.value.failures) == {"m0", "m1", "fb"} and info.value.failures["m0"] == "t3"
    assert "HTTP 502" in info.value.failures["fb"] and "403" in info.value.failures["m1"]


async def test_reset_returns_cursor_to_start():
    model = FailoverModel(cands(ScriptedModel([ModelHTTPError(400)]), ScriptedModel([reply("b")])))
    await model.request(REQ)
    assert model.current == "m1"
    model.reset(0)
    assert model.current == "m0"


async def test_a_fallback_that_answers_keeps_the_cursor_and_the_ring_wraps_back_to_the_group():
    clock = FakeClock()
    moves = []
    group = [
        ScriptedModel([ModelHTTPError(401), reply("group again")]),
        ScriptedModel([ModelHTTPError(403)]),
    ]
    fallback = ScriptedModel([reply("from fallback"), reply("fallback again"), ModelHTTPError(400)])
    fb = [Candidate(key="fb", wire_name="fb", model=fallback)]
    model = FailoverModel(
        cands(*group),
        fallbacks=fb,
        sleep=clock.sleep,
        on_failover=lambda a, b, r: moves.append((a, b)),
    )
    assert (await model.request(REQ)).model == "fb"
    assert moves == [("m0", "m1"), ("m1", "fb")] and model.current == "fb"
    second = await model.request(
        REQ
    )  # straight to the fallback: the failed group is not retried first
    assert (second.text, len(group[0].calls), len(group[1].calls)) == ("fallback again", 1, 1)
    third = await model.request(REQ)  # the fallback fails: the ring wraps around to the group
    assert (third.text, third.model, model.current) == ("group again", "m0", "m0")
    assert clock.sleeps == []


async def test_one_request_tries_each_ring_entry_once_from_the_cursor():
    clock = FakeClock()
    a = ScriptedModel([reply("a1"), ModelHTTPError(401)])
    b = ScriptedModel([ModelHTTPError(401)])
    model = FailoverModel(cands(a, b), start=0, sleep=clock.sleep)
    await model.request(REQ)
    with pytest.raises(AllModelsFailed) as info:
        await model.request(REQ)
    assert list(info.value.failures) == ["m0", "m1"] and len(a.calls) == 2 and len(b.calls) == 1
