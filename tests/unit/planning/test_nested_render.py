"""A nested spawn's prompt is rendered on the parent's clone host, never in the scheduler: a
hostile prompt costs the scheduler nothing and comes back to the parent as a tool error."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from clonefleet.clone import ToolContext, job_tools
from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.errors import ToolRetry
from clonefleet.planning import BatchRequest, BatchSubmission, plan_specs
from clonefleet.providers import SimScript
from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import LocalHost

SPAWNER = """---
name: root
description: Delegates.
clonefleet:
  allow_subagent_spawn: true
  tools: [file_read]
---
You coordinate. Task: {{ prompt }}
"""
LEAF = """---
name: leaf
description: Does leaf work.
clonefleet:
  tools: [file_read]
---
Leaf {{ clone.number }}/{{ clone.count }}: {{ prompt }}
"""

# Each of these once ran for seconds to minutes inside the scheduler (and froze it).
TIME_BOMB = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}"
SIZE_BOMB = (
    "{% set ns = namespace(c=cycler('x' * 1000000)) %}{% for i in range(11) %}"
    "{% set ns.c = cycler(ns.c.items, ns.c.items) %}{% endfor %}{{ ns.c.items|replace('a', 'b') }}"
)
PUNYCODE = "{{ ('\u00e9' * 500000).encode('punycode') }}"


async def start(
    tmp_path: Path, host_factory: Any = LocalHost, agents: dict[str, Any] | None = None
) -> tuple[SchedulerCore, str]:
    """A core running one ``root`` job that hangs (so it stays running); returns it and the job."""
    folder = tmp_path / ".clonefleet" / "subagents"
    folder.mkdir(parents=True)
    (folder / "root.md").write_text(SPAWNER)
    (folder / "leaf.md").write_text(LEAF)
    core = SchedulerCore(host_factory)
    config = Config()
    catalog = load_catalog(tmp_path, (), config)
    batch_id, ids = core.reserve_ids(1)
    specs = plan_specs(
        BatchRequest(agent="root", prompt="top"),
        catalog,
        config,
        batch_id=batch_id,
        job_ids=ids,
        caller_cwd=tmp_path,
    )
    script = {"agents": {"root": {"default": [{"hang": True}]}, **(agents or {})}}
    sub = BatchSubmission(
        batch_id=batch_id,
        specs=specs,
        config=config,
        sim_script=SimScript.from_data(script),
        project_path=str(tmp_path),
        catalog=catalog,
    )
    return core, (await core.submit(sub))["job_ids"][0]


async def spawn(core: SchedulerCore, parent: str, prompt: str, tmp_path: Path, **args: Any) -> str:
    tool = job_tools(core, parent)["subagent"]
    call = {"description": "d", "prompt": prompt, "subagent_type": "leaf", **args}
    return await tool.run(call, ToolContext(root=tmp_path))


async def slowest_listing_while(task: asyncio.Task[Any], core: SchedulerCore) -> float:
    """Call ``list_jobs`` every 20 ms until ``task`` is done; the longest a call took."""
    slowest = 0.0
    while not task.done():
        started = time.perf_counter()
        await asyncio.wait_for(core.list_jobs(), 1.0)
        slowest = max(slowest, time.perf_counter() - started)
        await asyncio.sleep(0.02)
    return slowest


@pytest.mark.timeout(30)
async def test_a_prompt_that_burns_its_budget_never_delays_the_scheduler(tmp_path):
    core, root = await start(tmp_path)
    started = time.perf_counter()
    task = asyncio.create_task(spawn(core, root, TIME_BOMB, tmp_path))
    # The render takes its whole half-second budget; the scheduler answers throughout.
    slowest = await slowest_listing_while(task, core)
    with pytest.raises(ToolRetry, match="template-limit.*time budget"):
        await task
    assert time.perf_counter() - started < 2.0
    assert slowest < 0.1, f"list_jobs took {slowest:.3f}s while a nested prompt rendered"
    assert not core.table.reserved, "the refused batch's ids are released"
    assert set(core.jobs) == {root}, "nothing was started"
    await core.aclose()


@pytest.mark.parametrize(
    ("prompt", "reason"), [(SIZE_BOMB, "template-limit"), (PUNYCODE, "template-security")]
)
@pytest.mark.timeout(30)
async def test_a_prompt_that_once_ran_for_minutes_in_one_c_call_is_refused_at_once(
    tmp_path, prompt, reason
):
    core, root = await start(tmp_path)
    started = time.perf_counter()
    task = asyncio.create_task(spawn(core, root, prompt, tmp_path))
    slowest = await slowest_listing_while(task, core)
    with pytest.raises(ToolRetry, match=reason):
        await task
    assert time.perf_counter() - started < 2.0
    assert slowest < 0.1
    assert set(core.jobs) == {root}
    await core.aclose()


class StuckHost(LocalHost):
    """A host whose render never answers (as if it were wedged)."""

    async def plan(self, planner: Any) -> Any:
        await asyncio.Event().wait()


@pytest.mark.timeout(30)
async def test_a_host_that_never_answers_fails_the_spawn_and_not_the_scheduler(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("clonefleet.scheduler._nested.NESTED_PLAN_TIMEOUT_S", 0.3)
    core, root = await start(tmp_path, StuckHost)
    task = asyncio.create_task(spawn(core, root, "plain task", tmp_path))
    slowest = await slowest_listing_while(task, core)
    with pytest.raises(ToolRetry, match="not rendered within 0.3 s on clone host h1"):
        await task
    assert slowest < 0.1
    assert not core.table.reserved
    await core.aclose()


class ForgingHost(LocalHost):
    """A host that answers with a batch of another parent."""

    async def plan(self, planner: Any) -> Any:
        specs = await super().plan(planner)
        return tuple(replace(s, parent="sa_00000000") for s in specs)


@pytest.mark.timeout(30)
async def test_the_scheduler_accepts_only_the_batch_it_asked_for(tmp_path):
    core, root = await start(tmp_path, ForgingHost)
    with pytest.raises(ToolRetry, match="another batch"):
        await spawn(core, root, "plain task", tmp_path)
    assert set(core.jobs) == {root}
    await core.aclose()


@pytest.mark.timeout(30)
async def test_a_templated_nested_prompt_is_rendered_per_child(tmp_path):
    core, root = await start(tmp_path, agents={"leaf": {"default": [{"hang": True}]}})
    prompt = "part {{ clone.number }} of {{ clone.count }}"
    assert '"job_ids"' in await spawn(core, root, prompt, tmp_path, count=2, background=True)
    children = sorted(
        (j for j in core.jobs.values() if j.parent == root), key=lambda j: j.clone_index
    )
    specs = [core.table.spec_of(c.job_id) for c in children]
    assert [s.task for s in specs] == ["part 1 of 2", "part 2 of 2"]
    # No paragraph is shared by every child's body, so each body is the child's own.
    assert [s.instructions for s in specs] == ["", ""]
    assert [s.instructions_own.strip() for s in specs] == [
        "Leaf 1/2: part 1 of 2",
        "Leaf 2/2: part 2 of 2",
    ]
    assert all(s.parent == root and s.depth == 1 for s in specs)
    await core.job_cancel(root)
    assert (await core.job_block(list(core.jobs), timeout_seconds=10))["done"]
    await core.aclose()
