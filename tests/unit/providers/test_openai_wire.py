"""The openai provider's wire format and status mapping, against ``httpx.MockTransport``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from clonefleet.clone import FailoverModel
from clonefleet.config import ProviderConfig
from clonefleet.errors import ModelBehaviorError, ModelHTTPError
from clonefleet.providers import (
    Message,
    Model,
    ModelRequest,
    Role,
    ToolCall,
    ToolSpec,
    build_provider,
)

pytestmark = pytest.mark.timeout(20)
URL = "http://127.0.0.1:8000/v1"


class Recorder:
    """A MockTransport handler answering canned responses and recording the requests."""

    def __init__(self, *responses: httpx.Response) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.requests[-1].content)


@pytest.fixture
async def mock_model(monkeypatch) -> Any:
    closers = []
    monkeypatch.setenv("WIRE_TEST_KEY", "sk-test-wire")

    def build(handler: Callable[[httpx.Request], httpx.Response], **cfg: Any) -> Model:
        cfg.setdefault("api_key_env", "WIRE_TEST_KEY")
        model, aclose = build_provider(
            "local",
            ProviderConfig(kind="openai", base_url=URL, **cfg),
            transport=httpx.MockTransport(handler),
        )
        closers.append(aclose)
        return model

    yield build
    for aclose in closers:
        await aclose()


def completion(
    message: dict[str, Any], finish_reason: str = "stop", usage: dict[str, int] | None = None
) -> httpx.Response:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-x",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    body["usage"] = usage or {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    return httpx.Response(200, json=body)


def conversation() -> ModelRequest:
    call = ToolCall(id="call_a", name="file_read", arguments={"path": "foo.py"})
    return ModelRequest(
        model="gpt-x",
        messages=(
            Message(role=Role.SYSTEM, content="base prompt"),
            Message(role=Role.SYSTEM, content="skill: review", pinned=True),
            Message(role=Role.USER, content="review foo.py"),
            Message(role=Role.ASSISTANT, content="", tool_calls=(call,)),
            Message(role=Role.TOOL, content="print('hi')", tool_call_id="call_a", name="file_read"),
        ),
        tools=(
            ToolSpec(
                name="file_read",
                description="Read a file.",
                parameters={"type": "object", "properties": {"path": {"type": "string"}}},
            ),
        ),
        max_tokens=256,
        metadata={"batch_id": "b7", "clone_index": 3},
    )


async def test_request_maps_messages_tools_and_clone_identity(mock_model):
    rec = Recorder(completion({"role": "assistant", "content": "done"}))
    await mock_model(rec).request(conversation())
    sent = rec.requests[0]
    assert sent.url == "http://127.0.0.1:8000/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test-wire"
    body = rec.body
    assert body["messages"][0] == {"role": "system", "content": "base prompt\n\nskill: review"}
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assistant = body["messages"][2]
    assert "content" not in assistant  # optional beside tool calls (the OpenAI API reference)
    assert assistant["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "file_read", "arguments": '{"path":"foo.py"}'},
        }
    ]
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "print('hi')",
    }
    assert (
        body["tools"][0]["type"] == "function"
        and body["tools"][0]["function"]["name"] == "file_read"
    )
    assert (body["max_tokens"], body["user"], body["model"]) == (256, "b7/3", "gpt-x")


async def test_no_key_variable_sends_no_authorization(mock_model):
    rec = Recorder(completion({"role": "assistant", "content": "x"}))
    await mock_model(rec, api_key_env=None).request(conversation())
    assert "authorization" not in rec.requests[0].headers


async def test_response_maps_text_tool_calls_and_usage(mock_model):
    message = {
        "role": "assistant",
        "content": "reading",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "file_read", "arguments": '{"path": "a"}'},
            }
        ],
    }
    resp = await mock_model(Recorder(completion(message, "tool_calls"))).request(conversation())
    assert resp.text == "reading"
    assert resp.tool_calls == (ToolCall(id="c1", name="file_read", arguments={"path": "a"}),)
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (11, 7)
    assert not resp.refusal


@pytest.mark.parametrize(
    "arguments",
    ['{"path": "a"', "[1, 2]", '"just a string"'],
    ids=["truncated-json", "array", "string"],
)
async def test_malformed_tool_call_arguments_are_a_behavior_error(mock_model, arguments):
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "file_read", "arguments": arguments},
            }
        ],
    }
    with pytest.raises(ModelBehaviorError, match="file_read") as info:
        await mock_model(Recorder(completion(message, "tool_calls"))).request(conversation())
    assert info.value.retryable
    assert "provider 'local'" in str(info.value)


async def test_lenient_shapes_are_accepted(mock_model):
    # Some servers send arguments as an object, omit call ids, or answer content parts.
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "tool_calls": [{"function": {"name": "glob", "arguments": {"pattern": "*.py"}}}],
    }
    resp = await mock_model(Recorder(completion(message))).request(conversation())
    assert resp.text == "ab"
    assert resp.tool_calls == (ToolCall(id="call_0", name="glob", arguments={"pattern": "*.py"}),)


@pytest.mark.parametrize(
    ("message", "finish"),
    [
        ({"role": "assistant", "content": None, "refusal": "I can't help with that."}, "stop"),
        ({"role": "assistant", "content": ""}, "content_filter"),
    ],
    ids=["refusal-field", "content-filter"],
)
async def test_refusal_is_reported(mock_model, message, finish):
    resp = await mock_model(Recorder(completion(message, finish))).request(conversation())
    assert resp.refusal


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "upstream overloaded", "code": 502}},
        {"id": "x", "choices": []},
        {"choices": [{"message": "nope"}]},
    ],
    ids=["in-band-error", "no-choices", "message-not-object"],
)
async def test_unusable_200_bodies_are_behavior_errors(mock_model, body):
    with pytest.raises(ModelBehaviorError):
        await mock_model(Recorder(httpx.Response(200, json=body))).request(conversation())


@pytest.mark.parametrize(
    ("status", "body", "headers", "retryable", "spend_cap"),
    [
        (
            429,
            {
                "error": {
                    "message": "Rate limit reached",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                }
            },
            {"retry-after": "7"},
            True,
            False,
        ),
        (
            429,
            {
                "error": {
                    "message": "You exceeded your current quota",
                    "type": "insufficient_quota",
                    "code": "insufficient_quota",
                }
            },
            {},
            False,
            True,
        ),
        (
            400,
            {"error": {"message": "bad request", "type": "invalid_request_error"}},
            {},
            False,
            False,
        ),
        (
            401,
            {
                "error": {
                    "message": "Incorrect API key",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
            {},
            False,
            False,
        ),
        (403, {"error": {"message": "forbidden"}}, {}, False, False),
        (500, {"error": {"message": "boom"}}, {}, True, False),
        (
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {},
            True,
            False,
        ),
    ],
    ids=["429", "429-spend-cap", "400", "401", "403", "500", "529"],
)
async def test_status_mapping(mock_model, status, body, headers, retryable, spend_cap):
    with pytest.raises(ModelHTTPError) as info:
        await mock_model(Recorder(httpx.Response(status, json=body, headers=headers))).request(
            conversation()
        )
    err = info.value
    assert (err.status, err.retryable, err.spend_cap) == (status, retryable, spend_cap)
    assert err.body and err.body != json.dumps(body)  # a readable summary, not raw JSON
    if headers:
        assert err.retry_after_s == 7.0


async def test_spend_cap_429_moves_on_at_once(mock_model):
    capped = Recorder(
        httpx.Response(429, json={"error": {"type": "insufficient_quota", "message": "quota"}})
    )
    healthy = Recorder(completion({"role": "assistant", "content": "ok"}))
    delays: list[float] = []

    async def sleep(s: float) -> None:
        delays.append(s)

    from clonefleet.clone import Candidate

    fm = FailoverModel(
        [
            Candidate(key="a", wire_name="m", model=mock_model(capped)),
            Candidate(key="b", wire_name="m", model=mock_model(healthy)),
        ],
        sleep=sleep,
    )
    resp = await fm.request(conversation())
    assert resp.model == "b"
    assert len(capped.requests) == 1 and delays == []


async def test_non_json_request_values_fail_cleanly(mock_model):
    bad = ModelRequest(
        model="m",
        messages=(Message(role=Role.USER, content="x"),),
        tools=(ToolSpec(name="t", description="", parameters={"x": float("nan")}),),
    )
    rec = Recorder(completion({"role": "assistant", "content": "x"}))
    with pytest.raises(ModelBehaviorError, match="cannot be encoded"):
        await mock_model(rec).request(bad)
    assert rec.requests == []


async def test_failover_passes_every_request_field_on_and_names_the_candidate():
    """FailoverModel copies requests and responses field by field (no dataclasses.replace on the
    hot path): a field added to either must be carried there too, or this fails."""
    from dataclasses import fields

    from clonefleet.clone import Candidate
    from clonefleet.providers import (
        LimitReport,
        LimitWindow,
        ModelRequest,
        ModelResponse,
        ToolCall,
        Usage,
    )

    assert [f.name for f in fields(ModelRequest)] == [
        "model", "messages", "tools", "max_tokens", "metadata"
    ]  # fmt: skip
    assert [f.name for f in fields(ModelResponse)] == [
        "text", "tool_calls", "usage", "model", "refusal", "limits", "truncated"
    ]  # fmt: skip
    seen: list[ModelRequest] = []
    answer = ModelResponse(
        text="t", tool_calls=(ToolCall(id="c", name="n", arguments={}),), usage=Usage(input_tokens=1, output_tokens=2),
        model="wire", refusal=True, limits=LimitReport("openai", LimitWindow(60, 59, None)),
        truncated=True,
    )  # fmt: skip

    class Echo:
        async def request(self, req: ModelRequest) -> ModelResponse:
            seen.append(req)
            return answer

    model = FailoverModel([Candidate(key="m", model=Echo(), wire_name="wire-m")])
    req = ModelRequest(model="x", messages=(), tools=(), max_tokens=7, metadata={"k": 1})
    got = await model.request(req)
    assert seen[0] == ModelRequest(
        model="wire-m", messages=(), tools=(), max_tokens=7, metadata={"k": 1}
    )
    assert got == ModelResponse(
        text="t", tool_calls=answer.tool_calls, usage=answer.usage, model="m", refusal=True,
        limits=answer.limits, truncated=True,
    )  # fmt: skip


def test_identity_cache_makes_once_per_object_and_never_serves_an_equal_other():
    from clonefleet.providers import IdentityCache

    made: list[dict] = []

    def make(schema: dict) -> int:
        made.append(schema)
        return len(made)

    cache = IdentityCache(make, size=2)
    a, twin, b = {"type": "object"}, {"type": "object"}, {"type": "string"}
    assert [cache(a), cache(a), cache(twin)] == [1, 1, 2]  # equal but not the same object
    assert made == [a, twin]
    assert cache(b) == 3 and cache(a) == 4  # full at two: started again empty
