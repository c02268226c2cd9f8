"""ProviderPool: ``models.<name>.max_tokens`` is each candidate's answer cap, sent on both wires
to a real server on 127.0.0.1 (docs/config.md); without it each wire keeps its default."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from clonefleet.clone import FailoverModel
from clonefleet.config import Config
from clonefleet.host import ProviderPool
from clonefleet.providers import Message, ModelRequest, Role

pytestmark = pytest.mark.timeout(30)


class Both:
    """Answers the chat-completions and the Messages routes with one word; records each body by
    route."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[dict[str, Any]]] = {"openai": [], "anthropic": []}

    async def openai(self, request: web.Request) -> web.Response:
        self.bodies["openai"].append(await request.json())
        choice = {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"choices": [choice]})

    async def anthropic(self, request: web.Request) -> web.Response:
        self.bodies["anthropic"].append(await request.json())
        content = [{"type": "text", "text": "ok"}]
        return web.json_response({"type": "message", "content": content, "stop_reason": "end_turn"})


@pytest.fixture
async def pool(monkeypatch) -> AsyncIterator[tuple[Both, ProviderPool]]:
    monkeypatch.setenv("POOL_CAP_KEY", "sk-pool-cap")
    server = Both()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.openai)
    app.router.add_post("/v1/messages", server.anthropic)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    config = Config(
        providers={
            "oai": {"kind": "openai", "base_url": url},
            "oai-new": {
                "kind": "openai",
                "base_url": url,
                "max_tokens_param": "max_completion_tokens",
            },
            "ant": {"kind": "anthropic", "base_url": url, "api_key_env": "POOL_CAP_KEY"},
        },
        models={
            "o-capped": {"provider": "oai", "name": "o1", "max_tokens": 300},
            "o-free": {"provider": "oai", "name": "o2"},
            "o-new": {"provider": "oai-new", "name": "o3", "max_tokens": 200},
            "a-capped": {"provider": "ant", "name": "a1", "max_tokens": 700},
            "a-free": {"provider": "ant", "name": "a2"},
        },
    )
    providers = ProviderPool(config)
    yield server, providers
    await providers.aclose()
    await runner.cleanup()


REQ = ModelRequest(model="", messages=(Message(role=Role.USER, content="hi"),))


async def test_each_model_s_max_tokens_goes_on_its_wire(pool):
    server, providers = pool
    for key in ("o-capped", "o-free", "o-new", "a-capped", "a-free"):
        cand = providers.candidate(key)
        assert cand.max_tokens == providers.config.models[key].max_tokens
        assert (await FailoverModel([cand]).request(REQ)).text == "ok"
    sent = [
        (b["model"], b.get("max_tokens"), b.get("max_completion_tokens"))
        for b in server.bodies["openai"]
    ]
    assert sent == [("o1", 300, None), ("o2", None, None), ("o3", None, 200)]
    assert [(b["model"], b["max_tokens"]) for b in server.bodies["anthropic"]] == [
        ("a1", 700),
        ("a2", 4096),
    ]


async def test_a_request_s_smaller_cap_wins_over_the_model_s(pool):
    server, providers = pool
    small = ModelRequest(model="", messages=REQ.messages, max_tokens=20)
    await FailoverModel([providers.candidate("o-capped")]).request(small)
    large = ModelRequest(model="", messages=REQ.messages, max_tokens=5000)
    await FailoverModel([providers.candidate("o-capped")]).request(large)
    assert [b["max_tokens"] for b in server.bodies["openai"]] == [20, 300]


def test_a_max_tokens_below_one_is_a_config_error():
    with pytest.raises(ValueError, match="max_tokens"):
        Config(
            providers={"p": {"kind": "simulated"}},
            models={"m": {"provider": "p", "name": "m", "max_tokens": 0}},
        )
