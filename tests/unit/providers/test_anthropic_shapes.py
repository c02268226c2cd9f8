"""The anthropic provider against Messages API response shapes (tests/fixtures/providers/anthropic),
served by ``httpx.MockTransport``: request mapping, text, tool_use, refusal and error bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from clonefleet.config import ProviderConfig
from clonefleet.errors import ModelBehaviorError, ModelHTTPError
from clonefleet.providers import Message, ModelRequest, Role, ToolCall, ToolSpec, build_provider

pytestmark = pytest.mark.timeout(20)
SHAPES = Path(__file__).parents[2] / "fixtures" / "providers" / "anthropic"


def shape(name: str) -> dict[str, Any]:
    return json.loads((SHAPES / f"{name}.json").read_text(encoding="utf-8"))


class Recorder:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.response


@pytest.fixture
async def anthropic(monkeypatch) -> Any:
    closers = []
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", "sk-ant-test")

    def build(
        response: httpx.Response, base_url: str = "http://127.0.0.1:9000/v1"
    ) -> tuple[Any, Recorder]:
        rec = Recorder(response)
        cfg = ProviderConfig(kind="anthropic", base_url=base_url, api_key_env="ANTHROPIC_TEST_KEY")
        model, aclose = build_provider("claude", cfg, transport=httpx.MockTransport(rec))
        closers.append(aclose)
        return model, rec

    yield build
    for aclose in closers:
        await aclose()


def conversation(**extra: Any) -> ModelRequest:
    call = ToolCall(id="toolu_1", name="file_read", arguments={"path": "foo.py"})
    return ModelRequest(
        model="claude-sonnet-4-20250514",
        messages=(
            Message(role=Role.SYSTEM, content="base prompt"),
            Message(role=Role.SYSTEM, content="skill text", pinned=True),
            Message(role=Role.USER, content="review foo.py"),
            Message(role=Role.ASSISTANT, content="reading", tool_calls=(call,)),
            Message(
                role=Role.TOOL,
                content="no such file",
                tool_call_id="toolu_1",
                name="file_read",
                is_error=True,
            ),
            Message(role=Role.USER, content="also check bar.py"),
        ),
        tools=(
            ToolSpec(name="file_read", description="Read a file.", parameters={"type": "object"}),
        ),
        **extra,
    )


async def test_request_puts_system_on_top_and_tool_blocks_in_turns(anthropic):
    model, rec = anthropic(httpx.Response(200, json=shape("text")))
    await model.request(conversation())
    sent = rec.requests[0]
    assert sent.url == "http://127.0.0.1:9000/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    body = json.loads(sent.content)
    cached = {"cache_control": {"type": "ephemeral"}}
    assert body["system"] == [
        {"type": "text", "text": "base prompt"},
        {"type": "text", "text": "skill text", **cached},
    ]
    assert body["max_tokens"] == 4096
    assert body["tools"] == [
        {
            "name": "file_read",
            "description": "Read a file.",
            "input_schema": {"type": "object"},
            **cached,
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "review foo.py"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "reading"},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "file_read",
                    "input": {"path": "foo.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "no such file",
                    "is_error": True,
                },
                {"type": "text", "text": "also check bar.py", **cached},
            ],
        },
    ]


@pytest.mark.parametrize("base_url", ["http://127.0.0.1:9000", "http://127.0.0.1:9000/v1/"])
async def test_base_url_with_or_without_v1(anthropic, base_url):
    model, rec = anthropic(httpx.Response(200, json=shape("text")), base_url)
    await model.request(conversation(max_tokens=100))
    assert rec.requests[0].url == "http://127.0.0.1:9000/v1/messages"
    assert json.loads(rec.requests[0].content)["max_tokens"] == 100


async def test_text_response(anthropic):
    model, _ = anthropic(httpx.Response(200, json=shape("text")))
    resp = await model.request(conversation())
    assert resp.text.startswith("The file defines one function")
    assert resp.tool_calls == () and not resp.refusal
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (2095, 503)


async def test_tool_use_response(anthropic):
    model, _ = anthropic(httpx.Response(200, json=shape("tool_use")))
    resp = await model.request(conversation())
    assert resp.text == "I'll read the file first."
    assert [(c.id, c.name, c.arguments) for c in resp.tool_calls] == [
        ("toolu_01A09q90qw90lq917835lq9", "file_read", {"path": "src/foo.py"}),
        ("toolu_01B19q90qw90lq917835lq0", "progress_update", {"summary": "reading foo.py"}),
    ]
    assert resp.usage.input_tokens == 472 + 100 + 1200  # cached input counts toward the budget


async def test_refusal_stop_reason_is_a_refusal(anthropic):
    model, _ = anthropic(httpx.Response(200, json=shape("refusal")))
    resp = await model.request(conversation())
    assert resp.refusal and resp.tool_calls == ()


@pytest.mark.parametrize(
    ("name", "status", "headers", "retryable", "fragment"),
    [
        ("error_overloaded", 529, {}, True, "overloaded_error: Overloaded"),
        ("error_rate_limit", 429, {"retry-after": "12"}, True, "rate_limit_error"),
        ("error_invalid_request", 400, {}, False, "invalid_request_error"),
        ("error_authentication", 401, {}, False, "invalid x-api-key"),
    ],
)
async def test_error_bodies(anthropic, name, status, headers, retryable, fragment):
    model, _ = anthropic(httpx.Response(status, json=shape(name), headers=headers))
    with pytest.raises(ModelHTTPError) as info:
        await model.request(conversation())
    err = info.value
    assert (err.status, err.retryable, err.spend_cap) == (status, retryable, False)
    assert fragment in err.body
    assert err.retry_after_s == (12.0 if headers else None)


async def test_error_body_with_status_200_is_a_behavior_error(anthropic):
    model, _ = anthropic(httpx.Response(200, json=shape("error_overloaded")))
    with pytest.raises(ModelBehaviorError, match="overloaded_error"):
        await model.request(conversation())


async def test_tool_use_without_object_input_is_a_behavior_error(anthropic):
    broken = shape("tool_use")
    broken["content"][1]["input"] = "src/foo.py"
    model, _ = anthropic(httpx.Response(200, json=broken))
    with pytest.raises(ModelBehaviorError, match="tool_use block 1"):
        await model.request(conversation())
