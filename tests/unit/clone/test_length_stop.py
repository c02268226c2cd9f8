"""A stop for length in a run: the candidate's ``max_tokens`` goes on the wire, an answer that
stopped at it marks its usage event ``stop: "length"`` and warns the run once (docs/json.md),
through a real Messages API server on 127.0.0.1 and the failover layer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from clonefleet.clone import Candidate, Clone, FailoverModel
from clonefleet.config import ProviderConfig
from clonefleet.providers import build_provider
from clonefleet.testing import make_spec

pytestmark = pytest.mark.timeout(30)
WARNING = "the model's answer stopped at its max_tokens limit"


def tool_use(i: int, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": arguments}


class Messages:
    """A Messages API server answering ``answers`` in turn (``(block, stop_reason)``)."""

    def __init__(self, answers: list[tuple[dict[str, Any], str]]) -> None:
        self.answers = answers
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        block, stop = self.answers[len(self.bodies) - 1]
        usage = {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5}
        answer = {"type": "message", "content": [block], "stop_reason": stop, "usage": usage}
        return web.json_response(answer)


@pytest.fixture
async def served(monkeypatch) -> AsyncIterator[Any]:
    """``await served(answers, max_tokens)``: ``(server, failover model)`` over one candidate."""
    monkeypatch.setenv("LENGTH_TEST_KEY", "sk-length-test")
    runners: list[web.AppRunner] = []
    closers: list[Any] = []

    async def start(answers: list[tuple[dict[str, Any], str]], max_tokens: int | None) -> Any:
        server = Messages(answers)
        app = web.Application()
        app.router.add_post("/v1/messages", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        cfg = ProviderConfig(kind="anthropic", base_url=url, api_key_env="LENGTH_TEST_KEY")
        model, aclose = build_provider("claude", cfg)
        closers.append(aclose)
        cand = Candidate(key="c", wire_name="claude-x", model=model, max_tokens=max_tokens)
        return server, FailoverModel([cand])

    yield start
    for aclose in closers:
        await aclose()
    for runner in runners:
        await runner.cleanup()


async def test_answers_cut_at_the_cap_mark_their_usage_and_warn_the_run_once(served):
    server, model = await served(
        [
            (tool_use(1, "progress_update", summary="reading"), "max_tokens"),
            (tool_use(2, "progress_update", summary="still reading"), "max_tokens"),
            (tool_use(3, "exit_tool", success=True, summary="done"), "tool_use"),
        ],
        max_tokens=50,
    )
    events: list[dict[str, Any]] = []
    result = await Clone(make_spec(), model, emit=events.append).run()
    assert (result.status, result.turns) == ("completed", 3)
    assert [b["max_tokens"] for b in server.bodies] == [50, 50, 50]
    usage = [e for e in events if e["type"] == "usage"]
    assert [e.get("stop") for e in usage] == ["length", "length", None]
    assert [(e["input_tokens"], e["cache_read_tokens"]) for e in usage] == [(100, 90)] * 3
    assert [w for w in result.warnings if WARNING in w] == [f"turn 1: {WARNING}"]


async def test_a_run_without_a_length_stop_has_no_such_warning_and_the_default_cap(served):
    server, model = await served(
        [(tool_use(1, "exit_tool", success=True, summary="done"), "tool_use")], max_tokens=None
    )
    events: list[dict[str, Any]] = []
    result = await Clone(make_spec(), model, emit=events.append).run()
    assert result.status == "completed"
    assert server.bodies[0]["max_tokens"] == 4096  # the Anthropic wire's default
    assert not [w for w in result.warnings if WARNING in w]
    assert all("stop" not in e for e in events if e["type"] == "usage")
