"""Fault injection on this machine: each fault once (or ``--repeat R`` times), and how clonefleet
recovered from it.

1. scheduler SIGKILL mid-batch (embedded Fleet, ``--count`` clones of ``--turns`` turns of
   ``--turn-ms``): until ``health()`` answers from a new pid, until every restarted job's clone
   runs again (its resumed ``started`` event), until the batch is done; makespan against the
   same batch without a fault, run just before it.
2. a clone host SIGKILLed mid-turn (``kill_host_of`` one job of a batch with 25 clones per host):
   until the victim's ``restarted`` event, jobs restarted, makespan against no fault.
3. the idle warm hosts killed (``kill_idle_hosts``), then a batch submitted at once: failures,
   makespan against no fault, until the pool reports the replacements.
4. ``clonefleet cluster down`` with 50 clones running on a ``cluster up`` cluster: its wall time,
   the offline ``jobs list --json`` and ``jobs result``, then ``cluster up`` and until the batch
   is done (the unfinished jobs resume).
5. a frozen scheduler (SIGSTOP): ``clonefleet jobs wait BATCH --timeout 5`` with it answering and
   frozen; then SIGCONT and the batch's end.
6. ``clonefleet run ... --detach --address auto`` with no cluster: how fast it fails, and that it
   names ``clonefleet cluster up``.
7. journal overhead: not run here, see ``fanout.py --journal on|off``.

Every command runs with ``CLONEFLEET_STATE_DIR`` in a temporary folder, on 127.0.0.1. Each fault
restores what it changed (SIGCONT, ``cluster down``) whatever happens; every wait is bounded by
``--time-limit-s`` overall. Progress goes to stderr; the table to stdout; JSON to ``--out``.

    python benchmarks/faults.py [--faults 1,2,3,4,5,6,7] [--repeat 1] [--count 50] [--turns 4]
                                [--turn-ms 300] [--checkpoint-s 1.0] [--time-limit-s 900]
                                [--out benchmarks/results/faults.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

from _faults_common import Deadline, log
from _faults_report import NAMES, judge, print_table

RESULTS = Path(__file__).parent / "results" / "faults.json"
FLEET_FAULTS = (1, 2, 3)
MIN_LEFT_S = 30.0
"""A fault is skipped when less than this is left of the overall time limit."""


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--faults", default="1,2,3,4,5,6,7", help="comma-separated fault numbers")
    p.add_argument("--repeat", type=int, default=1, help="times each fault is injected")
    p.add_argument("--count", type=int, default=50, help="clones per batch (faults 1-3)")
    p.add_argument("--turns", type=int, default=4, help="model turns per clone (faults 1-3)")
    p.add_argument("--turn-ms", type=int, default=300, help="latency of each model turn")
    p.add_argument(
        "--checkpoint-s", type=float, default=1.0, help="durability.checkpoint_interval_s"
    )
    p.add_argument("--time-limit-s", type=float, default=900.0, help="for the whole run")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p


def _git_commit() -> str | None:
    """The commit of the clonefleet being measured (``+dirty`` when its checkout has changes;
    a copy made with ``git archive`` may name its commit in a ``SNAPSHOT_COMMIT`` file)."""
    import clonefleet

    root = Path(clonefleet.__file__).resolve().parent
    if (root / "SNAPSHOT_COMMIT").is_file():
        return (root / "SNAPSHOT_COMMIT").read_text().strip() + " (snapshot)"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
        )
    except OSError:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") or None


def _one(n: int, args: argparse.Namespace, d: Deadline, setup: Any, tmp: Path) -> dict[str, Any]:
    """Inject fault ``n`` once; its row (an exception becomes the row's ``error``)."""
    import _faults_cluster as cl
    import _faults_fleet as fl

    row: dict[str, Any] = {"fault": n, "name": NAMES[n]}
    if n == 7:
        row["note"] = "see fanout.py --journal on|off (run separately)"
        judge(row, args.count)
        return row
    if d.left() < MIN_LEFT_S:
        row["error"] = "skipped: overall time limit reached"
        return row
    log(f"fault {n}: {NAMES[n]}")
    started = time.monotonic()
    try:
        runs = {
            1: lambda: fl.scheduler_kill(setup),
            2: lambda: fl.host_kill(setup),
            3: lambda: fl.idle_hosts_kill(setup),
            4: lambda: cl.cluster_down(Path(tempfile.mkdtemp(dir=tmp)), d),
            5: lambda: cl.frozen_scheduler(Path(tempfile.mkdtemp(dir=tmp)), d),
            6: lambda: cl.no_cluster(Path(tempfile.mkdtemp(dir=tmp)), d),
        }
        row.update(runs[n]())
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        log(traceback.format_exc(limit=4))
    row.pop("t_end", None)
    row["fault_wall_s"] = round(time.monotonic() - started, 1)
    judge(row, args.count)
    log(f"fault {n} done in {row['fault_wall_s']} s: {row['verdict']}")
    return row


def _run_all(faults: list[int], args: argparse.Namespace, d: Deadline, tmp: Path) -> list[dict]:
    """Faults 1-3 share one embedded Fleet (closed before the cluster faults start)."""
    rows: list[dict[str, Any]] = []
    fleet_ones = [n for n in faults if n in FLEET_FAULTS]
    if fleet_ones:
        import _faults_fleet as fl

        log("starting an embedded Fleet (Ray and warm hosts)")
        t = time.monotonic()
        try:
            fleet = fl.open_fleet(tmp / "fleet", args.turn_ms, args.checkpoint_s)
        except Exception as exc:
            err = f"the Fleet did not start: {type(exc).__name__}: {exc}"[:500]
            rows += [
                {"fault": n, "name": NAMES[n], "error": err, "verdict": err} for n in fleet_ones
            ]
            fleet_ones = []
    if fleet_ones:
        log(f"Fleet ready in {time.monotonic() - t:.1f} s")
        setup = fl.Setup(fleet, tmp / "fleet", args.count, args.turns, d)
        try:
            for n in fleet_ones:
                rows += [_one(n, args, d, setup, tmp) | {"repeat": r} for r in range(args.repeat)]
        finally:
            fleet.close()
    for n in (n for n in faults if n not in FLEET_FAULTS):
        reps = 1 if n == 7 else args.repeat
        rows += [_one(n, args, d, None, tmp) | {"repeat": r} for r in range(reps)]
    return rows


def _params(faults: list[int], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "faults": faults,
        "repeat": args.repeat,
        "count": args.count,
        "turns": args.turns,
        "turn_ms": args.turn_ms,
        "checkpoint_interval_s": args.checkpoint_s,
        "clones_per_actor_fault_2": 25,
        "cpus": os.cpu_count(),
        "load_before": float(Path("/proc/loadavg").read_text().split()[0]),
        "commit": _git_commit(),
        "clonefleet_path": str(Path(__import__("clonefleet").__file__).parent),
        "python": platform.python_version(),
        "versions": {p: metadata.version(p) for p in ("ray", "clonefleet")},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def main() -> int:
    args = _parser().parse_args()
    faults = sorted({int(f) for f in args.faults.split(",") if f.strip()})
    if not faults or not set(faults) <= set(NAMES):
        raise SystemExit(f"--faults: numbers from {sorted(NAMES)}")
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated run still cleans up
    tmp = Path(tempfile.mkdtemp(prefix="clonefleet-faults-"))
    os.environ.update(
        CLONEFLEET_STATE_DIR=str(tmp / "driver-state"),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        CLONEFLEET_BLOCK_LIVE="1",
    )
    os.environ.pop("RAY_ADDRESS", None)
    params = _params(faults, args)
    d = Deadline(args.time_limit_s)
    try:
        rows = _run_all(faults, args, d, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    params["wall_s"] = round(d.limit_s - d.left(), 1)
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"params": params, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")  # noqa: T201
    return 0 if all(r.get("verdict", "").startswith(("ok", "not run")) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
