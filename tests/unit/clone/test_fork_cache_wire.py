"""A fork child's first request on the Anthropic wire, against the simulated server on
127.0.0.1: its caller's previous request wrote its whole prefix at its rolling breakpoint, and
the child's first request (that request plus one user message) reads it back: at least 90% of
its input from the cache (docs/prompt-cache.md, "Fork spawns")."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from clonefleet.clone import Candidate, Clone, CloneSpec, FailoverModel
from clonefleet.config import ProviderConfig
from clonefleet.planning import fork_of
from clonefleet.providers import SimScript, build_provider, start_server
from clonefleet.testing import make_spec

pytestmark = pytest.mark.timeout(30)

BODY = "\n\n".join(
    f"{i}. Read each changed file in full before judging it, name the line you mean, and say"
    " what should change and why; prefer one precise finding to three vague ones."
    for i in range(80)
)
# The server scripts by clone index: the parent (clone 0) looks, forks and ends; the child
# (clone 1 of its batch) inherits one assistant turn, so it starts at its script's second step.
SCRIPT = {
    "clones": {
        0: [
            {"tool": "list_dir", "args": {"path": "."}},
            {"tool": "subagent", "args": {"description": "again", "prompt": "Look again."}},
            {"tool": "exit_tool", "args": {"success": True, "summary": "parent done"}},
        ],
        1: [{"text": "unused"}, {"text": "the second look agrees"}],
    }
}


class OneFork:
    """Runs a fork child in process over the same model, as clone 1 of its own batch."""

    def __init__(self, model: FailoverModel, parent: CloneSpec) -> None:
        self.model, self.parent = model, parent
        self.events: list[dict[str, Any]] = []
        self.record: dict[str, Any] = {}

    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> dict[str, Any]:
        fork = fork_of(request, self.parent)
        assert fork is not None
        planned = dataclasses.replace(
            self.parent,
            job_id="sa_0000c001",
            batch_id="b_0000c001",
            clone_index=1,
            clone_count=2,
            task=request["prompt"],
            parent=parent_job_id,
            depth=1,
        )
        child = Clone(fork.child(planned), self.model, emit=self.events.append, control=self)
        self.record = (await child.run()).to_json()
        return {"batch_id": "b_0000c001", "job_ids": ["sa_0000c001"]}

    async def job_block(self, ids: list[str], *args: Any) -> dict[str, Any]:
        return {"done": True, "jobs": []}

    async def job_result(self, job_id: str) -> dict[str, Any]:
        return self.record


@pytest.fixture
async def anthropic(monkeypatch) -> AsyncIterator[FailoverModel]:
    monkeypatch.setenv("FORK_WIRE_TEST_KEY", "sk-fork-test")
    runner, port = await start_server(script=SimScript.from_data(SCRIPT))
    cfg = ProviderConfig(
        kind="anthropic", base_url=f"http://127.0.0.1:{port}", api_key_env="FORK_WIRE_TEST_KEY"
    )
    model, aclose = build_provider("sim", cfg)
    try:
        yield FailoverModel([Candidate(key="m", wire_name="sim-small", model=model)])
    finally:
        await aclose()
        await runner.cleanup()


async def test_a_fork_childs_first_request_reads_its_callers_turns_on_the_anthropic_wire(
    anthropic, tmp_path
):
    spec = make_spec(
        job_id="sa_0000a001",
        batch_id="b_0000a001",
        instructions=BODY,
        allow_subagent_spawn=True,
        subagent_provider="fork",
        tools=("list_dir",),
        cwd=str(tmp_path),
    )
    control = OneFork(anthropic, spec)
    events: list[dict[str, Any]] = []
    result = await Clone(spec, anthropic, emit=events.append, control=control).run()
    assert result.status == "completed" and result.result["summary"] == "parent done"
    assert control.record["result"] == "the second look agrees"
    parent = [e for e in events if e["type"] == "usage"]
    (first,) = [e for e in control.events if e["type"] == "usage"]
    assert len(parent) == 3
    assert first["input_tokens"] > parent[1]["input_tokens"] >= 2000
    assert first["cache_read_tokens"] >= parent[1]["input_tokens"]  # all of the caller's request
    assert first["cache_read_tokens"] >= 0.9 * first["input_tokens"], (first, parent)
