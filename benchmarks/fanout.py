"""Fan-out of counted batches, against a hand-written asyncio loop doing the same requests.

The simulated provider is served over HTTP from its own process (127.0.0.1, ``--latency-ms`` per
request; default behaviour: two model turns per clone, ``progress_update`` then ``exit_tool``).
For each batch size N:

1. clonefleet: embedded Ray through ``Fleet`` (its start is timed apart), then
   ``spawn("general-purpose", ..., count=N)`` on an ``openai`` provider pointing at the server.
   Makespan runs from the spawn call until ``job_block`` sees every job terminal. Also measured:
   the clone start rate (clones whose ``started`` event was emitted, per second since the spawn
   call), p50/p99 from the spawn call to each clone's first model request (the server records
   when each ``"<batch>/<clone>"`` first asked), the memory Ray's processes and this driver add
   during the run (peak during the run minus idle Ray just before the spawn, read from
   ``/proc``: RSS and PSS), the CPU each process kind used, and the clones per actor (hosts
   named in the job table, else host processes seen in ``/proc``).
2. baseline: one process, one ``aiohttp`` session, N agents all at once, each sending the two
   chat-completion requests a clone sends (the body of a clone's first request is captured by
   the server and reused, only ``user`` changes; the second request appends the answer and a
   tool result, as a hand-written loop would). The session's pool holds ``--baseline-limit``
   connections (default 1000, the pool one clonefleet host process has).

Once at the end: ``clonefleet run general-purpose --count 1000`` cold in a subprocess (in-process
simulated provider, Ray start included). Every wait is bounded in count and time; processes this
script started are stopped before it exits.

    python benchmarks/fanout.py [--sizes 10,100,1000,10000] [--latency-ms 200] [--seed 0]
                                [--clones-per-actor K] [--baseline-limit 1000]
                                [--cold-count 1000] [--no-cold]

Prints one table and writes ``benchmarks/results/fanout.json``. Targets (issue 6): N=1000 within
1.5x the loop; N=10000 within 2x with under 3 GB added; cold ``run --count 1000`` under 20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from _fanout_baselines import run_baseline
from _fanout_procs import ProcWatch, Sample, loadavg, reap_session
from _fanout_report import TARGETS, mb, percentile, rounded, table, tally, verdicts
from _fanout_server import Server

RESULTS = Path(__file__).parent / "results" / "fanout.json"
PROMPT = "Summarise file_{{ clone.index }}.py"


# -- clonefleet -------------------------------------------------------------------------
@dataclass
class _Run:
    """One batch as the Fleet API saw it, with the /proc samples around it."""

    batch_id: str
    t0: float
    """Wall-clock time of the spawn call."""
    block: dict[str, Any]
    """``job_block``'s answer: every job of the batch."""
    idle: Sample
    """Ray started and idle, just before the spawn."""
    cpu_idle: dict[int, tuple[str, float]]
    peak: Sample


def _spawn_and_block(
    n: int, server: Server, watch: ProcWatch, args: argparse.Namespace, row: dict[str, Any]
) -> _Run:
    """Start a Fleet, spawn the batch and wait for it; timings and events go into ``row``."""
    from clonefleet import Fleet
    from clonefleet.config import Config, ModelConfig, ProviderConfig

    config = Config(
        providers={"srv": ProviderConfig(kind="openai", base_url=server.base_url)},
        models={"m": ModelConfig(provider="srv", name="sim")},
        model_groups={"default": ("m",)},
        durability={"enabled": args.journal == "on"},
    )
    with tempfile.TemporaryDirectory(prefix="fanout-") as cwd:
        started = time.perf_counter()
        fleet = Fleet(config=config, cwd=cwd)
        try:
            fleet.wait_ready()  # Ray and the warm clone hosts are start-up, reported apart
            row["ray_start_s"] = round(time.perf_counter() - started, 2)
            idle = watch.sample()
            cpu_idle = dict(watch.cpu)
            watch.start()
            t0, p0 = time.time(), time.perf_counter()
            batch = fleet.spawn(
                "general-purpose", PROMPT, count=n, clones_per_actor=args.clones_per_actor
            )
            row["spawn_call_s"] = round(time.perf_counter() - p0, 3)
            block = fleet.job_block([batch.batch_id], timeout_seconds=args.time_limit_s)
            row["makespan_s"] = round(time.perf_counter() - p0, 3)
            peak = watch.stop()
            row.update(_events(fleet, batch.batch_id, n, t0))
        finally:
            fleet.close()
    return _Run(batch.batch_id, t0, block, idle, cpu_idle, peak)


def _figures(
    n: int,
    run: _Run,
    before: Sample,
    stats: dict[str, Any],
    watch: ProcWatch,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The jobs' outcomes, the hosts used, first-request latencies, memory and CPU."""
    firsts = [(ts - run.t0) * 1000 for ts in stats["first_request_at"].values()]
    jobs = run.block["jobs"]
    # The job table names each job's host; host processes seen in /proc are the fallback.
    hosts = len({j["host"] for j in jobs if j.get("host")}) or len(watch.hosts_seen)
    idle, peak = run.idle, run.peak
    return {
        "done": run.block["done"],
        "completed_success": sum(
            1 for j in jobs if j["status"] == "completed" and j["outcome"] == "success"
        ),
        "statuses": tally(f"{j['status']}/{j['outcome']}" for j in jobs),
        "clones_per_actor": args.clones_per_actor or "auto",
        "host_processes": hosts,
        "host_processes_seen": len(watch.hosts_seen),
        "nodes_used": len({j["node"] for j in jobs if j.get("node")}) or None,
        "clones_per_host": math.ceil(n / hosts) if hosts else None,
        "clones_first_requested": len(firsts),
        "first_request_p50_ms": rounded(percentile(firsts, 0.50)),
        "first_request_p99_ms": rounded(percentile(firsts, 0.99)),
        "first_request_last_ms": rounded(max(firsts, default=None)),
        "mem_before_ray_mb": mb(before.rss),
        "mem_idle_ray_mb": mb(idle.rss),
        "mem_peak_mb": mb(peak.rss),
        "added_rss_mb": mb(peak.rss - idle.rss),
        "added_pss_mb": mb(peak.pss - idle.pss),
        "peak_rss_by_kind_mb": {k: mb(v) for k, v in sorted(peak.by_kind.items())},
        "peak_processes": peak.procs,
        "cpu_s_by_kind": watch.cpu_by_kind(run.cpu_idle),
    }


def run_clonefleet(
    n: int, server: Server, watch: ProcWatch, args: argparse.Namespace
) -> dict[str, Any]:
    row: dict[str, Any] = {"n": n, "load_before": loadavg()}
    before = watch.sample()
    server_cpu0 = server.stats()["cpu_s"]
    run = _spawn_and_block(n, server, watch, args, row)
    row["leftover_processes"] = len(watch.reap())
    stats = server.stats(prefix=f"{run.batch_id}/")
    row.update(_figures(n, run, before, stats, watch, args))
    row["server_cpu_s"] = round(stats["cpu_s"] - server_cpu0, 2)
    row["load_after"] = loadavg()
    row["template"] = stats["sample"]
    return row


def _events(fleet: Any, batch_id: str, n: int, t0: float) -> dict[str, Any]:
    """Start and end times from the batch's lifecycle events (pages of at most 5000)."""
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    cursor = 0
    for _ in range(n * 8 // 1000 + 20):
        page = fleet.events(batch_id, cursor=cursor, level="lifecycle")
        if not page["events"]:
            break
        cursor = page["cursor"]
        for env in page["events"]:
            event = env["event"]
            if event["type"] == "started":
                started.setdefault(env["subagent_run_id"], event["ts"])
            elif event["type"] == "result":
                ended.setdefault(env["subagent_run_id"], event["ts"])
    starts = sorted(ts - t0 for ts in started.values())
    last_start = starts[-1] if starts else None
    return {
        "started": len(starts),
        "first_start_s": rounded(starts[0] if starts else None, 3),
        "last_start_s": rounded(last_start, 3),
        "start_rate_per_s": rounded(len(starts) / last_start if last_start else None, 1),
        "last_result_s": rounded(max(ended.values()) - t0 if ended else None, 3),
    }


# -- cold `clonefleet run` -----------------------------------------------------------------
def run_cold(count: int, time_limit_s: float) -> dict[str, Any]:
    """``clonefleet run general-purpose --count COUNT --json`` in a fresh process and directory."""
    exe = Path(sys.executable).with_name("clonefleet")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "clonefleet"]
    cmd += ["run", "general-purpose", "--prompt", PROMPT, "--count", str(count), "--json"]
    with tempfile.TemporaryDirectory(prefix="fanout-cold-") as cwd:
        env = {k: v for k, v in os.environ.items() if k not in ("CLONEFLEET_CONFIG", "RAY_ADDRESS")}
        env["XDG_CONFIG_HOME"] = str(Path(cwd) / "xdg")
        p0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=time_limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            timed_out = True
        wall = time.perf_counter() - p0
        leftovers = reap_session(proc.pid)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    ok = sum(1 for r in records if r["status"] == "completed" and r["outcome"] == "success")
    return {
        "count": count,
        "wall_s": round(wall, 2),
        "exit_status": proc.returncode,
        "records": len(records),
        "completed_success": ok,
        "timed_out": timed_out,
        "leftover_processes": leftovers,
        "stderr_tail": err[-500:] if proc.returncode else "",
    }


# -- the run -------------------------------------------------------------------------------
def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _git_commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when it has changes (``None`` outside git)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000", help="comma-separated batch sizes")
    parser.add_argument(
        "--latency-ms", type=float, default=200.0, help="simulated server latency per request"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated server")
    parser.add_argument(
        "--clones-per-actor", type=int, default=None, help="override clonefleet's automatic choice"
    )
    parser.add_argument(
        "--baseline-limit",
        type=int,
        default=1000,
        help="connections the baseline's session opens at most (0 = one per agent); default: the "
        "per-process pool of clonefleet's providers (max_connections), since 10,000 connections at "
        "once make the loop slower, not faster",
    )
    parser.add_argument(
        "--time-limit-s", type=float, default=600.0, help="longest wait for one batch"
    )
    parser.add_argument(
        "--journal",
        choices=("on", "off"),
        default="on",
        help="keep the scheduler's journal (on, as users run it) or not (off: its overhead)",
    )
    parser.add_argument("--cold-count", type=int, default=1000)
    parser.add_argument("--no-cold", action="store_true", help="skip the cold `clonefleet run`")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


def _measure_size(
    n: int, server: Server, watch: ProcWatch, args: argparse.Namespace
) -> dict[str, Any]:
    """One batch size: clonefleet, then the baseline replaying the first request clonefleet sent."""
    row = run_clonefleet(n, server, watch, args)
    template = json.loads(row.pop("template"))
    template.pop("user", None)
    row.update(asyncio.run(run_baseline(n, server, template, args)))
    row["ratio"] = round(row["makespan_s"] / row["baseline_s"], 2) if row["baseline_s"] else None
    row["cpa"] = (
        f"{row['clones_per_actor']}:{row['clones_per_host'] or '?'}x{row['host_processes']}"
    )
    row["ok"] = f"{row['completed_success']}/{n}"
    print(
        f"fanout: N={n} done: {json.dumps({k: row[k] for k in ('makespan_s', 'baseline_s', 'ratio', 'added_rss_mb')})}",
        flush=True,
    )  # noqa: T201
    return row


def _measure(
    sizes: list[int], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every batch size, then the cold run; the server is stopped whatever happens."""
    server = Server(args.latency_ms, args.seed)
    watch = ProcWatch(exclude={server.proc.pid})
    cold = None
    try:
        rows = [_measure_size(n, server, watch, args) for n in sizes]
        if not args.no_cold:
            cold = run_cold(args.cold_count, args.time_limit_s)
    finally:
        server.stop()
    return rows, cold


def _params(sizes: list[int], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "sizes": sizes,
        "latency_ms": args.latency_ms,
        "turns_per_clone": 2,
        "seed": args.seed,
        "clones_per_actor": args.clones_per_actor or "auto",
        "journal": args.journal,
        "baseline_connection_limit": args.baseline_limit or "none",
        "agent": "general-purpose",
        "provider": "openai -> simulated server over HTTP (own process)",
        "cpus": os.cpu_count(),
        "commit": _git_commit(),
        "python": platform.python_version(),
        "versions": {
            p: metadata.version(p)
            for p in ("ray", "aiohttp", "httpx", "httpx-aiohttp", "clonefleet")
        },
    }


def _report(
    params: dict[str, Any], rows: list[dict[str, Any]], cold: dict[str, Any] | None, out: Path
) -> None:
    print(f"fanout: {json.dumps(params)}")  # noqa: T201 - a benchmark script prints its table
    print(table(rows))  # noqa: T201
    print("clones/actor = setting:clones per host x hosts")  # noqa: T201
    if cold is not None:
        print(
            f"cold `clonefleet run general-purpose --count {cold['count']}`: {cold['wall_s']} s, exit {cold['exit_status']}, {cold['completed_success']}/{cold['count']} ok"
        )  # noqa: T201
    for line in verdicts(rows, cold):
        print(line)  # noqa: T201
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"params": params, "results": rows, "cold_run": cold, "targets": TARGETS}, indent=2
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {out}")  # noqa: T201


def main() -> int:
    args = _parser().parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated run still stops Ray and the server
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    rows, cold = _measure(sizes, args)
    _report(_params(sizes, args), rows, cold, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
