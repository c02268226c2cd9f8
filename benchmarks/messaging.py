"""Messages to running clones: time from send to ``delivered``, p50/p99, and the send rate.

A batch of ``--count`` clones runs on an embedded local Ray with the in-process simulated
provider: each clone makes ``--turns`` model turns of ``--latency-ms`` each (a
``progress_update`` per turn), so every clone is mid-run for a while. Once every clone has made
its first turn, one message is sent to each through ``Fleet.message`` from ``--senders``
threads. A delivery is done when its clone took it into its context at a turn boundary (its
``message_delivered`` event); its latency runs from just before its ``message`` call to that
event. The clones are then cancelled. Every wait is bounded in count and time.

    python benchmarks/messaging.py [--count 1000] [--turns 40] [--latency-ms 200]
                                   [--senders 16] [--out benchmarks/results/messaging.json]

The floor of a delivery's latency is the rest of the model turn in flight when it arrives: on
average half of ``--latency-ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from _fanout_report import percentile, rounded

RESULTS = Path(__file__).parent / "results" / "messaging.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="clones in the batch")
    parser.add_argument("--turns", type=int, default=40, help="model turns per clone")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="per model turn")
    parser.add_argument("--senders", type=int, default=16, help="threads calling message()")
    parser.add_argument("--time-limit-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


def _until(predicate: Any, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {limit_s:g} s")
        time.sleep(0.05)


def _delivered_at(fleet: Any, batch_id: str) -> dict[str, float]:
    """``delivery_id -> ts`` of every ``message_delivered`` event of the batch."""
    out: dict[str, float] = {}
    cursor = 0
    for _ in range(10_000):  # pages of at most 5,000 events
        page = fleet.events(batch_id, cursor=cursor, level="lifecycle")
        for env in page["events"]:
            event = env["event"]
            if event["type"] == "message_delivered":
                out.setdefault(event["delivery_id"], event["ts"])
        if not page["events"]:
            return out
        cursor = page["cursor"]
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from clonefleet import Fleet
    from clonefleet.config import Config
    from clonefleet.fleet import plan_batch

    steps = [
        {"tool": "progress_update", "args": {"summary": f"t{i}"}, "latency_ms": args.latency_ms}
        for i in range(args.turns)
    ]
    with tempfile.TemporaryDirectory(prefix="messaging-") as cwd:
        script = Path(cwd) / "script.json"
        script.write_text(json.dumps({"default": steps}))
        fleet = Fleet(cwd=cwd)
        try:
            fleet.wait_ready()
            plan = plan_batch(
                "general-purpose",
                "listen",
                args.count,
                config=Config(),
                caller_cwd=Path(cwd),
                sim_script=str(script),
            )
            batch = fleet.submit(plan)
            print(f"messaging: {args.count} clones started", file=sys.stderr, flush=True)
            _until(
                lambda: all(
                    s["turns"] >= 1
                    for s in fleet.job_block([batch.batch_id], wait_seconds=0)["jobs"]
                ),
                args.time_limit_s,
                "every clone's first turn",
            )
            sent = _send_all(fleet, batch.job_ids, args.senders)
            print(f"messaging: {len(sent)} messages queued", file=sys.stderr, flush=True)
            deadline = time.monotonic() + args.time_limit_s
            while time.monotonic() < deadline:
                delivered = _delivered_at(fleet, batch.batch_id)
                if len(delivered) >= len(sent):
                    break
                time.sleep(0.2)
            fleet.cancel_many([batch.batch_id])
            fleet.job_block([batch.batch_id], timeout_seconds=60)
        finally:
            fleet.close()
    return _figures(args, sent, delivered)


def _send_all(fleet: Any, job_ids: tuple[str, ...], senders: int) -> dict[str, tuple[float, float]]:
    """``delivery_id -> (sent at, queued after s)`` for one message to each job."""

    def one(job_id: str) -> tuple[str, float, float]:
        t0 = time.time()
        out = fleet.message(job_id, f"a note for {job_id}")
        return out["delivery_id"], t0, time.time() - t0

    started = time.monotonic()
    with ThreadPoolExecutor(senders) as pool:
        done = list(pool.map(one, job_ids))
    _send_all.wall_s = time.monotonic() - started  # type: ignore[attr-defined]
    return {d: (t0, q) for d, t0, q in done}


def _figures(
    args: argparse.Namespace, sent: dict[str, tuple[float, float]], delivered: dict[str, float]
) -> dict[str, Any]:
    lat = [(delivered[d] - t0) * 1000 for d, (t0, _) in sent.items() if d in delivered]
    queued = [q * 1000 for _, q in sent.values()]
    wall = getattr(_send_all, "wall_s", 0.0)
    return {
        "count": args.count,
        "latency_ms_per_turn": args.latency_ms,
        "senders": args.senders,
        "delivered": len(lat),
        "sent": len(sent),
        "send_wall_s": round(wall, 2),
        "sends_per_s": round(len(sent) / wall, 1) if wall else None,
        "queued_p50_ms": rounded(percentile(queued, 0.5)),
        "queued_p99_ms": rounded(percentile(queued, 0.99)),
        "delivered_p50_ms": rounded(percentile(lat, 0.5)),
        "delivered_p99_ms": rounded(percentile(lat, 0.99)),
        "delivered_max_ms": rounded(max(lat, default=None)),
        "floor_p50_ms": args.latency_ms / 2,
    }


def main() -> int:
    args = _parser().parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    row = run(args)
    params = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "versions": {p: metadata.version(p) for p in ("ray", "clonefleet")},
    }
    for key, value in row.items():
        print(f"{key:>22}: {value}")  # noqa: T201 - a benchmark prints its table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"params": params, "result": row}, indent=2) + "\n")
    print(f"wrote {args.out}")  # noqa: T201
    return 0 if row["delivered"] == row["sent"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
