"""A counted batch on real Ray actors (one Ray instance per session)."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.timeout(120)


def test_counted_batch_of_8_runs_each_clone_as_its_own_job(fleet):
    batch = fleet.spawn("general-purpose", "summarise the repository", count=8)
    assert len(batch.job_ids) == 8 and len(set(batch.job_ids)) == 8
    assert all(re.fullmatch(r"sa_[0-9a-f]{8}", j) for j in batch.job_ids)
    done = fleet.job_block([batch.batch_id], timeout_seconds=90)
    assert done["done"]
    results = [fleet.job_result(j) for j in batch.job_ids]
    assert [r["status"] for r in results] == ["completed"] * 8
    for index, record in enumerate(results):
        assert record["clone_index"] == index
        assert f"clone {index} " in record["result"]["summary"]
        # clone i starts at candidate i mod len(default group)
        assert record["model"] == ("sim-small", "sim-large")[index % 2]


def test_killed_host_ends_its_jobs_failed_abnormal_with_one_terminal_event(
    fleet, scheduler_call, tmp_path
):
    script = tmp_path / "hang.yaml"
    script.write_text("default:\n  - {hang: true}\n")
    from clonefleet.config import Config
    from clonefleet.fleet import plan_batch

    # No restarts: the killed host's clone ends at once (restarts: tests/ray/test_durability.py).
    plan = plan_batch(
        "general-purpose",
        "hang",
        2,
        config=Config(limits={"max_restarts": 0}),
        caller_cwd=fleet.cwd,
        clones_per_actor=1,
        sim_script=str(script),
    )
    batch = fleet.submit(plan)
    victim, survivor = batch.job_ids
    # Kill only once the clone runs in its host (a host that dies before its clones start is
    # replaced, and they start elsewhere).
    for _ in range(600):
        if any(e["event"]["type"] == "started" for e in fleet.events(victim)["events"]):
            break
        fleet.events(victim, wait_s=0.05)
    killed = scheduler_call("kill_host_of", victim)
    assert killed
    assert fleet.job_block([victim], timeout_seconds=30)["done"]
    record = fleet.job_result(victim)
    assert record["status"] == "failed" and record["stop_reason"] == "abnormal"
    assert record["error"].startswith("Error: subagent run ended abnormally (clone host")
    assert "limits.max_restarts is 0" in record["error"]
    assert (
        fleet.job_status(survivor)["status"] == "running"
    )  # one host's crash touches only its clones
    fleet.job_cancel(survivor)
    assert fleet.job_block([survivor], timeout_seconds=30)["done"]
    events = fleet.events(batch.batch_id)["events"]
    terminal = [e["subagent_run_id"] for e in events if e["event"]["type"] == "result"]
    assert sorted(terminal) == sorted(batch.job_ids)
