"""The anthropic provider against the simulated server's Messages endpoint over real HTTP on
127.0.0.1: the real ``AnthropicModel`` from ``build_provider``, the wire format both ways, usage,
and each fault mode ending in a retry, a failover or a clear failure, never a hang or a leak."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from clonefleet.clone import Clone, FailoverModel
from clonefleet.config import ProviderConfig
from clonefleet.errors import AllModelsFailed, ModelBehaviorError, ModelHTTPError, ModelTimeout
from clonefleet.providers import (
    Message,
    Model,
    ModelRequest,
    Role,
    SimBrain,
    SimScript,
    SimStep,
    ToolCall,
    ToolSpec,
    build_provider,
)
from clonefleet.testing import make_spec

pytestmark = pytest.mark.timeout(20)

KEY_ENV = "CLONEFLEET_TEST_ANTHROPIC_KEY"
KEY = "sk-ant-api03-" + "k3yMat3rial" * 6 + "-TAILxyz"
"""The client's key: long, like a real one, so a masked echo of it would be recognisable too."""
SHORT_S = 0.5
"""Provider deadline of the hang and drip tests."""


def script(*steps: dict[str, Any]) -> SimScript:
    return SimScript.from_data({"default": list(steps)})


class RecordingBrain(SimBrain):
    """The server's brain, keeping every request as the server decoded it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[ModelRequest] = []

    def next_step(self, req: ModelRequest) -> SimStep:
        self.seen.append(req)
        return super().next_step(req)


@pytest.fixture
async def anthropic_model(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Callable[..., Model]]:
    """``anthropic_model(base_url, **provider_cfg)``: an ``anthropic`` provider's model, closed after."""
    monkeypatch.setenv(KEY_ENV, KEY)
    closers = []

    def build(base_url: str, **cfg: Any) -> Model:
        entry = ProviderConfig(kind="anthropic", base_url=base_url, api_key_env=KEY_ENV, **cfg)
        model, aclose = build_provider("claude", entry)
        closers.append(aclose)
        return model

    yield build
    for aclose in closers:
        await aclose()


def answered(history: tuple[Message, ...], resp: Any, result: str = "ok") -> tuple[Message, ...]:
    """``history`` plus the model's turn and one tool result per call in it."""
    return (
        *history,
        Message(role=Role.ASSISTANT, content=resp.text, tool_calls=resp.tool_calls),
        *(
            Message(role=Role.TOOL, content=result, tool_call_id=c.id, name=c.name)
            for c in resp.tool_calls
        ),
    )


async def test_default_behaviour_is_progress_then_exit_over_http(sim, anthropic_model, req):
    server, url = await sim()
    model = anthropic_model(url)
    first = await model.request(req(4))
    assert [c.name for c in first.tool_calls] == ["progress_update"]
    assert first.tool_calls[0].id.startswith("toolu_")
    second = await model.request(req(4, messages=answered(req(4).messages, first)))
    (call,) = second.tool_calls
    assert call.name == "exit_tool"
    assert call.arguments["success"] is True
    assert "clone 4" in call.arguments["summary"]  # metadata.user_id picked the clone
    assert server.outcomes == {"ok": 2}


async def test_metadata_user_id_selects_the_clones_own_script(sim, anthropic_model, req):
    server, url = await sim(
        script=SimScript.from_data(
            {"default": [{"text": "default"}], "clones": {2: [{"text": "two"}]}}
        )
    )
    model = anthropic_model(url)
    assert (await model.request(req(2))).text == "two"
    assert (await model.request(req(5, batch_id="b9"))).text == "default"
    assert set(server.first_request_at) == {"batch1/2", "b9/5"}


async def test_tool_calls_and_results_round_trip_through_the_wire(sim, anthropic_model):
    server, url = await sim(
        script=script(
            {"tool": "file_read", "args": {"path": "src/foo.py", "lines": [1, 2]}},
            {"text": "the file is missing"},
        )
    )
    brain = server.brain = RecordingBrain(script=server.brain.script)
    model = anthropic_model(url)
    tools = (
        ToolSpec(
            name="file_read",
            description="Read a file.",
            parameters={"type": "object", "properties": {"path": {"type": "string"}}},
        ),
    )
    opening = (
        Message(role=Role.SYSTEM, content="You review code."),
        Message(role=Role.SYSTEM, content="Skill: be brief.", pinned=True),
        Message(role=Role.USER, content="Review foo.py"),
    )
    meta = {"batch_id": "b1", "clone_index": 0}
    first = await model.request(
        ModelRequest(model="claude-x", messages=opening, tools=tools, metadata=meta)
    )
    (call,) = first.tool_calls
    assert (call.name, call.arguments) == ("file_read", {"path": "src/foo.py", "lines": [1, 2]})
    history = (
        *opening,
        Message(role=Role.ASSISTANT, content="Reading it.", tool_calls=first.tool_calls),
        Message(
            role=Role.TOOL,
            content="no such file",
            tool_call_id=call.id,
            name="file_read",
            is_error=True,
        ),
        Message(role=Role.USER, content="Also check bar.py"),
    )
    second = await model.request(
        ModelRequest(model="claude-x", messages=history, tools=tools, max_tokens=300, metadata=meta)
    )
    assert second.text == "the file is missing" and second.tool_calls == ()
    seen = brain.seen[1]
    assert [(m.role, m.content) for m in seen.messages] == [
        (Role.SYSTEM, "You review code.\n\nSkill: be brief."),
        (Role.USER, "Review foo.py"),
        (Role.ASSISTANT, "Reading it."),
        (Role.TOOL, "no such file"),
        (Role.USER, "Also check bar.py"),
    ]
    assert seen.messages[2].tool_calls == (call,)
    assert (seen.messages[3].tool_call_id, seen.messages[3].is_error) == (call.id, True)
    assert seen.tools == tools
    assert (seen.model, seen.max_tokens, seen.metadata) == ("claude-x", 300, meta)
    assert brain.seen[0].max_tokens == 4096  # the provider's default


async def test_a_tool_result_that_answers_no_tool_use_is_refused_as_anthropic_does(
    sim, anthropic_model, req
):
    server, url = await sim()
    stray = ToolCall(id="toolu_never_sent", name="progress_update", arguments={})
    history = (
        *req().messages,
        Message(role=Role.ASSISTANT, content="", tool_calls=(stray,)),
        Message(role=Role.TOOL, content="ok", tool_call_id="toolu_other"),
    )
    with pytest.raises(ModelHTTPError) as info:
        await anthropic_model(url).request(req(messages=history))
    err = info.value
    assert (err.status, err.retryable) == (400, False)
    assert "invalid_request_error" in err.body and "toolu_never_sent" in err.body
    assert server.outcomes == {"bad request": 1}


async def test_a_clone_runs_to_completion_and_counts_the_usage_the_server_reports(
    sim, anthropic_model, cand
):
    server, url = await sim()
    brain = server.brain = RecordingBrain()
    events: list[dict[str, Any]] = []
    spec = make_spec(job_id="sa_00000007", batch_id="b7", clone_index=7)
    clone = Clone(spec, FailoverModel([cand("claude", anthropic_model(url))]), emit=events.append)
    result = await clone.run()
    assert (result.status, result.turns) == ("completed", 2)
    assert "clone 7" in result.result["summary"]
    # step_to_response: input = words of the request's messages, output = 8 per tool call.
    words = [sum(len(m.content.split()) for m in r.messages) for r in brain.seen]
    assert len(words) == 2 and all(w > 0 for w in words)
    cached = result.usage["cache_read_tokens"] + result.usage["cache_write_tokens"]
    assert result.usage == {
        "input_tokens": sum(words),
        "output_tokens": 16,
        "total_tokens": sum(words) + 16,
        "cache_read_tokens": result.usage["cache_read_tokens"],
        "cache_write_tokens": result.usage["cache_write_tokens"],
    }
    assert 0 <= cached <= sum(words)  # parts of the input (the server's cache decides how much)
    usage_events = [e for e in events if e["type"] == "usage"]
    assert [e["input_tokens"] for e in usage_events] == words


async def test_refusal_stop_reason_comes_back_as_a_refusal(sim, anthropic_model, req):
    _, url = await sim(script=script({"refuse": True, "text": "I can't help with that."}))
    resp = await anthropic_model(url).request(req())
    assert resp.refusal and resp.text == "I can't help with that." and resp.tool_calls == ()


@pytest.mark.parametrize(
    ("status", "kind"), [(529, "overloaded_error"), (503, "api_error"), (429, "rate_limit_error")]
)
async def test_overload_and_rate_limit_are_retryable_with_the_servers_retry_after(
    sim, anthropic_model, req, status, kind
):
    server, url = await sim(script=script({"error": status, "retry_after": 2.5}))
    with pytest.raises(ModelHTTPError) as info:
        await anthropic_model(url).request(req())
    err = info.value
    assert (err.status, err.retryable, err.retry_after_s, err.spend_cap) == (
        status,
        True,
        2.5,
        False,
    )
    assert err.body == f"{kind}: simulated failure" and err.error_type == kind
    assert server.outcomes == {f"error {status}": 1}


async def test_529_is_retried_after_its_retry_after_then_answers(
    sim, anthropic_model, cand, sleeps, req
):
    server, url = await sim(script=script({"error": 529, "retry_after": 3}, {"text": "ok"}))
    resp = await FailoverModel([cand("claude", anthropic_model(url))], sleep=sleeps).request(req())
    assert resp.text == "ok"
    assert sleeps.delays == [3.0]
    assert server.requests == 2


async def test_401_is_not_retryable_and_fails_over_at_once(sim, anthropic_model, cand, sleeps, req):
    refused, refused_url = await sim(api_key="sk-ant-the-right-key")
    healthy, healthy_url = await sim()
    moves: list[tuple[str, ...]] = []
    fm = FailoverModel(
        [cand("a", anthropic_model(refused_url)), cand("b", anthropic_model(healthy_url))],
        sleep=sleeps,
        on_failover=lambda *m: moves.append(m),
    )
    resp = await fm.request(req())
    assert resp.model == "b"
    assert (refused.requests, healthy.requests) == (1, 1)
    assert refused.outcomes == {"refused 401": 1}
    assert sleeps.delays == []
    assert moves[0][:2] == ("a", "b") and "HTTP 401" in moves[0][2]
    assert "authentication_error" in moves[0][2]


async def test_the_api_key_never_appears_in_an_error_even_when_the_server_echoes_it(
    sim, anthropic_model, cand, sleeps, req
):
    # The server quotes the key it was sent in its 401 body; the provider must scrub it.
    _, echoing = await sim(api_key="sk-ant-the-right-key")
    _, hanging = await sim(script=script({"hang": True}))
    _, broken = await sim(script=script({"malformed": True}))
    fm = FailoverModel(
        [
            cand("a", anthropic_model(echoing)),
            cand("b", anthropic_model(hanging, timeout_s=SHORT_S), max_retries=0),
            cand("c", anthropic_model(broken), max_retries=0),
        ],
        sleep=sleeps,
    )
    async with asyncio.timeout(5):
        with pytest.raises(AllModelsFailed) as info:
            await fm.request(req())
    err = info.value
    assert list(err.failures) == ["a", "b", "c"]
    assert "invalid x-api-key: [redacted]" in err.failures["a"]
    # The cause a failed job's record carries (docs/json.md): statuses, error types, no key.
    assert err.cause is not None
    first, second, third = err.cause["candidates"]
    assert (first["last_status"], first["error_type"]) == (401, "authentication_error")
    assert "[redacted]" in first["message"]
    assert (second["last_status"], second["error_type"]) == (None, "ModelTimeout")
    assert (third["last_status"], third["error_type"]) == (None, "ModelBehaviorError")
    assert err.cause["summary"].startswith("HTTP 401 authentication_error on model a; ")
    texts = [
        json.dumps(err.cause),
        str(err),
        repr(err),
        *err.failures.values(),
        "".join(traceback.format_exception(err)),
        pickle.dumps(err).decode("latin-1"),
    ]
    for text in texts:
        assert KEY not in text and KEY[:12] not in text and KEY[-6:] not in text


async def test_a_malformed_body_is_a_retryable_behavior_error(sim, anthropic_model, req):
    server, url = await sim(script=script({"malformed": True}, {"html": True}))
    model = anthropic_model(url)
    with pytest.raises(ModelBehaviorError) as info:
        await model.request(req())
    assert info.value.retryable and "not JSON" in str(info.value)
    with pytest.raises(ModelBehaviorError, match="HTML"):
        await model.request(req())
    assert server.outcomes == {"malformed": 1, "html 200": 1}


@pytest.mark.parametrize("fault", ["hang", "drip"])
async def test_hang_and_drip_hit_the_providers_overall_deadline(sim, anthropic_model, req, fault):
    # A drip sends a byte every 50 ms, so no read timeout fires; only the overall deadline ends
    # it. The outer guard turns a hang into a failure instead of waiting for pytest-timeout.
    server, url = await sim(script=script({fault: True}), drip_interval_s=0.05)
    started = time.monotonic()
    async with asyncio.timeout(5):
        with pytest.raises(ModelTimeout) as info:
            await anthropic_model(url, timeout_s=SHORT_S).request(req())
    assert SHORT_S * 0.9 < time.monotonic() - started < 3
    assert info.value.retryable and "within 0.5s" in str(info.value)
    assert server.outcomes == {fault: 1}


async def test_fails_over_from_an_overloaded_anthropic_candidate_to_an_openai_one(
    sim, anthropic_model, openai_model, cand, sleeps, req
):
    overloaded, anthropic_url = await sim(script=script(*[{"error": 529}] * 3))
    healthy, openai_url = await sim()
    moves: list[tuple[str, ...]] = []
    fm = FailoverModel(
        [cand("claude", anthropic_model(anthropic_url)), cand("local", openai_model(openai_url))],
        sleep=sleeps,
        on_failover=lambda *m: moves.append(m),
    )
    resp = await fm.request(req(3))
    assert resp.model == "local" and fm.current == "local"
    assert [c.name for c in resp.tool_calls] == ["progress_update"]
    assert (overloaded.requests, healthy.requests) == (3, 1)
    assert sleeps.delays == [0.25, 0.5]
    assert moves == [("claude", "local", moves[0][2])]
    assert "HTTP 529" in moves[0][2] and "overloaded_error" in moves[0][2]


@pytest.mark.parametrize(
    ("headers", "status", "kind", "fragment"),
    [
        ({"anthropic-version": "2023-06-01"}, 401, "authentication_error", "x-api-key"),
        ({"x-api-key": "k"}, 400, "invalid_request_error", "anthropic-version"),
    ],
)
async def test_the_messages_endpoint_wants_its_headers_and_answers_in_anthropics_shape(
    sim, headers, status, kind, fragment
):
    server, url = await sim()
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{url}/messages", json=body, headers=headers)
    assert resp.status_code == status
    data = resp.json()
    assert data["type"] == "error" and data["error"]["type"] == kind
    assert fragment in data["error"]["message"]
    assert resp.headers["request-id"] == data["request_id"]
    assert server.outcomes == {f"refused {status}": 1}
