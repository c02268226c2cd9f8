"""Deeply nested JSON from outside is a clear error, never a ``RecursionError``: request bodies
sent to the simulated server, and answers, error bodies and tool arguments the providers read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from clonefleet.config import ProviderConfig
from clonefleet.errors import ModelBehaviorError, ModelHTTPError
from clonefleet.providers import (
    SIM_SERVER,
    Message,
    ModelRequest,
    Role,
    build_provider,
    start_server,
)
from clonefleet.providers._bounded_json import MAX_JSON_DEPTH, loads_bounded, nesting_exceeds

pytestmark = pytest.mark.timeout(30)

DEEP = 100_000
"""Far past both Python's recursion limit and orjson's 1,024 levels."""
TOO_DEEP_TEXT = f"nested deeper than {MAX_JSON_DEPTH} levels"
ANTHROPIC_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def openai_call(arguments: str) -> dict[str, Any]:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        ],
    }
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def request() -> ModelRequest:
    return ModelRequest(model="m", messages=(Message(role=Role.USER, content="x"),), max_tokens=16)


# -- the helper -----------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 1_024, DEEP])
def test_loads_bounded_refuses_deep_nesting_with_a_value_error_naming_the_cap(depth):
    with pytest.raises(ValueError, match=TOO_DEEP_TEXT) as info:
        loads_bounded(nested(depth))
    assert info.value.__cause__ is None  # orjson's error would carry the whole body along


def test_loads_bounded_keeps_json_up_to_the_cap():
    assert loads_bounded(nested(MAX_JSON_DEPTH, "2")) == json.loads(nested(MAX_JSON_DEPTH, "2"))
    assert loads_bounded(b'{"a": {"b": [1, {"c": null}]}}', 4) == {"a": {"b": [1, {"c": None}]}}
    assert nesting_exceeds({"a": {"b": [1, {"c": []}]}}, 4)
    assert not nesting_exceeds("scalar", 0)


# -- the simulated server ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        nested(DEEP).encode(),
        b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        json.dumps(
            {"model": "sim-small", "max_tokens": 8, "messages": json.loads(nested(200, "{}"))}
        ).encode(),
    ],
    ids=["arrays", "objects", "deep-but-parseable-messages"],
)
async def test_the_simulated_server_answers_deep_json_400_in_each_wire_format_and_keeps_serving(
    body,
):
    runner, port = await start_server()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            openai = await client.post(
                f"{url}/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert openai.status_code == 400
            error = openai.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert "invalid chat-completions request" in error["message"]
            assert TOO_DEEP_TEXT in error["message"]

            anthropic = await client.post(
                f"{url}/messages",
                content=body,
                headers={**ANTHROPIC_HEADERS, "content-type": "application/json"},
            )
            assert anthropic.status_code == 400
            answer = anthropic.json()
            assert answer["type"] == "error"
            assert answer["error"]["type"] == "invalid_request_error"
            assert TOO_DEEP_TEXT in answer["error"]["message"]

            good = {"model": "sim-small", "messages": [{"role": "user", "content": "x"}]}
            resp = await client.post(f"{url}/chat/completions", json=good)
            assert resp.status_code == 200 and resp.json()["choices"]
        assert runner.app[SIM_SERVER].outcomes["bad request"] == 2
    finally:
        await runner.cleanup()


async def test_the_simulated_server_answers_a_request_with_deep_tool_arguments():
    runner, port = await start_server()
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": nested(DEEP)}}],
    }
    body = {
        "model": "sim-small",
        "messages": [
            {"role": "user", "content": "x"},
            message,
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
        ],
    }
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        assert resp.status_code == 200
    finally:
        await runner.cleanup()


# -- the providers' answers, over a real loopback server (the pooled path) -----------------------
Answer = tuple[int, bytes]
Serve = Callable[[Answer], Awaitable[str]]


@pytest.fixture
async def answering() -> AsyncIterator[Serve]:
    """``await answering((status, body))``: a loopback server answering every POST so; its URL."""
    runners: list[web.AppRunner] = []

    async def serve(answer: Answer) -> str:
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(status=answer[0], body=answer[1], content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield serve
    for runner in runners:
        await runner.cleanup()


DEEP_ANSWERS = {
    "200-arrays": (200, nested(DEEP).encode(), ModelBehaviorError),
    "200-error-1000": (200, b'{"error":' + nested(1_000).encode() + b"}", ModelBehaviorError),
    "500-arrays": (500, nested(DEEP).encode(), ModelHTTPError),
    "400-error-1000": (400, b'{"error":' + nested(1_000).encode() + b"}", ModelHTTPError),
    "anthropic-error-1000": (
        200,
        b'{"type":"error","error":' + nested(1_000).encode() + b"}",
        ModelBehaviorError,
    ),
    "arguments-1000": (
        200,
        json.dumps(openai_call('{"a":' + nested(1_000) + "}")).encode(),
        ModelBehaviorError,
    ),
}


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("case", sorted(DEEP_ANSWERS))
async def test_deep_answers_are_model_errors_not_recursion_errors(
    answering, monkeypatch, kind, case
):
    status, body, error = DEEP_ANSWERS[case]
    monkeypatch.setenv("DEEP_KEY", "k")
    url = await answering((status, body))
    for transport in (None, httpx.MockTransport(lambda _r: httpx.Response(status, content=body))):
        model, aclose = build_provider(
            "p",
            ProviderConfig(kind=kind, base_url=url, api_key_env="DEEP_KEY"),
            transport=transport,
        )
        try:
            with pytest.raises((ModelBehaviorError, ModelHTTPError)) as info:
                await model.request(request())
        finally:
            await aclose()
        assert isinstance(info.value, error), info.value
        assert len(str(info.value)) < 70_000


async def test_deep_openai_tool_arguments_name_the_cap(answering, monkeypatch):
    monkeypatch.setenv("DEEP_KEY", "k")
    body = json.dumps(openai_call('{"a":' + nested(1_000) + "}")).encode()
    model, aclose = build_provider(
        "p",
        ProviderConfig(
            kind="openai", base_url=await answering((200, body)), api_key_env="DEEP_KEY"
        ),
    )
    try:
        with pytest.raises(ModelBehaviorError, match=f"tool call 0 \\(f\\).*{TOO_DEEP_TEXT}"):
            await model.request(request())
    finally:
        await aclose()
