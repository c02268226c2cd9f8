"""``clonefleet bench``: its arguments and what it prints (docs/cli.md, docs/benchmarks.md).

The measuring is :func:`clonefleet.bench.run_bench`; this module turns the command line into
:class:`~clonefleet.bench.BenchParams`, shows progress, prints the table and writes the files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from clonefleet.cli.console import whole_number

__all__ = ["add_bench_parser", "cmd_bench", "limits_line"]

_EPILOG = """\
Columns: makespan s (median over the repeats, from spawn to the last clone's end), min-max s
(its spread), clones/s, x floor (makespan over the floor's), 1st req p50/p99 ms (spawn to each
clone's first model request), CPU s/clone (this process and Ray's, the server's left out), added
MB (peak memory added), req/s (model requests per second), min s (turns x latency), cached %
(the share of input tokens the provider read from its prompt cache; "-" where not known), ok.
Against a rate limit (--rpm, --tpm) also: sent (requests over the repeats), 429s, 429 %,
limit min s (the least makespan the limit allows) and x limit min (makespan over it).
Exit status: 0 when every clonefleet batch completed successfully (a baseline's failures show
in its ok column), 1 otherwise, 2 for usage errors."""


def _counts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"takes sizes like 10,100,1000 (1 or more), got {text!r}")
    return values


def _baselines(text: str) -> tuple[str, ...]:
    from clonefleet.bench import BASELINES

    names = tuple(p.strip() for p in text.split(",") if p.strip() and p.strip() != "none")
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown baseline {unknown[0]!r}; choose from {', '.join(BASELINES)} or none"
        )
    return names


def add_bench_parser(sub: Any) -> None:
    """Register ``clonefleet bench`` on the sub-command parsers ``sub``."""
    bench = sub.add_parser(
        "bench",
        help="measure fan-out against an asyncio floor and one Ray actor per clone",
        description="Run warm counted batches of each size against a simulated provider served\n"
        "on 127.0.0.1, and the same requests from a single-process asyncio loop (the floor)\n"
        "and from one Ray actor per clone; print a table, optionally write JSON and a plot.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--count",
        type=_counts,
        action="append",
        metavar="N[,N...]",
        help="batch sizes, comma-separated or repeated (default 10,100,1000)",
    )
    bench.add_argument(
        "--turns",
        type=whole_number(1),
        default=2,
        metavar="T",
        help="model requests per clone (default 2)",
    )
    bench.add_argument(
        "--latency-ms",
        type=float,
        default=200.0,
        metavar="L",
        help="simulated provider delay per request, ms (default 200)",
    )
    bench.add_argument(
        "--repeat",
        type=whole_number(1),
        default=3,
        metavar="R",
        help="batches per size and system (default 3)",
    )
    bench.add_argument(
        "--baselines",
        type=_baselines,
        default=("floor", "actor-per-clone"),
        metavar="LIST",
        help="baselines to measure: floor, actor-per-clone, both comma-separated (the default) "
        "or none",
    )
    bench.add_argument(
        "--system-tokens",
        type=whole_number(0),
        default=0,
        metavar="N",
        help="put about N tokens of text shared by the whole batch ahead of the benched "
        "definition's body, so the provider's prompt cache matters (default 0: none)",
    )
    _add_where(bench)
    _add_limits(bench)
    _add_outputs(bench)


def _add_limits(bench: argparse.ArgumentParser) -> None:
    limits = bench.add_argument_group(
        "against a rate limit",
        "the started server enforces a limit per model, as providers do; the baselines are then "
        'not run (docs/benchmarks.md, "Against a rate limit")',
    )
    limits.add_argument(
        "--rpm", type=whole_number(1), metavar="R", help="the server's requests per minute"
    )
    limits.add_argument(
        "--tpm",
        type=whole_number(1),
        metavar="T",
        help="the server's tokens per minute (input words plus max_tokens per request)",
    )
    limits.add_argument(
        "--burst",
        type=whole_number(1),
        metavar="B",
        help="requests the server lets through at once after an idle spell (needs --rpm; "
        "default one second of it)",
    )
    limits.add_argument(
        "--no-limit-headers",
        dest="limit_headers",
        action="store_false",
        help="the server sends no rate-limit headers or retry-after (needs --rpm or --tpm)",
    )
    limits.add_argument(
        "--client-rpm",
        type=whole_number(1),
        metavar="R",
        help="rpm of the provider in clonefleet's config (its own fleet-wide limit)",
    )
    limits.add_argument(
        "--client-tpm",
        type=whole_number(1),
        metavar="T",
        help="tpm of the provider in clonefleet's config",
    )


def _add_where(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--address",
        metavar="ADDR",
        help="Ray address: auto, ray://host:port (default: embedded local Ray)",
    )
    bench.add_argument(
        "--base-url",
        metavar="URL",
        help="an OpenAI-compatible server (.../v1) to use instead of starting the simulated one; "
        "--turns and --latency-ms are then that server's business",
    )
    bench.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the simulated provider"
    )
    bench.add_argument(
        "--journal",
        choices=("on", "off"),
        default="on",
        help="keep the scheduler's journal (on, as users run it) or measure without it",
    )
    bench.add_argument(
        "--clones-per-actor", type=whole_number(1), metavar="K", help="override clonefleet's choice"
    )
    bench.add_argument(
        "--floor-connections",
        type=whole_number(1),
        default=1000,
        metavar="C",
        help="connections the floor opens at most (default 1000, one clonefleet host's pool)",
    )
    bench.add_argument(
        "--actor-max",
        type=whole_number(1),
        default=100,
        metavar="N",
        help="largest size the actor-per-clone baseline runs (default 100); it is also skipped "
        "where its measured memory per actor or start rate would not fit",
    )
    bench.add_argument(
        "--time-limit-s",
        type=float,
        default=600.0,
        metavar="S",
        help="longest wait for one batch (default 600)",
    )


def _add_outputs(bench: argparse.ArgumentParser) -> None:
    bench.add_argument(
        "--json", metavar="FILE", help="write the parameters, versions, machine and results"
    )
    bench.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw makespan and ratio against batch size (needs the plot extra: matplotlib)",
    )


def params_of(args: argparse.Namespace) -> Any:
    """The :class:`~clonefleet.bench.BenchParams` of a parsed command line."""
    from clonefleet.bench import BenchParams

    counts = [n for group in (args.count or [[10, 100, 1000]]) for n in group]
    return BenchParams(
        counts=tuple(dict.fromkeys(counts)),
        turns=args.turns,
        latency_ms=args.latency_ms,
        repeat=args.repeat,
        address=args.address,
        base_url=args.base_url,
        baselines=args.baselines,
        seed=args.seed,
        journal=args.journal == "on",
        clones_per_actor=args.clones_per_actor,
        floor_connections=args.floor_connections,
        actor_max=args.actor_max,
        time_limit_s=args.time_limit_s,
        rpm=args.rpm,
        tpm=args.tpm,
        burst=args.burst,
        limit_headers=args.limit_headers,
        client_rpm=args.client_rpm,
        client_tpm=args.client_tpm,
        system_tokens=args.system_tokens,
    )


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 when every clonefleet batch completed successfully, else 1."""
    from clonefleet.bench import ProgressDisplay, check_plotting, plot, run_bench, steps, table

    params = params_of(args)
    params.check()
    if args.plot:
        check_plotting()  # before anything starts
    with ProgressDisplay(steps(params)) as progress:
        report = run_bench(params, progress)
    _print(report, table(report["results"]))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        sys.stderr.write(f"wrote {path}\n")
    if args.plot:
        sys.stderr.write(f"wrote {plot(report, args.plot)}\n")
    # A baseline's failures (actors that died for want of memory, say) are in its `ok` column;
    # only clonefleet's own batches decide the exit status.
    ours = [r for r in report["results"] if r["system"] == "clonefleet"]
    return 0 if all(r["completed"] == r["clones"] for r in ours) else 1


def _print(report: dict[str, Any], text: str) -> None:
    p, s, m = report["params"], report["startup"], report["machine"]
    server = p["base_url"] if p["base_url"] else f"{p['turns']} turns x {p['latency_ms']:g} ms"
    if p.get("system_tokens"):
        server += f", {p['system_tokens']} shared system tokens"
    sys.stdout.write(
        f"clonefleet bench: {server}, {p['repeat']} repeats, "
        f"journal {'on' if p['journal'] else 'off'}; {m['cpus']} CPUs, "
        f"clonefleet {report['versions']['clonefleet']}, ray {report['versions']['ray']}\n"
        f"{limits_line(p)}"
        f"start-up (not in the makespans): Ray {s['ray_start_s']} s, "
        f"{s['warm_hosts']} warm hosts {s['warm_hosts_s']} s\n{text}\n"
    )
    sys.stdout.flush()


def limits_line(p: dict[str, Any]) -> str:
    """The report's line on the rate limit, ending in a newline (empty without a limit)."""
    if p.get("rpm") is None and p.get("tpm") is None:
        return ""
    server = [f"{k} {p[k]}" for k in ("rpm", "tpm", "burst") if p.get(k) is not None]
    client = [f"{k} {p['client_' + k]}" for k in ("rpm", "tpm") if p.get("client_" + k)]
    return (
        f"against a rate limit: server {', '.join(server)}, limit headers "
        f"{'on' if p.get('limit_headers', True) else 'off'}; clonefleet's config "
        f"{', '.join(client) if client else 'sets no limit'}; baselines not run (they have no "
        "limiter); limit min s = the least makespan the limit allows\n"
    )
