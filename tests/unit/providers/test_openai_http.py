"""The openai provider against the simulated server over real HTTP on 127.0.0.1, one test per fault
mode: each ends in a retry, a failover or a clear failure, never a hang or a crash."""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest

from clonefleet.clone import FailoverModel
from clonefleet.errors import AllModelsFailed, ModelBehaviorError, ModelHTTPError, ModelTimeout
from clonefleet.providers import Message, Role, SimScript, start_server

pytestmark = pytest.mark.timeout(20)

SHORT_S = 0.5
"""Provider deadline of the hang and drip tests."""


def script(*steps: dict) -> SimScript:
    return SimScript.from_data({"default": list(steps)})


async def test_default_behaviour_is_progress_then_exit_over_http(sim, openai_model, req):
    _, url = await sim()
    model = openai_model(url)
    first = await model.request(req(4))
    assert [c.name for c in first.tool_calls] == ["progress_update"]
    history = req(4).messages + (
        Message(role=Role.ASSISTANT, tool_calls=first.tool_calls),
        Message(
            role=Role.TOOL,
            content="ok",
            tool_call_id=first.tool_calls[0].id,
            name="progress_update",
        ),
    )
    second = await model.request(req(4, messages=history))
    (call,) = second.tool_calls
    assert call.name == "exit_tool"
    assert call.arguments["success"] is True
    assert "clone 4" in call.arguments["summary"]
    assert second.usage.input_tokens > 0


async def test_user_field_selects_the_clones_own_script(sim, openai_model, req):
    _, url = await sim(
        script=SimScript.from_data(
            {"default": [{"text": "default"}], "clones": {2: [{"text": "two"}]}}
        )
    )
    model = openai_model(url)
    assert (await model.request(req(2))).text == "two"
    assert (await model.request(req(5))).text == "default"


async def test_429_with_retry_after_is_retried_after_that_delay(
    sim, openai_model, cand, sleeps, req
):
    server, url = await sim(script=script({"error": 429, "retry_after": 3}, {"text": "ok"}))
    fm = FailoverModel([cand("a", openai_model(url))], sleep=sleeps)
    resp = await fm.request(req())
    assert resp.text == "ok"
    assert sleeps.delays == [3.0]
    assert server.requests == 2


async def test_429_error_carries_the_parsed_retry_after(sim, openai_model, req):
    _, url = await sim(rate_429=1.0)
    with pytest.raises(ModelHTTPError) as info:
        await openai_model(url).request(req())
    assert (info.value.status, info.value.retry_after_s, info.value.retryable) == (429, 0.0, True)


async def test_5xx_is_retried_with_backoff_then_fails_over(sim, openai_model, cand, sleeps, req):
    broken, broken_url = await sim(fail_rate=1.0)
    healthy, healthy_url = await sim()
    moves: list[tuple[str, str, str]] = []
    fm = FailoverModel(
        [cand("a", openai_model(broken_url)), cand("b", openai_model(healthy_url))],
        sleep=sleeps,
        on_failover=lambda *m: moves.append(m),
    )
    resp = await fm.request(req())
    assert resp.model == "b"
    assert (broken.requests, healthy.requests) == (3, 1)
    assert sleeps.delays == [0.25, 0.5]
    assert moves[0][:2] == ("a", "b") and "HTTP 503" in moves[0][2]
    assert fm.current == "b"


async def test_hang_times_out_and_fails_over(sim, openai_model, cand, sleeps, req):
    hanging, hanging_url = await sim(script=script({"hang": True}))
    _, healthy_url = await sim()
    fm = FailoverModel(
        [
            cand("a", openai_model(hanging_url, timeout_s=SHORT_S), max_retries=0),
            cand("b", openai_model(healthy_url)),
        ],
        sleep=sleeps,
    )
    started = time.monotonic()
    resp = await fm.request(req())
    assert resp.model == "b"
    assert hanging.outcomes["hang"] == 1
    assert time.monotonic() - started < 3


async def test_slow_drip_hits_the_providers_own_deadline(sim, openai_model, req):
    # The drip sends a byte every 50 ms, so a read timeout never fires; only the overall deadline
    # ends it. The outer guard turns a hang into a failure instead of waiting for pytest-timeout.
    dripping, url = await sim(script=script({"drip": True}), drip_interval_s=0.05)
    started = time.monotonic()
    async with asyncio.timeout(5):
        with pytest.raises(ModelTimeout) as info:
            await openai_model(url, timeout_s=SHORT_S).request(req())
    assert SHORT_S * 0.9 < time.monotonic() - started < 3
    assert dripping.outcomes["drip"] == 1
    assert info.value.retryable
    assert "within 0.5s" in str(info.value)


async def test_slow_drip_fails_over_even_when_the_candidate_deadline_is_long(
    sim, openai_model, cand, sleeps, req
):
    _, drip_url = await sim(script=script({"drip": True}))
    _, healthy_url = await sim()
    fm = FailoverModel(
        [
            cand("a", openai_model(drip_url, timeout_s=SHORT_S), max_retries=0, timeout_s=60),
            cand("b", openai_model(healthy_url)),
        ],
        sleep=sleeps,
    )
    async with asyncio.timeout(5):
        resp = await fm.request(req())
    assert resp.model == "b"


async def test_malformed_json_is_a_behavior_error_and_retried(sim, openai_model, cand, sleeps, req):
    server, url = await sim(
        script=SimScript.from_data(
            {"clones": {0: [{"malformed": True}], 1: [{"malformed": True}, {"text": "ok"}]}}
        )
    )
    model = openai_model(url)
    with pytest.raises(ModelBehaviorError) as info:
        await model.request(req(0))
    assert info.value.retryable and "not JSON" in str(info.value)
    resp = await FailoverModel([cand("a", model)], sleep=sleeps).request(req(1))
    assert resp.text == "ok"
    assert sleeps.delays == [0.25]
    assert server.outcomes["malformed"] == 2


async def test_html_error_page_is_an_http_error_with_a_readable_body(sim, openai_model, req):
    _, url = await sim(script=script({"error": 502, "html": True}))
    with pytest.raises(ModelHTTPError) as info:
        await openai_model(url).request(req())
    err = info.value
    assert err.status == 502 and err.retryable
    assert "502 Bad Gateway" in err.body and "<" not in err.body


async def test_html_page_with_status_200_is_a_behavior_error(sim, openai_model, req):
    _, url = await sim(script=script({"html": True}))
    with pytest.raises(ModelBehaviorError, match="HTML"):
        await openai_model(url).request(req())


async def test_401_moves_on_at_once_without_retry(sim, openai_model, cand, sleeps, req):
    refused, refused_url = await sim(script=script({"error": 401}, {"error": 401}, {"error": 401}))
    healthy, healthy_url = await sim()
    fm = FailoverModel(
        [cand("a", openai_model(refused_url)), cand("b", openai_model(healthy_url))], sleep=sleeps
    )
    resp = await fm.request(req())
    assert resp.model == "b"
    assert refused.requests == 1
    assert sleeps.delays == []


async def test_connection_refused_is_a_retryable_timeout(openai_model, req):
    runner, port = await start_server()
    await runner.cleanup()  # nothing listens on that port any more
    with pytest.raises(ModelTimeout) as info:
        await openai_model(f"http://127.0.0.1:{port}/v1").request(req())
    assert info.value.retryable
    assert "cannot reach" in str(info.value)


async def test_every_candidate_failing_lists_each_last_failure(
    sim, openai_model, cand, sleeps, req
):
    _, unauthorized = await sim(script=script({"error": 401}))
    _, unavailable = await sim(fail_rate=1.0)
    _, hanging = await sim(script=script({"hang": True}))
    _, bad_gateway = await sim(script=script({"error": 502, "html": True}))
    fm = FailoverModel(
        [
            cand("a", openai_model(unauthorized)),
            cand("b", openai_model(unavailable), max_retries=1),
            cand("c", openai_model(hanging, timeout_s=SHORT_S), max_retries=0),
        ],
        fallbacks=[cand("d", openai_model(bad_gateway), max_retries=0)],
        sleep=sleeps,
    )
    async with asyncio.timeout(5):
        with pytest.raises(AllModelsFailed) as info:
            await fm.request(req())
    failures = info.value.failures
    assert list(failures) == ["a", "b", "c", "d"]
    assert "HTTP 401" in failures["a"]
    assert "HTTP 503" in failures["b"]
    assert "no complete response within 0.5s" in failures["c"]
    assert "HTTP 502" in failures["d"] and "Bad Gateway" in failures["d"]
    assert all(key in str(info.value) for key in "abcd")
    assert pickle.loads(pickle.dumps(info.value)).failures == failures
    # The cause a failed job's record carries (docs/json.md), in the order tried.
    cause = info.value.cause
    assert cause is not None
    assert [
        (c["model"], c["attempts"], c["last_status"], c["error_type"]) for c in cause["candidates"]
    ] == [
        ("a", 1, 401, "invalid_api_key"),
        ("b", 2, 503, "server_error"),
        ("c", 1, None, "ModelTimeout"),
        ("d", 1, 502, ""),
    ]
    assert cause["attempts"] == 5 and cause["waited_s"] == pytest.approx(sum(sleeps.delays))
    assert "HTTP 401 invalid_api_key on model a" in cause["summary"]
    assert "Bad Gateway" in cause["candidates"][3]["message"]


async def test_many_concurrent_requests_share_one_client(sim, openai_model, req):
    server, url = await sim(latency_ms=20)
    model = openai_model(url, max_connections=16)
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(model.request(req(i))) for i in range(64)]
    assert all(t.result().tool_calls[0].name == "progress_update" for t in tasks)
    assert server.requests == 64
