"""Fork spawns on an in-process scheduler (no Ray): a fork child runs its parent's definition one
level down through the nested-spawn path, counts against the depth cap and its ancestors'
budgets, gives its parent the exact error texts, and survives a scheduler restart
(docs/prompt-cache.md, "Fork spawns").

The simulated model scripts each clone by (definition, clone index) and starts a clone it has
not seen at the step after the assistant turns already in its context; a fork child inherits its
parent's turns, so it starts where its parent forked. The root batch has two clones: clone 1 is
the parent (it looks around, then forks), and its fork child (clone 0 of its own batch) reads the
steps of ``clones.0`` from the second one on; root clone 0 only uses the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clonefleet.clone import state_of
from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.planning import BatchRequest, BatchSubmission, plan_specs
from clonefleet.providers import SimScript
from clonefleet.scheduler import SchedulerCore
from clonefleet.scheduler._recovery import restore
from clonefleet.testing import (
    LocalHost,
    LocalHosts,
    crash_core,
    open_journaled_core,
    wait_until,
)
from clonefleet.vocab import STOP_ERRORS, StopReason

pytestmark = pytest.mark.timeout(30)

FORKER = """---
name: root
description: Reviews, and forks itself for a second look.
clonefleet:
  allow_subagent_spawn: true
  subagent_provider: fork
  tools: [file_read, list_dir]
---
You review code carefully.

Task: {{ prompt }}
"""

LOOK = {"tool": "list_dir", "args": {"path": "."}}
FORK = {"tool": "subagent", "args": {"description": "second look", "prompt": "check it again"}}
HANG = {"hang": True}


def exit_step(summary: str) -> dict[str, Any]:
    return {"tool": "exit_tool", "args": {"success": True, "summary": summary}}


def script(child: list[dict[str, Any]], parent_after: list[dict[str, Any]]) -> dict[str, Any]:
    """Root clone 0 exits at once; the fork child runs ``child``; the parent (root clone 1)
    looks, forks, then runs ``parent_after``."""
    clones = {0: [exit_step("clone 0 done"), *child], 1: [LOOK, FORK, *parent_after]}
    return {"agents": {"root": {"clones": clones}}}


async def start(
    tmp_path: Path,
    steps: dict[str, Any],
    *,
    core: SchedulerCore | None = None,
    config: Config | None = None,
    budget_tokens: int | None = None,
) -> tuple[SchedulerCore, list[str]]:
    """A core running the two-clone root batch of the project in ``tmp_path``."""
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True, exist_ok=True)
    (agents / "root.md").write_text(FORKER)
    core = core or SchedulerCore(LocalHost)
    config = config or Config()
    batch_id, ids = core.reserve_ids(2)
    specs = plan_specs(
        BatchRequest(agent="root", prompt="review the code", count=2),
        load_catalog(tmp_path, (), config),
        config,
        batch_id=batch_id,
        job_ids=ids,
        caller_cwd=tmp_path,
    )
    assert all(s.subagent_provider == "fork" for s in specs)
    sub = BatchSubmission(
        batch_id=batch_id,
        specs=specs,
        config=config,
        sim_script=SimScript.from_data(steps),
        project_path=str(tmp_path),
        budget_tokens=budget_tokens,
    )
    return core, (await core.submit(sub))["job_ids"]


def children(core: SchedulerCore, parent: str) -> list[str]:
    return [j for j, rec in core.jobs.items() if rec.parent == parent]


async def test_a_fork_child_runs_the_parents_definition_and_returns_its_final_text(tmp_path):
    core, (first, parent) = await start(
        tmp_path, script([exit_step("fork child done")], [exit_step("parent done")])
    )
    assert (await core.job_block([first, parent], timeout_seconds=20))["done"]
    (child,) = children(core, parent)
    record = await core.job_result(child)
    assert record["agent"] == "root" and record["status"] == "completed"
    assert record["result"]["summary"] == "fork child done"
    assert core.jobs[child].depth == 1
    assert (await core.job_result(parent))["result"]["summary"] == "parent done"
    # The child's first request held the parent's completed turn (its first assistant turn and
    # the list_dir result), and its own usage counts as any child's.
    assert record["turns"] == 1 and record["usage"]["input_tokens"] > 0
    assert not children(core, first) and not children(core, child)
    await core.aclose()


async def test_a_fork_past_the_depth_cap_is_refused_and_nothing_starts(tmp_path):
    config = Config(limits={"max_depth": 0})
    core, (first, parent) = await start(
        tmp_path, script([], [exit_step("parent went on")]), config=config
    )
    assert (await core.job_block([first, parent], timeout_seconds=20))["done"]
    assert not children(core, parent)
    assert (await core.job_result(parent))["result"]["summary"] == "parent went on"
    events = (await core.events(level="tools"))["events"]
    ends = [e["event"] for e in events if e["subagent_run_id"] == parent]
    assert [
        e["is_error"] for e in ends if e["type"] == "tool_call_end" and e["tool"] == "subagent"
    ] == [True]
    await core.aclose()


async def test_a_fork_childs_usage_counts_against_its_parents_batch_budget(tmp_path):
    core, (first, parent) = await start(
        tmp_path,
        script([exit_step("fork child done")], [exit_step("parent done")]),
        budget_tokens=10**9,
    )
    assert (await core.job_block([first, parent], timeout_seconds=20))["done"]
    (child,) = children(core, parent)
    batch = core.jobs[parent].batch_id
    spent = core.usage.budgets[batch].spent_tokens
    own = sum(core.jobs[j].usage["total_tokens"] for j in (first, parent))
    assert core.jobs[child].usage["total_tokens"] > 0
    assert spent == own + core.jobs[child].usage["total_tokens"]
    await core.aclose()


async def wait_tool_answer(core: SchedulerCore, parent: str) -> str:
    """The parent's answer from the fork tool, read from its latest checkpoint."""
    found: list[str] = []

    def answered() -> bool:
        state = state_of(core.table.checkpoint_of(parent))
        for m in (state or {}).get("messages", []):
            if m.get("role") == "tool" and m.get("name") == "subagent":
                found.append(m["content"])
                return True
        return False

    await wait_until(answered, limit_s=20)
    return found[0]


@pytest.mark.parametrize(
    ("child", "reason"),
    [
        ([{"refuse": True, "text": "I will not."}], StopReason.DECLINED),
        ([{"error": 400}] * 20, StopReason.FAILED),
        ([HANG], StopReason.CANCELLED),
    ],
)
async def test_a_failed_fork_child_gives_its_parent_the_exact_error_text(tmp_path, child, reason):
    config = Config(durability={"checkpoint_interval_s": 0})
    core, (first, parent) = await start(tmp_path, script(child, [HANG]), config=config)
    if reason is StopReason.CANCELLED:
        await wait_until(lambda: bool(children(core, parent)))
        (kid,) = children(core, parent)
        await wait_until(lambda: core.jobs[kid].state == "running")
        await core.job_cancel(kid)
    answer = await wait_tool_answer(core, parent)
    assert answer == STOP_ERRORS[reason]
    await core.cancel_many([parent])
    await core.aclose()


async def test_a_fork_child_resumes_after_a_scheduler_restart(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    config = Config(durability={"checkpoint_interval_s": 0}, limits={"max_restarts": 2})
    steps = script([LOOK, HANG], [HANG])
    _, (first, parent) = await start(tmp_path, steps, core=core, config=config)
    await wait_until(lambda: bool(children(core, parent)))
    (child,) = children(core, parent)
    await wait_until(lambda: child in core.table.checkpoints)
    seed = core.table.spec_of(child).seed_messages  # type: ignore[union-attr]
    assert seed and seed[0].role == "system"
    await journal.commit()
    crash_core(core, journal, hosts)

    hosts2 = LocalHosts()
    core2, journal2, table = open_journaled_core(tmp_path / "j", hosts2)
    restore(core2, table)
    await wait_until(lambda: any(child in h.resumed for h in hosts2.made))
    spec = core2.table.spec_of(child)
    assert spec is not None and spec.seed_messages == seed and spec.subagent_provider == "fork"
    (resumed,) = [h.resumed[child] for h in hosts2.made if child in h.resumed]
    inherited = resumed["messages"][: len(seed)]
    assert [(m["role"], m["content"]) for m in inherited] == [(m.role, m.content) for m in seed]
    status = await core2.job_status(child)
    assert status["status"] == "running" and status["restarts"] == 1
    await core2.cancel_many([core2.jobs[parent].batch_id])
    await core2.aclose()
    await journal2.aclose()
