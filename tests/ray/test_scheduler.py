"""Scheduler on real Ray: the pool under a cap, job control, nested spawns through actors."""

from __future__ import annotations

import pytest

from clonefleet import Fleet
from clonefleet.config import Config
from clonefleet.errors import ClusterError, UnknownJobError, UsageError

pytestmark = pytest.mark.timeout(120)


def peak_from_events(events: list[dict]) -> int:
    running = peak = 0
    for env in events:
        kind = env["event"]["type"]
        if kind == "started":
            running += 1
            peak = max(peak, running)
        elif kind == "result":
            running -= 1
    return peak


def test_cap_runs_a_pool_of_4_and_finishes_all_20(ray_cluster, tmp_path):
    fleet = Fleet(
        cwd=tmp_path,
        config=Config(providers={"sim": {"kind": "simulated", "simulated": {"latency_ms": 30}}}),
    )
    script = tmp_path / "slow0.yaml"
    # Clone 0 is slow; in a pool the other 19 flow through the 3 remaining slots meanwhile.
    script.write_text(
        "clones:\n  0:\n    - {tool: progress_update, args: {summary: slow}, latency_ms: 2500}\n"
        "    - {tool: exit_tool, args: {success: true, summary: slow done}}\n"
    )
    batch = fleet.spawn(
        "general-purpose",
        "job {{ clone.index }}",
        count=20,
        max_concurrency=4,
        sim_script=str(script),
    )
    # The pool is full at once: 4 of this batch's jobs run. Until the queue runs dry (19 quick
    # jobs through 3 slots, far longer than this call) a finished job's slot is refilled in the
    # same step, so the count is exactly 4 whenever it is read.
    states = [j["status"] for j in fleet.list_jobs(batch=batch.batch_id)["jobs"]]
    assert len(states) == 20 and states.count("running") == 4
    assert fleet.job_block([batch.batch_id], timeout_seconds=90)["done"]
    records = [fleet.job_result(j) for j in batch.job_ids]
    assert all(r["status"] == "completed" for r in records)
    events = fleet.events(batch.batch_id, level="lifecycle")["events"]
    started = [e["subagent_run_id"] for e in events if e["event"]["type"] == "started"]
    assert sorted(started) == sorted(batch.job_ids), "every job started once, so the peak sees all"
    # Never more than 4 at once; at least the slow one and a quick one overlapped.
    assert 2 <= peak_from_events(events) <= 4
    order = [e["subagent_run_id"] for e in events if e["event"]["type"] == "result"]
    assert order[-1] == batch.job_ids[0], (
        "the 19 quick jobs finished while the slow one held its slot"
    )


def test_job_control_errors_and_timeouts(fleet, tmp_path):
    script = tmp_path / "hang.yaml"
    script.write_text("default:\n  - {hang: true}\n")
    batch = fleet.spawn("general-purpose", "hang", count=2, sim_script=str(script))
    job = batch.job_ids[0]
    with pytest.raises(UsageError, match="still"):
        fleet.job_result(job)
    with pytest.raises(UnknownJobError):
        fleet.job_status("sa_ffffffff")
    blocked = fleet.job_block(batch.job_ids, timeout_seconds=0.2)
    assert blocked["done"] is False and {s["status"] for s in blocked["jobs"]} <= {
        "running",
        "reserved",
    }
    for j in batch.job_ids:
        fleet.job_cancel(j)
    fleet.job_cancel(job)  # idempotent
    assert fleet.job_block(batch.job_ids, timeout_seconds=30)["done"]
    assert [fleet.job_result(j)["error"] for j in batch.job_ids] == [
        "Error: subagent run was cancelled"
    ] * 2


SPAWNER = """---
name: lead
description: Splits work across helpers.
clonefleet:
  allow_subagent_spawn: true
  tools: [file_read]
---
Coordinate: {{ prompt }}
"""


def test_nested_spawn_through_actors_streams_nested_envelopes(ray_cluster, tmp_path):
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "lead.md").write_text(SPAWNER)
    script = tmp_path / "nested.yaml"
    script.write_text(
        "agents:\n  lead:\n    default:\n"
        "      - {tool: subagent, args: {description: split, prompt: part, subagent_type: researcher, count: 2}}\n"
        "      - {tool: exit_tool, args: {success: true, summary: merged}}\n"
    )
    fleet = Fleet(cwd=tmp_path)
    batch = fleet.spawn("lead", "the whole task", count=1, sim_script=str(script))
    assert fleet.job_block([batch.batch_id], timeout_seconds=90)["done"]
    lead = batch.job_ids[0]
    assert fleet.job_result(lead)["result"] == {"success": True, "summary": "merged"}
    children = fleet.list_jobs(parent=lead)["jobs"]
    assert sorted(c["clone_index"] for c in children) == [0, 1]
    assert all(c["agent"] == "researcher" and c["status"] == "completed" for c in children)
    events = fleet.events(batch.batch_id, level="all")["events"]
    nested = [e["event"] for e in events if e["event"]["type"] == "subagent_event"]
    assert {n["subagent_run_id"] for n in nested} == {c["job_id"] for c in children}
    assert {n["display_name"] for n in nested} == {"researcher #0", "researcher #1"}
    assert all(e["subagent_run_id"] == lead for e in events)
    tool_ends = [
        e["event"]
        for e in events
        if e["event"]["type"] == "tool_call_end" and e["event"]["tool"] == "subagent"
    ]
    assert tool_ends and not tool_ends[0]["is_error"]


def test_a_fault_in_the_scheduler_names_the_call_in_plain_text(fleet, scheduler_call):
    # Not a batch: the scheduler fails to unpickle it, which is not one of our errors.
    with pytest.raises(ClusterError) as caught:
        scheduler_call("submit", b"not a pickle")
    text = str(caught.value)
    assert text.startswith("scheduler call submit failed with UnpicklingError"), text
    assert "\x1b" not in text, "no terminal colour codes in the message"
    assert "remote.py" in text, "the scheduler's traceback follows"
