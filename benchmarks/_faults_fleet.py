"""Faults 1-3 of ``benchmarks/faults.py``, on one embedded :class:`~clonefleet.Fleet`: the
scheduler's process killed mid-batch, a clone host killed mid-turn, the idle warm hosts killed
just before a batch. Each is measured against the same batch without a fault, run just before
it on the same Fleet. Makespan: from the submit call to the last job's ``ended_at``."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _faults_common import Deadline, ends_per_job, log, rounded, tally

from clonefleet import Fleet
from clonefleet.config import Config
from clonefleet.fleet import Batch, plan_batch

__all__ = ["Setup", "host_kill", "idle_hosts_kill", "open_fleet", "scheduler_kill"]


@dataclass
class Setup:
    fleet: Fleet
    tmp: Path
    count: int
    turns: int
    deadline: Deadline


def open_fleet(tmp: Path, turn_ms: int, checkpoint_s: float) -> Fleet:
    """An embedded Fleet on the simulated provider (``turn_ms`` per model turn), warm."""
    config = Config(
        providers={"sim": {"kind": "simulated", "simulated": {"latency_ms": turn_ms}}},
        limits={"max_restarts": 2},
        durability={"checkpoint_interval_s": checkpoint_s},
    )
    (tmp / "cwd").mkdir(parents=True, exist_ok=True)
    fleet = Fleet(config=config, cwd=tmp / "cwd")
    fleet.wait_ready()
    return fleet


def _submit(s: Setup, per: int | None = None) -> tuple[Batch, float]:
    """Submit ``s.count`` clones of ``s.turns`` model turns each (``turns - 1`` progress updates,
    then the script runs out and the clone completes with text); returns the batch and when."""
    path = s.tmp / f"turns-{s.turns}.yaml"
    steps = [{"tool": "progress_update", "args": {"summary": f"s{i}"}} for i in range(s.turns - 1)]
    path.write_text(json.dumps({"default": steps}))  # JSON is YAML
    plan = plan_batch(
        "general-purpose",
        "durable work",
        s.count,
        config=s.fleet.config,
        caller_cwd=s.fleet.cwd,
        sim_script=str(path),
        clones_per_actor=per,
    )
    t0 = time.time()
    return s.fleet.submit(plan), t0


def _retry(call: Any, limit_s: float) -> Any:
    """``call()`` again while it fails (the scheduler restarting), until ``limit_s``."""
    deadline = time.monotonic() + limit_s
    for _ in range(10_000):
        try:
            return call()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    raise TimeoutError("no answer")


def _health(s: Setup, limit_s: float = 60.0) -> dict[str, Any]:
    return _retry(lambda: s.fleet._ask(lambda a: a.health.remote(), timeout_s=10), limit_s)


def _block(s: Setup, batch_id: str, limit_s: float) -> dict[str, Any]:
    """Wait for the batch to end (retrying while the scheduler restarts), within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    out: dict[str, Any] = {"done": False, "jobs": []}
    while time.monotonic() < deadline:
        left = max(deadline - time.monotonic(), 0.1)
        try:
            out = s.fleet.job_block([batch_id], timeout_seconds=min(10.0, left))
        except Exception:
            time.sleep(0.05)
            continue
        if out["done"]:
            break
    return out


def _finish(s: Setup, batch: Batch, t0: float) -> dict[str, Any]:
    """Wait for the batch; its statuses, restarts, makespan, and end records in the journal."""
    out = _block(s, batch.batch_id, s.deadline.cap(180))
    jobs = out["jobs"]
    ends: dict[str, int] = {}
    for _ in range(100):  # the journal writes ends in groups: wait for every job's (10 s)
        ends = ends_per_job(_health(s)["journal_dir"])
        if all(j in ends for j in batch.job_ids):
            break
        time.sleep(0.1)
    ended = [j["ended_at"] for j in jobs if j.get("ended_at")]
    return {
        "done": out["done"],
        "expected_jobs": len(batch.job_ids),
        "jobs": len(jobs),
        "statuses": tally(f"{j['status']}/{j['outcome']}" for j in jobs),
        "ends_once": all(ends.get(j) == 1 for j in batch.job_ids),
        "ends_missing_or_repeated": sum(1 for j in batch.job_ids if ends.get(j) != 1),
        "restarted_jobs": sum(1 for j in jobs if j.get("restarts")),
        "makespan_s": rounded(max(ended) - t0 if ended else None),
        "t_end": max(ended, default=None),
    }


def _baseline(s: Setup, per: int | None = None) -> float | None:
    batch, t0 = _submit(s, per)
    res = _finish(s, batch, t0)
    log(f"  no fault: makespan {res['makespan_s']} s, {res['statuses']}")
    return res["makespan_s"]


def _events(s: Setup, target: str) -> list[dict[str, Any]]:
    """Every lifecycle event of ``target`` logged so far (at most 20 pages)."""
    events, cursor = [], 0
    for _ in range(20):
        page = _retry(lambda c=cursor: s.fleet.events(target, cursor=c, level="lifecycle"), 30)
        if not page["events"]:
            break
        events += page["events"]
        cursor = page["cursor"]
    return events


def _wait_event(s: Setup, target: str, kind: str, limit_s: float) -> dict[str, Any] | None:
    """The first ``kind`` event of ``target``, waiting up to ``limit_s`` for one."""
    deadline, cursor = time.monotonic() + limit_s, 0
    for _ in range(int(limit_s / 0.05) + 1):
        page = _retry(lambda c=cursor: s.fleet.events(target, cursor=c, wait_s=0.2), 30)
        cursor = page["cursor"]
        for env in page["events"]:
            if env["event"]["type"] == kind:
                return env["event"]
        if time.monotonic() > deadline:
            break
    return None


def _running_again(s: Setup, batch_id: str, t_kill: float) -> dict[str, Any]:
    """Jobs restarted after ``t_kill``, and when the last of them was running again (its
    clone's first ``started`` event after its ``restarted`` one; a clone with no checkpoint yet
    starts over, without ``resumed``), in seconds after the kill."""
    restarted: dict[str, float] = {}
    started: dict[str, float] = {}
    for env in _events(s, batch_id):
        job, ev = env["subagent_run_id"], env["event"]
        if ev["type"] == "restarted" and ev["ts"] >= t_kill:
            restarted.setdefault(job, ev["ts"])
        elif ev["type"] == "started" and job in restarted and ev["ts"] >= restarted[job]:
            started.setdefault(job, ev["ts"])
    last = max(started.values(), default=None)
    return {
        "restarted_events": len(restarted),
        "started_again": len(started),
        "all_running_again_s": rounded(last - t_kill)
        if last and len(started) == len(restarted)
        else None,
    }


def _cost(row: dict[str, Any], base: float | None) -> None:
    row["baseline_makespan_s"] = base
    mk = row.get("makespan_s")
    row["cost_s"] = rounded(mk - base) if mk is not None and base is not None else None


def scheduler_kill(s: Setup) -> dict[str, Any]:
    """Fault 1: SIGKILL the scheduler's process once the batch's first progress event is in."""
    base = _baseline(s)
    batch, t0 = _submit(s)
    _wait_event(s, batch.batch_id, "progress", s.deadline.cap(60))
    old = _health(s)["pid"]
    t_kill = time.time()
    os.kill(old, signal.SIGKILL)
    log(f"  killed scheduler pid {old} at +{t_kill - t0:.2f} s into the batch")
    after: dict[str, Any] = {"pid": old}
    for _ in range(2000):  # until a new process answers (bounded by the deadline too)
        after = _health(s, s.deadline.cap(120))
        if after["pid"] != old or time.time() - t_kill > s.deadline.cap(120):
            break
        time.sleep(0.02)
    back = time.time() - t_kill
    row = _finish(s, batch, t0)
    row["recovery"] = {
        "killed_at_s": rounded(t_kill - t0),
        "scheduler_back_s": rounded(back) if after["pid"] != old else None,
        "restored": after.get("restored"),
        **_running_again(s, batch.batch_id, t_kill),
        "batch_done_after_kill_s": rounded(row["t_end"] - t_kill) if row["t_end"] else None,
    }
    _cost(row, base)
    return row


def host_kill(s: Setup, per: int = 25) -> dict[str, Any]:
    """Fault 2: ``kill_host_of`` one job once it reported progress (it is then mid-turn)."""
    base = _baseline(s, per)
    batch, t0 = _submit(s, per)
    victim = batch.job_ids[0]
    _wait_event(s, victim, "progress", s.deadline.cap(60))
    t_kill = time.time()
    killed = s.fleet._ask(lambda a: a.kill_host_of.remote(victim))
    log(f"  killed the host of {victim} ({killed}) at +{t_kill - t0:.2f} s into the batch")
    restarted = _wait_event(s, victim, "restarted", s.deadline.cap(60)) or {}
    row = _finish(s, batch, t0)
    row["recovery"] = {
        "killed_at_s": rounded(t_kill - t0),
        "host_killed": killed,
        "victim_restarted_s": rounded(restarted["ts"] - t_kill, 3) if restarted else None,
        "victim_resumed_turn": restarted.get("resumed_turn"),
        **_running_again(s, batch.batch_id, t_kill),
        "batch_done_after_kill_s": rounded(row["t_end"] - t_kill) if row["t_end"] else None,
    }
    _cost(row, base)
    return row


def idle_hosts_kill(s: Setup) -> dict[str, Any]:
    """Fault 3: kill every idle warm host, then submit a batch at once."""
    base = _baseline(s)  # its hosts went back to the warm pool
    replaced0 = _health(s)["warm_hosts_replaced"]
    t_kill = time.monotonic()
    killed = s.fleet._ask(lambda a: a.kill_idle_hosts.remote())
    batch, t0 = _submit(s)
    log(f"  killed {killed} idle warm host(s), batch submitted")
    replaced_s = None
    for _ in range(600):  # the pool's replacements, within 30 s
        if _health(s)["warm_hosts_replaced"] >= replaced0 + killed:
            replaced_s = rounded(time.monotonic() - t_kill)
            break
        if time.monotonic() - t_kill > s.deadline.cap(30):
            break
        time.sleep(0.05)
    row = _finish(s, batch, t0)
    row["recovery"] = {"hosts_killed": killed, "pool_replaced_s": replaced_s}
    _cost(row, base)
    return row
