"""A canary API key must never show up in an error's text, args, repr, attributes, pickle, or its
chained causes, nor in a provider's repr or the logs, whatever the server echoes back."""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from clonefleet.clone import Candidate, FailoverModel
from clonefleet.config import ProviderConfig
from clonefleet.errors import AllModelsFailed, ClonefleetError, ConfigError, ModelError
from clonefleet.providers import (
    Message,
    ModelRequest,
    Role,
    SimScript,
    build_provider,
    start_server,
)

pytestmark = pytest.mark.timeout(20)
CANARY = "sk-canary-7f3a9c2e5b8d41f6a0c9e7b3d2f1a8c4"
ENV = "CLONEFLEET_CANARY_KEY"


def echo(status: int, content_type: str, template: str):
    """A handler that echoes the credential headers it received inside its body."""

    def handler(request: httpx.Request) -> httpx.Response:
        sent = request.headers.get("authorization", "") + " " + request.headers.get("x-api-key", "")
        masked = f"{CANARY[:12]}...{CANARY[-6:]}"
        return httpx.Response(
            status,
            content=template.format(key=sent, masked=masked).encode(),
            headers={"content-type": content_type},
        )

    return handler


ECHOES = {
    "401-json": echo(
        401,
        "application/json",
        '{{"error": {{"message": "Incorrect API key provided: {key} ({masked})", "type": "invalid_request_error"}}}}',
    ),
    "429-spend-cap": echo(
        429,
        "application/json",
        '{{"error": {{"message": "insufficient_quota for {key}", "type": "insufficient_quota"}}}}',
    ),
    "500-html": echo(
        500,
        "text/html",
        "<html><head><title>500 {key}</title></head><body>{key} {masked}</body></html>",
    ),
    "200-not-json": echo(200, "application/json", '{{"oops": "{key}"'),
    "200-bad-tool-args": echo(
        200,
        "application/json",
        '{{"choices": [{{"message": {{"tool_calls": '
        '[{{"id": "c", "function": {{"name": "t", "arguments": "{{\\"k\\": \\"{masked}"}}}}]}}}}]}}',
    ),
    "200-in-band-error": echo(
        200, "application/json", '{{"error": {{"message": "bad key {key}", "code": 500}}}}'
    ),
}


def chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo += [cur.__cause__, cur.__context__]


def assert_clean(exc: BaseException) -> None:
    leaks = (CANARY, CANARY[:12], CANARY[-6:])
    for e in chain(exc):
        texts = [str(e), repr(e), repr(e.args), repr(getattr(e, "__dict__", {}))]
        request = getattr(e, "_request", None)
        if isinstance(request, httpx.Request):
            texts.append(repr(request.headers.raw))
        texts += [str(value) for value in getattr(e, "__dict__", {}).values()]
        if isinstance(e, ClonefleetError):
            texts.append(pickle.dumps(e).decode("latin-1"))
        for text in texts:
            for leak in leaks:
                assert leak not in text, f"{type(e).__name__} leaks the key: {text[:200]}"


@pytest.fixture
def canary(monkeypatch, caplog) -> Any:
    monkeypatch.setenv(ENV, CANARY)
    caplog.set_level(logging.DEBUG)
    yield
    assert CANARY not in caplog.text and CANARY[:12] not in caplog.text


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("case", sorted(ECHOES))
async def test_echoed_key_never_reaches_errors(canary, kind, case):
    cfg = ProviderConfig(kind=kind, base_url="http://127.0.0.1:9/v1", api_key_env=ENV)
    model, aclose = build_provider("p", cfg, transport=httpx.MockTransport(ECHOES[case]))
    assert (
        CANARY not in repr(model)
        and CANARY not in repr(vars(model))
        and CANARY not in repr(vars(model.provider))
    )
    try:
        with pytest.raises(ModelError) as info:
            await model.request(_request())
    finally:
        await aclose()
    assert_clean(info.value)
    if kind == "openai" and case == "401-json":
        assert "[redacted]" in info.value.body  # the echo was there, and scrubbed


async def test_transport_failures_and_the_final_listing_stay_clean(canary):
    runner, port = await start_server(script=SimScript.from_data({"default": [{"hang": True}]}))
    dead_runner, dead_port = await start_server()
    await dead_runner.cleanup()
    closers = []

    def model(base_url: str, timeout_s: float = 10.0) -> Any:
        m, aclose = build_provider(
            "p",
            ProviderConfig(kind="openai", base_url=base_url, api_key_env=ENV, timeout_s=timeout_s),
        )
        closers.append(aclose)
        return m

    async def no_sleep(_: float) -> None:
        return None

    fm = FailoverModel(
        [
            Candidate(
                key="refused",
                wire_name="m",
                model=model(f"http://127.0.0.1:{dead_port}/v1"),
                max_retries=1,
            ),
            Candidate(
                key="hung",
                wire_name="m",
                model=model(f"http://127.0.0.1:{port}/v1", timeout_s=0.3),
                max_retries=0,
            ),
        ],
        sleep=no_sleep,
    )
    try:
        async with asyncio.timeout(5):
            with pytest.raises(AllModelsFailed) as info:
                await fm.request(_request())
    finally:
        for aclose in closers:
            await aclose()
        await runner.cleanup()
    assert set(info.value.failures) == {"refused", "hung"}
    assert_clean(info.value)


def test_missing_key_variable_names_the_variable_not_a_value(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(ConfigError) as info:
        build_provider(
            "p",
            ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1", api_key_env=ENV),
            config_path="/etc/cf.yaml",
        )
    assert (
        ENV in str(info.value)
        and info.value.key == "providers.p.api_key_env"
        and info.value.path == "/etc/cf.yaml"
    )


def _request() -> ModelRequest:
    return ModelRequest(
        model="m",
        messages=(Message(role=Role.USER, content="hi"),),
        metadata={"batch_id": "b", "clone_index": 0},
    )
