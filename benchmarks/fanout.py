"""Fan-out of counted batches against the asyncio floor: ``clonefleet bench`` plus a cold run.

The measuring is ``clonefleet.bench`` (the same as ``clonefleet bench``, docs/benchmarks.md):
the simulated provider served over HTTP from its own process (127.0.0.1, ``--latency-ms`` per
request, ``--turns`` model requests per clone), one warm ``Fleet`` (Ray and warm-host start-up
reported apart), and in the same run the hand-written asyncio loop making the same requests
(and, with ``--baselines floor,actor-per-clone``, one Ray actor per clone). This script adds,
once at the end, ``clonefleet run general-purpose --count 1000`` cold in a subprocess (Ray start
included), and checks the targets: N=1000 within 1.2x the floor; N=10000 at or under 1.0x, at
most 0.8 ms of CPU per clone across clonefleet's processes, under 500 MB added; cold
``run --count 1000`` under 6 s.

    python benchmarks/fanout.py [--sizes 10,100,1000,10000] [--latency-ms 200] [--turns 2]
                                [--repeat 1] [--baselines floor] [--seed 0]
                                [--clones-per-actor K] [--baseline-limit 1000]
                                [--journal on|off] [--time-limit-s 600]
                                [--cold-count 1000] [--no-cold] [--out FILE]

Prints one table and writes ``benchmarks/results/fanout.json``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from _fanout_cold import run_cold
from _fanout_report import TARGETS, verdicts

from clonefleet.bench import BenchParams, ProgressDisplay, run_bench, steps, table

RESULTS = Path(__file__).parent / "results" / "fanout.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000", help="comma-separated batch sizes")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="server delay per request")
    parser.add_argument("--turns", type=int, default=2, help="model requests per clone")
    parser.add_argument("--repeat", type=int, default=1, help="batches per size and system")
    parser.add_argument(
        "--baselines", default="floor", help="floor, actor-per-clone, both (comma-separated)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated server")
    parser.add_argument(
        "--clones-per-actor", type=int, default=None, help="override clonefleet's automatic choice"
    )
    parser.add_argument(
        "--baseline-limit",
        type=int,
        default=1000,
        help="connections the floor's session opens at most (the per-process pool of "
        "clonefleet's providers; 10,000 connections at once make the loop slower, not faster)",
    )
    parser.add_argument("--time-limit-s", type=float, default=600.0, help="longest wait per batch")
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


def _params(args: argparse.Namespace) -> BenchParams:
    return BenchParams(
        counts=tuple(int(s) for s in args.sizes.split(",") if s.strip()),
        turns=args.turns,
        latency_ms=args.latency_ms,
        repeat=args.repeat,
        baselines=tuple(b for b in args.baselines.split(",") if b.strip()),
        seed=args.seed,
        journal=args.journal == "on",
        clones_per_actor=args.clones_per_actor,
        floor_connections=args.baseline_limit or 100_000,
        time_limit_s=args.time_limit_s,
    )


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    args = _parser().parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated run still stops Ray and the server
    params = _params(args)
    with ProgressDisplay(steps(params)) as progress:
        report = run_bench(params, progress)
    cold = None if args.no_cold else run_cold(args.cold_count, args.time_limit_s)
    print(f"fanout: {json.dumps(report['params'])}")
    print(f"start-up (not in the makespans): {json.dumps(report['startup'])}")
    print(table(report["results"]))
    if cold is not None:
        print(
            f"cold `clonefleet run general-purpose --count {cold['count']}`: {cold['wall_s']} s, "
            f"exit {cold['exit_status']}, {cold['completed_success']}/{cold['count']} ok"
        )
    for line in verdicts(report["results"], cold):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {**report, "cold_run": cold, "targets": TARGETS}
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
