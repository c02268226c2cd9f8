"""Nested spawns through the `subagent` tool on an in-process scheduler (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.planning import BatchRequest, BatchSubmission, plan_specs
from clonefleet.providers import SimScript
from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import LocalHost

SPAWNER = """---
name: {name}
description: Delegates to {child}.
clonefleet:
  allow_subagent_spawn: true
  tools: [file_read]
---
You coordinate. Task: {{{{ prompt }}}}
"""
LEAF = """---
name: leaf
description: Does leaf work.
clonefleet:
  tools: [file_read]
---
Leaf work: {{ prompt }}
"""


def project(tmp_path: Path) -> Path:
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "root.md").write_text(SPAWNER.format(name="root", child="middle"))
    (agents / "middle.md").write_text(SPAWNER.format(name="middle", child="leaf"))
    (agents / "leaf.md").write_text(LEAF)
    return tmp_path


def spawn_step(child: str, count: int = 1, background: bool = False) -> dict:
    return {
        "tool": "subagent",
        "args": {
            "description": f"run {child}",
            "prompt": f"{child} task",
            "subagent_type": child,
            "count": count,
            "background": background,
        },
    }


async def start(tmp_path: Path, script: dict, *, max_depth: int = 3) -> tuple[SchedulerCore, str]:
    """A core running one ``root`` job of the project in ``tmp_path``; returns it and the job."""
    cwd = project(tmp_path)
    core = SchedulerCore(LocalHost)
    config = Config(limits={"max_depth": max_depth})
    batch_id, ids = core.reserve_ids(1)
    catalog = load_catalog(cwd, (), config)
    specs = plan_specs(
        BatchRequest(agent="root", prompt="top task"),
        catalog,
        config,
        batch_id=batch_id,
        job_ids=ids,
        caller_cwd=cwd,
    )
    sub = BatchSubmission(
        batch_id=batch_id,
        specs=specs,
        config=config,
        sim_script=SimScript.from_data(script),
        project_path=str(cwd),
    )
    return core, (await core.submit(sub))["job_ids"][0]


def exit_step(summary: str) -> dict:
    return {"tool": "exit_tool", "args": {"success": True, "summary": summary}}


@pytest.mark.timeout(30)
async def test_blocking_spawn_returns_child_results_and_links_parents(tmp_path):
    script = {
        "agents": {
            "root": {"default": [spawn_step("middle"), exit_step("root done")]},
            "middle": {"default": [spawn_step("leaf", count=2), exit_step("middle done")]},
        }
    }
    core, root = await start(tmp_path, script)
    assert (await core.job_block([root], timeout_seconds=20))["done"]
    assert (await core.job_result(root))["result"]["summary"] == "root done"
    middle = list((await core.list_jobs(parent=root))["jobs"])
    assert (
        len(middle) == 1 and middle[0]["agent"] == "middle" and middle[0]["status"] == "completed"
    )
    leaves = (await core.list_jobs(parent=middle[0]["job_id"]))["jobs"]
    assert [j["agent"] for j in leaves] == ["leaf", "leaf"] and all(
        j["status"] == "completed" for j in leaves
    )

    page = await core.events(target=core.jobs[root].batch_id, level="lifecycle")
    nested = [
        e
        for e in page["events"]
        if e["event"]["type"] == "subagent_event"
        and e["event"]["event"]["type"] == "subagent_event"
    ]
    assert nested, "grandchild events arrive inside two envelopes"
    inner = nested[0]["event"]["event"]
    assert (
        nested[0]["subagent_run_id"] == root
        and nested[0]["event"]["subagent_run_id"] == middle[0]["job_id"]
    )
    assert inner["subagent_type"] == "leaf" and inner["display_name"].startswith("leaf #")
    terminal = [e for e in page["events"] if e["event"]["type"] == "result"]
    assert len(terminal) == 1  # only the root's own terminal event is unwrapped
    await core.aclose()


@pytest.mark.timeout(30)
async def test_cancel_reaches_grandchildren(tmp_path):
    script = {
        "agents": {
            "root": {"default": [spawn_step("middle")]},
            "middle": {"default": [spawn_step("leaf", count=2)]},
            "leaf": {"default": [{"hang": True}]},
        }
    }
    core, root = await start(tmp_path, script)
    for _ in range(400):
        leaves = [j for j in core.jobs.values() if j.agent == "leaf" and j.state == "running"]
        if len(leaves) == 2:
            break
        await core.job_block([root], wait_seconds=0.02)
    assert len(leaves) == 2
    await core.job_cancel(root)
    everything = list(core.jobs)
    assert (await core.job_block(everything, timeout_seconds=10))["done"]
    assert {core.jobs[j].agent: str(core.jobs[j].state) for j in everything} == {
        "root": "cancelled",
        "middle": "cancelled",
        "leaf": "cancelled",
    }
    assert await core.job_cancel(root)  # idempotent
    await core.aclose()


@pytest.mark.timeout(30)
async def test_depth_cap_refuses_spawn_with_clear_error(tmp_path):
    script = {
        "agents": {
            "root": {"default": [spawn_step("middle"), exit_step("root done")]},
            "middle": {"default": [spawn_step("leaf"), exit_step("middle gave up")]},
        }
    }
    core, root = await start(tmp_path, script, max_depth=1)
    assert (await core.job_block([root], timeout_seconds=20))["done"]
    assert not [j for j in core.jobs.values() if j.agent == "leaf"]
    events = (await core.events(level="tools"))["events"]
    ends = [
        e["event"]["event"]
        for e in events
        if e["subagent_run_id"] == root and e["event"]["type"] == "subagent_event"
    ]
    failed = [e for e in ends if e["type"] == "tool_call_end" and e["tool"] == "subagent"]
    assert failed and failed[0]["is_error"]
    await core.aclose()


@pytest.mark.timeout(30)
async def test_background_spawn_returns_ids_to_poll(tmp_path):
    script = {
        "agents": {
            "root": {
                "default": [
                    spawn_step("middle", count=3, background=True),
                    {"tool": "list_jobs", "args": {}},
                    exit_step("launched"),
                ]
            },
            "middle": {"default": [exit_step("child ok")]},
        }
    }
    core, root = await start(tmp_path, script)
    assert (await core.job_block([root], timeout_seconds=20))["done"]
    kids = (await core.list_jobs(parent=root))["jobs"]
    assert len(kids) == 3
    assert (await core.job_block([k["job_id"] for k in kids], timeout_seconds=20))["done"]
    await core.aclose()


@pytest.mark.timeout(30)
async def test_job_control_tools_status_block_result_and_cancel(tmp_path):
    # The middle job hangs; root polls it, blocks briefly (timeout), reads a running result
    # (a clear error), cancels it, then ends.
    script = {
        "agents": {
            "root": {
                "default": [
                    spawn_step("middle", background=True),
                    {"tool": "list_jobs", "args": {"agent": "middle"}},
                    {"tool": "exit_tool", "args": {"success": True, "summary": "done"}},
                ]
            },
            "middle": {"default": [{"hang": True}]},
        }
    }
    core, root = await start(tmp_path, script)
    assert (await core.job_block([root], timeout_seconds=20))["done"]
    middle = (await core.list_jobs(parent=root))["jobs"][0]["job_id"]
    from clonefleet.clone import ToolContext, job_tools
    from clonefleet.errors import ToolRetry

    tools = job_tools(core, root)
    ctx = ToolContext(root=tmp_path)
    status = await tools["job_status"].run({"job_id": middle}, ctx)
    assert '"status": "running"' in status
    blocked = await tools["job_block"].run({"job_ids": [middle], "timeout_seconds": 0.05}, ctx)
    assert '"done": false' in blocked
    with pytest.raises(ToolRetry, match="still running"):
        await tools["job_result"].run({"job_id": middle}, ctx)
    await tools["job_cancel"].run({"job_id": middle}, ctx)
    await tools["job_cancel"].run({"job_id": middle}, ctx)
    assert (await core.job_block([middle], timeout_seconds=5))["done"]
    assert '"status": "cancelled"' in await tools["job_result"].run({"job_id": middle}, ctx)
    listing = await tools["list_jobs"].run({"parent": root}, ctx)
    assert '"capacity"' in listing and middle in listing
    await core.aclose()
