"""Faults on real Ray: the scheduler's process killed mid-batch, a clone host killed mid-turn,
idle warm hosts killed, and a bounded chaos run. Every accepted job ends exactly once and every
result stays readable (docs/durability.md)."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.fleet import plan_batch
from clonefleet.journal import read_journal

pytestmark = pytest.mark.timeout(240)


def config(latency_ms: int = 0, restarts: int = 2) -> Config:
    return Config(
        providers={"sim": {"kind": "simulated", "simulated": {"latency_ms": latency_ms}}},
        limits={"max_restarts": restarts},
        durability={"checkpoint_interval_s": 0.0},
    )


def submit(fleet, count, *, script=None, latency_ms=0, per=None, restarts=2, tmp=None):
    path = None
    if script is not None:
        path = Path(tmp) / f"script-{random.random()}.yaml"
        import yaml

        path.write_text(yaml.safe_dump(script))
    plan = plan_batch(
        "general-purpose",
        "durable work",
        count,
        config=config(latency_ms, restarts),
        caller_cwd=fleet.cwd,
        sim_script=str(path) if path else None,
        clones_per_actor=per,
    )
    return fleet.submit(plan)


def health(scheduler_call) -> dict:
    for _ in range(400):  # the scheduler may be restarting: bounded retries
        try:
            return scheduler_call("health")
        except Exception:
            time.sleep(0.05)
    raise AssertionError("the scheduler never answered")


def block(fleet, ids, limit_s=90.0) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            out = fleet.job_block(ids, timeout_seconds=min(10.0, deadline - time.monotonic()))
        except Exception:  # the scheduler restarting: retry within the deadline
            time.sleep(0.05)
            continue
        if out["done"]:
            return out
    raise AssertionError(f"jobs not done within {limit_s}s")


def ends_in_journal(scheduler_call, ids) -> dict[str, int]:
    """How many end records each job has, once every job's has reached the disk (the journal
    writes ends in groups, every 50 ms)."""
    deadline = time.monotonic() + 10
    while True:
        counts = _ends(scheduler_call)
        if all(j in counts for j in ids) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def _ends(scheduler_call) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in read_journal(health(scheduler_call)["journal_dir"]).records:
        if rec.get("k") == "end":
            counts[rec["j"]] = counts.get(rec["j"], 0) + 1
        elif rec.get("k") == "batch":  # a compaction snapshot carries ends inside its rows
            for part in rec["jobs"]:
                row = {**rec.get("base", {}), **part}  # fields every row shares are in base
                if row["state"] in ("completed", "failed", "cancelled"):
                    counts[row["job_id"]] = counts.get(row["job_id"], 0) + 1
    return counts


def progress_by(fleet, batch_id, turns, limit_s=30.0) -> None:
    """Wait until the batch's clones made ``turns`` more model turns, or it has ended."""

    def made() -> tuple[int, bool]:
        try:
            jobs = fleet.list_jobs(batch=batch_id)["jobs"]
        except Exception:
            return -1, False  # the scheduler is restarting
        return sum(j["turns"] for j in jobs), all(j["ended_at"] for j in jobs)

    start, deadline = made()[0], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now, ended = made()
        if ended or (start >= 0 and now >= start + turns):
            return
        if start < 0 or now < start:  # unknown yet, or counted again after a restart
            start = now
        time.sleep(0.05)


def wait_events(fleet, job_id, kind, limit_s=60.0) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for env in fleet.events(job_id)["events"]:
            if env["event"]["type"] == kind:
                return env["event"]
        fleet.events(job_id, wait_s=0.05)
    raise AssertionError(f"no {kind} event for {job_id}")


def test_scheduler_killed_mid_batch_every_job_is_kept_and_completes(
    fleet, scheduler_call, tmp_path
):
    steps = [{"tool": "progress_update", "args": {"summary": f"step {i}"}} for i in range(3)]
    batch = submit(fleet, 6, script={"default": steps}, latency_ms=400, tmp=tmp_path)
    wait_events(fleet, batch.job_ids[0], "progress")
    before = health(scheduler_call)
    os.kill(before["pid"], signal.SIGKILL)
    after = health(scheduler_call)
    assert after["pid"] != before["pid"]
    assert after["restored"]["resumed"] + after["restored"]["finished"] >= 6
    out = block(fleet, [batch.batch_id])
    assert sorted(s["job_id"] for s in out["jobs"]) == sorted(batch.job_ids)
    results = [fleet.job_result(j) for j in batch.job_ids]
    assert {r["status"] for r in results} == {"completed"}, results
    ends = ends_in_journal(scheduler_call, batch.job_ids)
    assert all(ends.get(j) == 1 for j in batch.job_ids), ends


def test_host_killed_mid_turn_its_clones_resume_elsewhere_from_the_checkpoint(
    fleet, scheduler_call, tmp_path
):
    script = {
        "default": [
            {"tool": "progress_update", "args": {"summary": "first"}},
            {"tool": "progress_update", "args": {"summary": "second"}, "latency_ms": 1500},
        ]
    }
    batch = submit(fleet, 2, script=script, per=2, tmp=tmp_path)
    victim = batch.job_ids[0]
    wait_events(fleet, victim, "progress")
    assert scheduler_call("kill_host_of", victim)
    restarted = wait_events(fleet, victim, "restarted")
    assert restarted["attempt"] == 1 and restarted["resumed_turn"] >= 1
    block(fleet, [batch.batch_id])
    for job_id in batch.job_ids:
        record = fleet.job_result(job_id)
        assert record["status"] == "completed", record
        assert record["turns"] == 3, "resumed at turn 2, not started over"
        assert fleet.job_status(job_id)["restarts"] == 1
    ends = ends_in_journal(scheduler_call, batch.job_ids)
    assert all(ends.get(j) == 1 for j in batch.job_ids)


def test_idle_warm_hosts_killed_the_next_batch_succeeds_with_no_ghosts(
    fleet, scheduler_call, tmp_path
):
    warm = submit(fleet, 2, tmp=tmp_path)  # hosts go back to the warm pool afterwards
    block(fleet, [warm.batch_id])
    replaced = health(scheduler_call)["warm_hosts_replaced"]
    killed = scheduler_call("kill_idle_hosts")
    assert killed >= 1
    deadline = time.monotonic() + 30
    while health(scheduler_call)["warm_hosts_replaced"] < replaced + killed:
        assert time.monotonic() < deadline, "dead warm hosts were not replaced"
        time.sleep(0.05)
    batch = submit(fleet, 10, tmp=tmp_path)
    block(fleet, [batch.batch_id])
    statuses = {fleet.job_status(j)["status"] for j in batch.job_ids}
    assert statuses == {"completed"}
    assert {fleet.job_status(j)["restarts"] for j in batch.job_ids} == {0}


def test_a_batch_sent_right_after_warm_hosts_die_runs_with_no_job_failed(
    fleet, scheduler_call, tmp_path
):
    warm = submit(fleet, 2, tmp=tmp_path)
    block(fleet, [warm.batch_id])
    assert scheduler_call("kill_idle_hosts") >= 1
    batch = submit(fleet, 10, tmp=tmp_path)  # at once: the pool may not know yet
    out = block(fleet, [batch.batch_id])
    assert {s["status"] for s in out["jobs"]} == {"completed"}, out
    ends = ends_in_journal(scheduler_call, batch.job_ids)
    assert all(ends.get(j) == 1 for j in batch.job_ids)


@pytest.mark.timeout(240)
def test_chaos_200_jobs_while_hosts_and_the_scheduler_are_killed(fleet, scheduler_call, tmp_path):
    """At most 10 kills (random hosts, and the scheduler twice) while 200 jobs run: every job
    ends exactly once, completed, and every result is readable."""
    rng = random.Random(20261130)
    steps = [{"tool": "progress_update", "args": {"summary": f"s{i}"}} for i in range(3)]
    batch = submit(
        fleet, 200, script={"default": steps}, latency_ms=150, per=25, restarts=5, tmp=tmp_path
    )
    kills = ["scheduler" if i in (3, 7) else "host" for i in range(10)]
    started = time.monotonic()
    for kind in kills:
        # Each kill lands once the batch has made some progress: a random number of turns more.
        progress_by(fleet, batch.batch_id, rng.randint(10, 60))
        if kind == "scheduler":
            os.kill(health(scheduler_call)["pid"], signal.SIGKILL)
            continue
        try:
            running = fleet.list_jobs(status="running", batch=batch.batch_id)["jobs"]
        except Exception:
            continue  # the scheduler is restarting
        if running:
            victim = rng.choice(running)["job_id"]
            scheduler_call("kill_host_of", victim)
    out = block(fleet, [batch.batch_id], limit_s=170 - (time.monotonic() - started))
    assert len(out["jobs"]) == 200
    assert {s["status"] for s in out["jobs"]} == {"completed"}, [
        (s["job_id"], s["status"], s["error"]) for s in out["jobs"] if s["status"] != "completed"
    ]
    assert all(fleet.job_result(j)["status"] == "completed" for j in batch.job_ids)
    ends = ends_in_journal(scheduler_call, batch.job_ids)
    assert all(ends.get(j) == 1 for j in batch.job_ids), {j: ends.get(j) for j in batch.job_ids}
