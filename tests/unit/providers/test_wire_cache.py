"""The wires' prompt cache, answer cap and length stops (docs/prompt-cache.md, "The wires"):
the Anthropic breakpoints and system blocks, the OpenAI ``prompt_cache_key`` and
``max_completion_tokens``, cached tokens in usage, and the 400 fallbacks against a real HTTP
server on 127.0.0.1 that refuses a field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from clonefleet.config import ProviderConfig
from clonefleet.errors import ModelHTTPError
from clonefleet.providers import (
    Message,
    ModelRequest,
    Role,
    ToolCall,
    ToolSpec,
    anthropic_payload,
    anthropic_response,
    build_provider,
    openai_payload,
    openai_response,
)

pytestmark = pytest.mark.timeout(30)
EPHEMERAL = {"type": "ephemeral"}


def tool(name: str) -> ToolSpec:
    return ToolSpec(name=name, description=f"The {name} tool.", parameters={"type": "object"})


def layout(*turns: Message, batch: str | None = "b_1") -> ModelRequest:
    """A request laid out as a clone's: identity, shared instructions (the cache break), the
    clone's own instructions, a pinned skill, the task, then ``turns``."""
    return ModelRequest(
        model="m",
        messages=(
            Message(role=Role.SYSTEM, content="IDENTITY", pinned=True),
            Message(role=Role.SYSTEM, content="SHARED", pinned=True, cache_break=True),
            Message(role=Role.SYSTEM, content="OWN 7", pinned=True),
            Message(role=Role.USER, content="[skill s]\nbody", pinned=True),
            Message(role=Role.USER, content="TASK 7"),
            *turns,
        ),
        tools=(tool("a"), tool("b"), tool("c")),
        metadata={"batch_id": batch, "clone_index": 7} if batch else {},
    )


def breakpoints(body: dict[str, Any]) -> list[Any]:
    """Every dict of ``body`` that carries ``cache_control``, in the prompt's order (tools,
    system, messages)."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "cache_control" in value:
                found.append(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk([body.get("tools"), body.get("system"), body["messages"], body.get("metadata")])
    return found


# ---------------------------------------------------------------------------------------------
# Anthropic payloads.


def test_anthropic_system_is_one_block_per_system_message_and_the_shared_one_is_marked():
    body = anthropic_payload(layout())
    assert body["system"] == [
        {"type": "text", "text": "IDENTITY"},
        {"type": "text", "text": "SHARED", "cache_control": EPHEMERAL},
        {"type": "text", "text": "OWN 7"},
    ]
    assert [t.get("cache_control") for t in body["tools"]] == [None, None, EPHEMERAL]
    last = body["messages"][-1]["content"]
    assert last[-1] == {"type": "text", "text": "TASK 7", "cache_control": EPHEMERAL}
    assert "cache_control" not in last[0]  # the skill: inside the rolling prefix, not a break
    assert len(breakpoints(body)) == 3


def test_anthropic_rolling_breakpoint_follows_the_conversation_onto_a_tool_result():
    call = ToolCall(id="t1", name="a", arguments={})
    body = anthropic_payload(
        layout(
            Message(role=Role.ASSISTANT, content="", tool_calls=(call,)),
            Message(role=Role.TOOL, content="out", tool_call_id="t1", name="a"),
        )
    )
    marked = breakpoints(body)
    assert len(marked) == 3
    assert marked[-1]["type"] == "tool_result" and marked[-1]["tool_use_id"] == "t1"
    assert body["messages"][-1]["content"][-1] is marked[-1]
    # The task, no longer last, is no longer a breakpoint: the tool, SHARED and the result are.
    assert [m.get("name") or m.get("text") or m.get("tool_use_id") for m in marked] == [
        "c",
        "SHARED",
        "t1",
    ]


def test_anthropic_never_sends_more_than_four_breakpoints_and_keeps_the_latest_shared():
    messages = tuple(
        Message(role=Role.SYSTEM, content=f"S{i}", cache_break=True) for i in range(5)
    ) + (Message(role=Role.USER, content="go"),)
    body = anthropic_payload(ModelRequest(model="m", messages=messages, tools=(tool("a"),)))
    marked = breakpoints(body)
    assert len(marked) == 4
    assert [m.get("text") or m.get("name") for m in marked] == ["a", "S3", "S4", "go"]


def test_anthropic_without_a_cache_break_marks_the_last_system_block():
    req = ModelRequest(
        model="m",
        messages=(
            Message(role=Role.SYSTEM, content="one"),
            Message(role=Role.SYSTEM, content="two"),
            Message(role=Role.USER, content="go"),
        ),
    )
    body = anthropic_payload(req)
    assert body["system"][-1] == {"type": "text", "text": "two", "cache_control": EPHEMERAL}
    assert "tools" not in body and len(breakpoints(body)) == 2


def test_anthropic_prompt_cache_off_sends_no_breakpoint():
    body = anthropic_payload(layout(), cache=False)
    assert "cache_control" not in json.dumps(body)
    assert [b["text"] for b in body["system"]] == ["IDENTITY", "SHARED", "OWN 7"]


def test_anthropic_usage_splits_cached_input_and_reads_a_length_stop():
    resp = anthropic_response(
        {
            "content": [{"type": "text", "text": "partial"}],
            "stop_reason": "max_tokens",
            "usage": {
                "input_tokens": 50,
                "cache_creation_input_tokens": 1000,
                "cache_read_input_tokens": 3000,
                "output_tokens": 64,
            },
        }
    )
    assert resp.truncated and not resp.refusal
    assert resp.usage.to_json() == {
        "input_tokens": 4050,
        "output_tokens": 64,
        "total_tokens": 4114,
        "cache_read_tokens": 3000,
        "cache_write_tokens": 1000,
    }
    done = anthropic_response({"content": [], "stop_reason": "end_turn", "usage": {}})
    assert not done.truncated and done.usage.cache_read_tokens == 0


# ---------------------------------------------------------------------------------------------
# OpenAI payloads.


def test_openai_sends_the_batch_as_prompt_cache_key_and_the_cap_in_the_chosen_field():
    req = ModelRequest(
        model="m",
        messages=(Message(role=Role.USER, content="hi"),),
        max_tokens=99,
        metadata={"batch_id": "b_42", "clone_index": 3},
    )
    body = openai_payload(req)
    assert (body["prompt_cache_key"], body["max_tokens"], body["user"]) == ("b_42", 99, "b_42/3")
    body = openai_payload(req, prompt_cache=False, max_tokens_param="max_completion_tokens")
    assert "prompt_cache_key" not in body and "max_tokens" not in body
    assert body["max_completion_tokens"] == 99
    plain = openai_payload(ModelRequest(model="m", messages=req.messages))
    assert not {"prompt_cache_key", "max_tokens", "max_completion_tokens"} & set(plain)


def test_openai_usage_reads_cached_tokens_and_a_length_stop():
    resp = openai_response(
        {
            "choices": [{"message": {"content": "cut"}, "finish_reason": "length"}],
            "usage": {
                "prompt_tokens": 2000,
                "completion_tokens": 10,
                "prompt_tokens_details": {"cached_tokens": 1920},
            },
        }
    )
    assert resp.truncated
    assert resp.usage.to_json() == {
        "input_tokens": 2000,
        "output_tokens": 10,
        "total_tokens": 2010,
        "cache_read_tokens": 1920,
        "cache_write_tokens": 0,
    }
    stop = openai_response({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]})
    assert not stop.truncated and stop.usage.cache_read_tokens == 0


# ---------------------------------------------------------------------------------------------
# A real server on 127.0.0.1 that refuses fields as some servers do.

Refuse = Callable[[dict[str, Any]], str | None]


class Strict:
    """A chat-completions server on 127.0.0.1: answers HTTP 400 with ``refuse(body)``'s message
    when that is not ``None``, else a one-word answer; records every body it got."""

    def __init__(self, refuse: Refuse) -> None:
        self.refuse = refuse
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        message = self.refuse(body)
        if message is not None:
            error = {"message": message, "type": "invalid_request_error", "code": None}
            return web.json_response({"error": error}, status=400)
        answer = {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"choices": [answer], "usage": {"prompt_tokens": 3}})


@pytest.fixture
async def strict() -> AsyncIterator[Callable[..., Any]]:
    """``await strict(refuse, **provider_cfg)``: ``(server, model)``, both gone after the test."""
    runners: list[web.AppRunner] = []
    closers: list[Any] = []

    async def start(refuse: Refuse, **cfg: Any) -> tuple[Strict, Any]:
        server = Strict(refuse)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        model, aclose = build_provider("strict", ProviderConfig(kind="openai", base_url=url, **cfg))
        closers.append(aclose)
        return server, model

    yield start
    for aclose in closers:
        await aclose()
    for runner in runners:
        await runner.cleanup()


def ask(batch: str = "b_9", max_tokens: int | None = 32) -> ModelRequest:
    return ModelRequest(
        model="m",
        messages=(Message(role=Role.USER, content="hi"),),
        max_tokens=max_tokens,
        metadata={"batch_id": batch, "clone_index": 0},
    )


async def test_a_server_refusing_prompt_cache_key_gets_it_never_again(strict):
    def refuse(body: dict[str, Any]) -> str | None:
        if "prompt_cache_key" in body:
            return "Unrecognized request argument supplied: prompt_cache_key"
        return None

    server, model = await strict(refuse)
    assert (await model.request(ask())).text == "ok"
    assert (await model.request(ask("b_10"))).text == "ok"
    assert ["prompt_cache_key" in b for b in server.bodies] == [True, False, False]
    assert all(b["max_tokens"] == 32 for b in server.bodies)  # the other field stays as it was


async def test_a_server_wanting_max_completion_tokens_gets_it_from_then_on(strict):
    def refuse(body: dict[str, Any]) -> str | None:
        if "max_tokens" in body:
            return (
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead."
            )
        return None

    server, model = await strict(refuse)
    await model.request(ask())
    await model.request(ask(max_tokens=64))
    sent = [(b.get("max_tokens"), b.get("max_completion_tokens")) for b in server.bodies]
    assert sent == [(32, None), (None, 32), (None, 64)]
    assert all(b["prompt_cache_key"] for b in server.bodies)


async def test_max_tokens_param_in_config_sends_max_completion_tokens_at_once(strict):
    server, model = await strict(lambda b: None, max_tokens_param="max_completion_tokens")
    await model.request(ask())
    assert len(server.bodies) == 1 and server.bodies[0]["max_completion_tokens"] == 32
    assert "max_tokens" not in server.bodies[0]


async def test_prompt_cache_off_in_config_sends_no_key(strict):
    server, model = await strict(lambda b: None, prompt_cache=False)
    await model.request(ask())
    assert "prompt_cache_key" not in server.bodies[0]


async def test_another_400_is_raised_after_one_request_and_changes_nothing(strict):
    server, model = await strict(lambda b: "max_tokens is too large: 32 > 16")
    with pytest.raises(ModelHTTPError) as info:
        await model.request(ask())
    assert info.value.status == 400 and len(server.bodies) == 1
    with pytest.raises(ModelHTTPError):
        await model.request(ask())
    assert [("prompt_cache_key" in b, "max_tokens" in b) for b in server.bodies] == [
        (True, True),
        (True, True),
    ]


async def test_a_field_refused_on_the_resend_too_is_raised_after_two_requests(strict):
    server, model = await strict(lambda b: "prompt_cache_key: Extra inputs are not permitted")
    with pytest.raises(ModelHTTPError):
        await model.request(ask())
    assert len(server.bodies) == 2 and "prompt_cache_key" not in server.bodies[1]
