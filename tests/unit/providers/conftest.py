"""Fixtures of the provider tests: a simulated server on loopback and HTTP models built from config."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from clonefleet.clone import Candidate
from clonefleet.config import ProviderConfig
from clonefleet.providers import (
    SIM_SERVER,
    Message,
    Model,
    ModelRequest,
    Role,
    SimServer,
    ToolSpec,
    build_provider,
    set_live_requests_allowed,
    start_server,
)

StartSim = Callable[..., Awaitable[tuple[SimServer, str]]]
BuildModel = Callable[..., Model]


@pytest.fixture(autouse=True)
def _no_live_requests() -> Any:
    # Non-loopback hosts are refused in these tests; the simulated server is loopback.
    previous = set_live_requests_allowed(False)
    yield
    set_live_requests_allowed(previous)


@pytest.fixture
async def sim() -> AsyncIterator[StartSim]:
    """``await sim(**opts)`` starts a simulated server on a free port: ``(state, base_url)``."""
    runners = []

    async def start(**opts: Any) -> tuple[SimServer, str]:
        runner, port = await start_server(**opts)
        runners.append(runner)
        return runner.app[SIM_SERVER], f"http://127.0.0.1:{port}/v1"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def openai_model() -> AsyncIterator[BuildModel]:
    """``openai_model(base_url, **provider_cfg)`` builds an ``openai`` provider's model; closed after."""
    closers = []

    def build(base_url: str, **cfg: Any) -> Model:
        model, aclose = build_provider(
            "local", ProviderConfig(kind="openai", base_url=base_url, **cfg)
        )
        closers.append(aclose)
        return model

    yield build
    for aclose in closers:
        await aclose()


class SleepRecorder:
    """Stands in for ``asyncio.sleep`` in ``FailoverModel``: records backoff delays, waits none."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def cand() -> Callable[..., Candidate]:
    """``cand(key, model, max_retries=2, timeout_s=10.0)``: a candidate of a model group."""

    def make(key: str, model: Model, *, max_retries: int = 2, timeout_s: float = 10.0) -> Candidate:
        return Candidate(
            key=key,
            wire_name="sim-small",
            model=model,
            max_retries=max_retries,
            timeout_s=timeout_s,
        )

    return make


EXIT_SCHEMA = {
    "type": "object",
    "properties": {"success": {"type": "boolean"}, "summary": {"type": "string"}},
    "required": ["success", "summary"],
}
TOOLS = (
    ToolSpec(
        name="progress_update",
        description="Report progress.",
        parameters={"type": "object", "properties": {"summary": {"type": "string"}}},
    ),
    ToolSpec(name="exit_tool", description="Finish the task.", parameters=EXIT_SCHEMA),
)


def _request(
    clone_index: int = 0, *, batch_id: str = "batch1", messages: tuple[Message, ...] | None = None
) -> ModelRequest:
    return ModelRequest(
        model="sim-small",
        messages=messages
        or (
            Message(role=Role.SYSTEM, content="You review code."),
            Message(role=Role.USER, content="Review foo.py"),
        ),
        tools=TOOLS,
        metadata={"batch_id": batch_id, "clone_index": clone_index},
    )


@pytest.fixture
def req() -> Callable[..., ModelRequest]:
    """``req(clone_index=0, batch_id="batch1", messages=None)``: a clone's request, as the loop builds it."""
    return _request
