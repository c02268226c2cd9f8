"""Faults 4-6 of ``benchmarks/faults.py``, through the ``clonefleet`` command against a
``clonefleet cluster up`` cluster (each in a state folder of its own): ``cluster down`` with
clones running, a frozen scheduler (SIGSTOP), and ``--address auto`` with no cluster."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _faults_common import Cli, Deadline, Ran, ends_per_job, log, rounded, tally

__all__ = ["cluster_down", "frozen_scheduler", "no_cluster"]

QUICK = 10
"""Clones of the ``cluster down`` batch that finish before the cluster goes down."""
SLOW_STEPS, SLOW_MS = 30, 500
"""The other clones: this many progress turns of this many ms each (about 15 s)."""

_PID = """
import json
from clonefleet import Fleet
fleet = Fleet(address="auto", ship_package=False)
print(json.dumps(fleet._ask(lambda s: s.health.remote())["pid"]))
fleet.close()
"""


def _script(cli: Cli, quick: int) -> str:
    slow = [{"tool": "progress_update", "args": {"summary": "s"}, "latency_ms": SLOW_MS}]
    fast = [{"tool": "progress_update", "args": {"summary": "q"}, "latency_ms": 50}]
    body = {"default": slow * SLOW_STEPS, "clones": {str(i): fast for i in range(quick)}}
    (cli.work / "faults.yaml").write_text(json.dumps(body))
    return "faults.yaml"


def _detach(cli: Cli, count: int, quick: int, d: Deadline) -> dict[str, Any]:
    """``run --detach`` a batch of ``count`` clones (the first ``quick`` of them quick)."""
    script = _script(cli, quick)
    ran = cli(
        "run",
        *("general-purpose", "--prompt", "keep", "--count", str(count), "--detach"),
        *("--address", "auto", "--json", "--sim-script", script),
        timeout=d.cap(120),
    )
    if ran.rc != 0:
        raise RuntimeError(f"run --detach failed ({ran.rc}): {ran.err[-400:]}")
    return json.loads(ran.out)


def _up(cli: Cli, d: Deadline) -> Ran:
    ran = cli("cluster", "up", "--json", timeout=d.cap(200))
    if ran.rc != 0:
        raise RuntimeError(f"cluster up failed ({ran.rc}): {ran.err[-400:]}")
    return ran


def _listing(cli: Cli, batch_id: str, d: Deadline) -> tuple[Ran, list[dict[str, Any]]]:
    ran = cli("jobs", "list", "--batch", batch_id, "--json", timeout=d.cap(90))
    jobs = json.loads(ran.out)["jobs"] if ran.rc == 0 and ran.out.strip() else []
    return ran, jobs


def _makespan(jobs: list[dict[str, Any]]) -> float | None:
    """From the first job's ``created_at`` (the scheduler accepted the batch; the CLI's own
    start is left out) to the last one's ``ended_at``."""
    ended = [j["ended_at"] for j in jobs if j.get("ended_at")]
    return rounded(max(ended) - min(j["created_at"] for j in jobs)) if ended else None


def _resumed_turns(cli: Cli, batch_id: str, d: Deadline) -> dict[str, int]:
    """How many jobs resumed from each turn: the ``restarted`` events of the batch."""
    ran = cli("events", batch_id, "--json", timeout=d.cap(90))
    events = [line["event"] for line in ran.json_lines()]
    return tally(f"turn {e.get('resumed_turn')}" for e in events if e["type"] == "restarted")


def _baseline(cli: Cli, count: int, d: Deadline) -> float | None:
    """The same batch on the same cluster without a fault: its makespan."""
    batch = _detach(cli, count, QUICK, d)
    cli("jobs", "wait", batch["batch_id"], "--timeout", str(int(d.cap(120))), timeout=d.cap(150))
    mk = _makespan(_listing(cli, batch["batch_id"], d)[1])
    log(f"  no fault: makespan {mk} s")
    return mk


def _offline(cli: Cli, batch: dict[str, Any], before: list[dict], d: Deadline) -> dict[str, Any]:
    """With no cluster: the listing from the journal and the finished jobs' results."""
    listed, jobs = _listing(cli, batch["batch_id"], d)
    quick = batch["job_ids"][:QUICK]
    again = cli("jobs", "result", *quick, "--json", timeout=d.cap(90))
    pending = cli("jobs", "result", batch["job_ids"][-1], timeout=d.cap(90))
    return {
        "list_s": listed.wall_s,
        "list_rc": listed.rc,
        "list_says_journal": "read from the journal" in listed.err,
        "statuses": tally(j["status"] for j in jobs),
        "result_s": again.wall_s,
        "results_same_as_before": again.rc == 0 and again.json_lines() == before,
        "unfinished_result_rc": pending.rc,
        "unfinished_result_names_up": "cluster up" in pending.err,
    }


def _after_up(
    cli: Cli, batch: dict[str, Any], t_down: float, d: Deadline
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``cluster up`` again; the first command after it (it creates the scheduler, which
    replays the journal and resumes the unfinished jobs); then the wait for the batch."""
    up = _up(cli, d)
    t_up = time.time()
    first = _listing(cli, batch["batch_id"], d)[0]
    wait = ("jobs", "wait", batch["batch_id"], "--timeout", str(int(d.cap(150))))
    waited = cli(*wait, timeout=d.cap(180))
    jobs = _listing(cli, batch["batch_id"], d)[1]
    ended = max((j["ended_at"] for j in jobs if j.get("ended_at")), default=None)
    return jobs, {
        "up_again_s": up.wall_s,
        "first_command_after_up_s": first.wall_s,
        "wait_rc": waited.rc,
        "resumed_from": _resumed_turns(cli, batch["batch_id"], d),
        "done_after_up_s": rounded(ended - t_up) if ended else None,
        "down_to_done_s": rounded(ended - t_down) if ended else None,
    }


def cluster_down(tmp: Path, d: Deadline, running: int = 50) -> dict[str, Any]:
    """Fault 4: ``cluster down`` with ``running`` clones running, offline reads, ``cluster up``."""
    cli = Cli(tmp)
    count = QUICK + running
    row: dict[str, Any] = {"expected_jobs": count, "expected_running": running}
    try:
        row["cluster_up_s"] = _up(cli, d).wall_s
        base = _baseline(cli, count, d)
        batch = _detach(cli, count, QUICK, d)
        quick = batch["job_ids"][:QUICK]
        cli("jobs", "wait", *quick, "--timeout", str(int(d.cap(60))), timeout=d.cap(90))
        before = cli("jobs", "result", *quick, "--json", timeout=d.cap(90)).json_lines()
        t_down = time.time()
        down = cli("cluster", "down", "--json", timeout=d.cap(90))
        row["down"] = {"wall_s": down.wall_s, "rc": down.rc, "says": down.json_lines()}
        row["offline"] = _offline(cli, batch, before, d)
        jobs, after = _after_up(cli, batch, t_down, d)
        row.update(
            jobs=len(jobs),
            done=all(j["ended_at"] for j in jobs) and len(jobs) == count,
            statuses=tally(f"{j['status']}/{j['outcome']}" for j in jobs),
            restarted_jobs=sum(1 for j in jobs if j.get("restarts")),
            makespan_s=_makespan(jobs),
            baseline_makespan_s=base,
        )
        row["recovery"] = {
            "down_s": down.wall_s,
            "offline_list_s": row["offline"]["list_s"],
            **after,
        }
    finally:
        cli("cluster", "down", timeout=90)
    ends = ends_per_job(cli.state / "journal")
    row["ends_once"] = bool(row.get("jobs")) and all(ends.get(j) == 1 for j in batch["job_ids"])
    mk, base = row.get("makespan_s"), row.get("baseline_makespan_s")
    row["cost_s"] = rounded(mk - base) if mk is not None and base is not None else None
    return row


def _scheduler_pid(cli: Cli, d: Deadline) -> int:
    """The scheduler's pid from its ``health()``, checked against its process title."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _PID],
        cwd=cli.work,
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=d.cap(90),
        check=True,
    )
    pid = int(out.stdout.strip().splitlines()[-1])
    title = Path(f"/proc/{pid}/cmdline").read_bytes()
    if not title.startswith(b"ray::SchedulerActor"):
        raise RuntimeError(f"pid {pid} is not the scheduler: {title[:60]!r}")
    return pid


def frozen_scheduler(tmp: Path, d: Deadline, timeout_s: int = 5) -> dict[str, Any]:
    """Fault 5: ``jobs wait BATCH --timeout 5`` answered, then with the scheduler SIGSTOPped."""
    cli = Cli(tmp)
    row: dict[str, Any] = {"expected_jobs": 10}
    stopped = None
    try:
        row["cluster_up_s"] = _up(cli, d).wall_s
        batch = _detach(cli, 10, 0, d)
        pid = _scheduler_pid(cli, d)
        wait = ("jobs", "wait", batch["batch_id"], "--timeout", str(timeout_s))
        normal = cli(*wait, timeout=d.cap(60))
        os.kill(pid, signal.SIGSTOP)
        stopped = pid
        frozen = cli(*wait, timeout=d.cap(60))
        os.kill(pid, signal.SIGCONT)
        stopped = None
        t_cont = time.time()
        later = cli(
            "jobs", "wait", batch["batch_id"], "--timeout", str(int(d.cap(90))), timeout=d.cap(120)
        )
        jobs = _listing(cli, batch["batch_id"], d)[1]
        ended = max((j["ended_at"] for j in jobs if j.get("ended_at")), default=None)
        row.update(
            jobs=len(jobs),
            done=len(jobs) == 10 and all(j["ended_at"] for j in jobs),
            statuses=tally(f"{j['status']}/{j['outcome']}" for j in jobs),
            restarted_jobs=sum(1 for j in jobs if j.get("restarts")),
            makespan_s=_makespan(jobs),
        )
        row["recovery"] = {
            "wait_answering_s": normal.wall_s,
            "wait_answering_rc": normal.rc,
            "wait_frozen_s": frozen.wall_s,
            "wait_frozen_rc": frozen.rc,
            "frozen_says": (frozen.err.strip().splitlines() or [""])[-1][:200],
            "wait_after_sigcont_rc": later.rc,
            "done_after_sigcont_s": rounded(ended - t_cont) if ended else None,
        }
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        cli("cluster", "down", timeout=90)
    ends = ends_per_job(cli.state / "journal")
    row["ends_once"] = all(ends.get(j) == 1 for j in batch["job_ids"])
    return row


def no_cluster(tmp: Path, d: Deadline) -> dict[str, Any]:
    """Fault 6: ``run --detach --address auto`` with no cluster recorded."""
    cli = Cli(tmp)
    ran = cli(
        *("run", "general-purpose", "--prompt", "x", "--detach", "--address", "auto"),
        timeout=d.cap(120),
    )
    text = (ran.err + ran.out).strip()
    return {
        "jobs": 0,
        "recovery": {
            "fail_s": ran.wall_s,
            "rc": ran.rc,
            "names_cluster_up": "clonefleet cluster up" in text,
            "message": text.splitlines()[-1][:200] if text else "",
        },
    }


def temp_root(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
