"""Capacity of the scheduler core on one CPU core: jobs and events it folds per second, bytes per job.

The pure :class:`~clonefleet.scheduler.SchedulerCore` runs in this process, pinned to one core
(``os.sched_setaffinity``), with the garbage-collector thresholds of the scheduler actor, on
instant in-process hosts (``clonefleet.testing.InstantHost``): a start is accepted at once and each clone's
events are ready for the next drain: ``started``, then per turn ``assistant``,
``tool_call_start``, ``tool_call_end`` and ``usage``, then its final result. So what is timed is
the scheduler alone: submission (rows, queues, ``queued`` events), placement on hosts, the pump,
folding every event into its job and the event log (with its envelopes), the usage accounts,
and each job's end (its ``result`` event and run record). No model, no Ray, no network.

For each batch size, with the journal off and then on (a fresh folder in a temp dir, group
commit in its background thread as in the actor): jobs/s from the submit call until every job
is terminal, events/s folded in that time (the hosts' events plus the two the scheduler writes
per job), and the same per second of this process's CPU time (which other work on a shared
machine does not inflate; the journal's writer thread counts in it). With the journal off,
also the size and time of the replies a client reads about the whole batch. Then memory, with ``tracemalloc`` (a separate pass, as it slows everything): bytes the
scheduler holds per job once the batch is submitted, once it has ended (rows kept; the event log
holds at most ``durability.max_events`` events) and once the finished batch was evicted.

    python benchmarks/scheduler_capacity.py [--sizes 1000,10000,100000] [--turns 2]
                                            [--clones-per-host 500] [--memory-size 100000]

Prints a table and writes ``benchmarks/results/scheduler_capacity.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import pickle
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from clonefleet.config import Config
from clonefleet.journal import Journal
from clonefleet.scheduler import Durable, SchedulerCore, evict_expired
from clonefleet.testing import PER_TURN, InstantHost, make_submission

RESULTS = Path(__file__).parent / "results" / "scheduler_capacity.json"
SCHEDULER_EVENTS = 2
"""Events the scheduler writes itself per job: ``queued`` and ``result``."""


async def _until_idle(core: SchedulerCore, limit_s: float) -> None:
    """Wait until nothing runs or waits (every job terminal); polls every 2 ms."""
    deadline = time.perf_counter() + limit_s
    while True:
        cap = core.capacity()
        if cap["running"] == 0 and cap["queued"] == 0:
            return
        if time.perf_counter() > deadline:
            raise TimeoutError(f"batch not done after {limit_s} s: {cap}")
        await asyncio.sleep(0.002)


async def lifecycle(n: int, turns: int, per: int, journal_dir: str | None) -> dict[str, Any]:
    """Submit ``n`` jobs and time them to terminal; the journal in ``journal_dir`` if given."""
    journal = None
    if journal_dir is not None:
        journal, _ = Journal.open(journal_dir)
        journal.start_background()
    core = SchedulerCore(InstantHost.factory(turns), durable=Durable(journal))
    p0 = time.perf_counter()
    sub = make_submission(core, n, config=Config(), per=per)
    t0, c0 = time.perf_counter(), time.process_time()
    await core.submit(sub)
    t_submit = time.perf_counter() - t0
    await _until_idle(core, limit_s=600)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ok = sum(1 for rec in core.jobs.values() if rec.state == "completed")
    events = n * (1 + len(PER_TURN) * turns + 1 + SCHEDULER_EVENTS)
    journal_bytes = journal.size_bytes() if journal is not None else 0
    replies = await _replies(core, sub.batch_id) if journal is None else {}
    await core.aclose()
    if journal is not None:
        await journal.aclose()
    return {
        "jobs": n,
        "journal": journal_dir is not None,
        "turns": turns,
        "completed": ok,
        "prepare_s": round(t0 - p0, 3),
        "submit_call_s": round(t_submit, 3),
        "wall_s": round(wall, 3),
        "jobs_per_s": round(n / wall),
        "events": events,
        "events_per_s": round(events / wall),
        "cpu_s": round(cpu, 3),
        "jobs_per_cpu_s": round(n / cpu),
        "events_per_cpu_s": round(events / cpu),
        "journal_bytes_per_job": round(journal_bytes / n),
        **replies,
    }


async def _replies(core: SchedulerCore, batch_id: str) -> dict[str, Any]:
    """Pickled size and time of the replies a client reads about the whole batch: one
    ``job_block`` on it, a ``list_jobs`` page of 1,000 and an ``events`` page."""
    t0 = time.perf_counter()
    block = await core.job_block([batch_id], wait_seconds=0)
    t1 = time.perf_counter()
    page = await core.list_jobs(batch=batch_id, limit=1000)
    t2 = time.perf_counter()
    events = await core.events(batch_id, cursor=0, level="lifecycle")
    t3 = time.perf_counter()
    return {
        "job_block_reply_bytes": len(pickle.dumps(block)),
        "job_block_s": round(t1 - t0, 3),
        "list_page_1000_bytes": len(pickle.dumps(page)),
        "list_page_s": round(t2 - t1, 3),
        "events_page_bytes": len(pickle.dumps(events)),
        "events_page_len": len(events["events"]),
        "events_page_s": round(t3 - t2, 3),
    }


async def memory(n: int, turns: int, per: int, max_events: int) -> dict[str, Any]:
    """Bytes the scheduler holds per job (``tracemalloc``): submitted, ended, evicted; the
    event log keeps at most ``max_events`` events in memory."""
    settings = {"retention_s": 0, "max_events": max_events}
    config = Config.model_validate({"durability": settings})
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    core = SchedulerCore(InstantHost.factory(turns), durability=config.durability)
    sub = make_submission(core, n, config=config, per=per)
    with_specs = tracemalloc.get_traced_memory()[0] - base
    await core.submit(sub)
    del sub
    gc.collect()
    submitted = tracemalloc.get_traced_memory()[0] - base
    await _until_idle(core, limit_s=900)
    gc.collect()
    ended = tracemalloc.get_traced_memory()[0] - base
    evict_expired(core, time.time() + 1.0)
    gc.collect()
    evicted = tracemalloc.get_traced_memory()[0] - base
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    await core.aclose()
    return {
        "jobs": n,
        "turns": turns,
        "specs_bytes_per_job": round(with_specs / n),
        "submitted_bytes_per_job": round(submitted / n),
        "ended_bytes_per_job": round(ended / n),
        "evicted_bytes_per_job": round(evicted / n),
        "peak_bytes_per_job": round(peak / n),
        "event_log_cap": config.durability.max_events,
    }


def _row(r: dict[str, Any]) -> str:
    journal = "on" if r["journal"] else "off"
    return (
        f"{r['jobs']:>8,} {journal:>7} {r['turns']:>5} {r['wall_s']:>8.2f} "
        f"{r['jobs_per_s']:>8,} {r['events_per_s']:>9,} {r['cpu_s']:>7.2f} "
        f"{r['jobs_per_cpu_s']:>9,} {r['events_per_cpu_s']:>10,} {r['journal_bytes_per_job']:>8,}"
    )


def _mem_line(mem: dict[str, Any]) -> str:
    return (
        f"memory at {mem['jobs']:,} jobs, event log cap {mem['event_log_cap']:,} (bytes/job): "
        f"submitted {mem['submitted_bytes_per_job']:,}, ended {mem['ended_bytes_per_job']:,}, "
        f"evicted {mem['evicted_bytes_per_job']:,}, peak {mem['peak_bytes_per_job']:,}; "
        f"the specs a client sends: {mem['specs_bytes_per_job']:,}"
    )


def table(rows: list[dict[str, Any]], mems: list[dict[str, Any]]) -> str:
    head = f"{'jobs':>8} {'journal':>7} {'turns':>5} {'wall s':>8} {'jobs/s':>8} {'events/s':>9} {'cpu s':>7} {'jobs/cpu-s':>9} {'ev/cpu-s':>10} {'jrnl B/j':>8}"
    lines = [head, *(_row(r) for r in rows)]
    lines.extend(_mem_line(mem) for mem in mems)
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="batch sizes, comma-separated")
    parser.add_argument("--turns", type=int, default=2, help="model turns per clone")
    parser.add_argument("--clones-per-host", type=int, default=500)
    parser.add_argument("--memory-size", type=int, default=100_000, help="0: skip memory")
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin to")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


async def _measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows = []
    for n in sizes:
        for journal in (False, True):
            with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
                gc.collect()
                rows.append(
                    await lifecycle(n, args.turns, args.clones_per_host, tmp if journal else None)
                )
            print(_row(rows[-1]), flush=True)
    rows.append(await lifecycle(max(sizes), 0, args.clones_per_host, None))  # no per-turn events
    print(_row(rows[-1]), flush=True)
    mem = []
    if args.memory_size:
        caps = (Config().durability.max_events, 1000)  # the default; next to no event log
        mem = [await memory(args.memory_size, args.turns, args.clones_per_host, c) for c in caps]
    return rows, mem


def main() -> int:
    args = _parser().parse_args()
    os.sched_setaffinity(0, {args.cpu})
    gc.set_threshold(50_000, 20, 100)  # as the scheduler actor sets it
    load_before = os.getloadavg()
    rows, mem = asyncio.run(_measure(args))
    print(table(rows, mem))
    report = {
        "params": {
            "turns": args.turns,
            "events_per_job": 1 + len(PER_TURN) * args.turns + 1 + SCHEDULER_EVENTS,
            "clones_per_host": args.clones_per_host,
            "pinned_cpu": args.cpu,
            "cpus": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": sys.platform,
        },
        "lifecycle": rows,
        "memory": mem,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
