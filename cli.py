"""The ``clonefleet`` command line (docs/cli.md).

Each sub-command parses its arguments, calls the Python API and prints either for people (a live
display on a terminal, a summary table) or, with ``--json``, for scripts. Exit status: 0 when
every job completed with outcome success, 1 otherwise, 2 for usage or definition errors (with
nothing started).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ._cli_control import CONTROL_HANDLERS, add_control_parsers, make_console
from .config import printable
from .errors import ClonefleetError, ConfigError, DefinitionError, UsageError
from .trust import add_trust_parser, cmd_trust
from .vocab import EventType, succeeded

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _var(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--var takes KEY=VALUE, got {text!r}")
    return key, value


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--count takes a whole number, got {text!r}") from None


def _whole(low: int, high: int | None = None) -> Any:
    """An argparse type: a whole number ``low <= n <= high`` (``high`` None = no upper bound)."""

    def parse(text: str) -> int:
        span = f"from {low} to {high}" if high is not None else f"{low} or more"
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"must be a whole number {span}, got {printable(repr(text[:40]))}"
            )
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clonefleet",
        description="Run counted batches of LLM subagents as Ray actors (embedded local Ray and a simulated model by default).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run_parser(sub)
    _add_definition_parsers(sub)
    _add_provider_parser(sub)
    add_control_parsers(sub)
    add_trust_parser(sub)
    return parser


def _add_run_parser(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run a counted batch of one subagent",
        description="Launch COUNT clones of AGENT, each its own job, and wait for them.",
    )
    run.add_argument("agent", metavar="AGENT", help="definition name (see `clonefleet agents`)")
    run.add_argument(
        "--prompt",
        required=True,
        help="the task; rendered per clone as a template for native definitions",
    )
    run.add_argument(
        "--count",
        type=_count,
        default=1,
        help="number of clones (default 1, at most limits.max_count)",
    )
    run.add_argument("--model", help="model, alias or @mg:GROUP overriding the definition's")
    run.add_argument("--cwd", help="launch directory (default: the current directory)")
    run.add_argument(
        "--allow-chdir", action="store_true", help="approve a --cwd outside the current directory"
    )
    run.add_argument(
        "--var",
        type=_var,
        action="append",
        default=[],
        metavar="K=V",
        help="template variable (repeatable)",
    )
    run.add_argument(
        "--subagents-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="extra definitions directory (repeatable)",
    )
    _add_run_execution_options(run)


def _add_run_execution_options(run: argparse.ArgumentParser) -> None:
    """Where and how a batch runs, and what ``run`` prints."""
    run.add_argument(
        "--config",
        metavar="FILE",
        help="config file (default: .clonefleet/config.yaml, then ~/.config/clonefleet/config.yaml)",
    )
    run.add_argument(
        "--address",
        help="Ray address: auto, ray://host:port (default: embedded local Ray, or RAY_ADDRESS)",
    )
    run.add_argument(
        "--sim-script",
        metavar="FILE",
        help="script file for the simulated provider (per-clone steps)",
    )
    run.add_argument(
        "--clones-per-actor",
        type=_whole(1),
        metavar="K",
        help="clones hosted per Ray actor, 1 or more (1 = a process per clone)",
    )
    run.add_argument(
        "--max-concurrency",
        type=_whole(1),
        metavar="N",
        help="jobs of this batch running at once, 1 or more",
    )
    run.add_argument(
        "--detach",
        action="store_true",
        help="print the batch and job ids and return (needs a persistent cluster)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object per job as it ends")


def _add_definition_parsers(sub: Any) -> None:
    val = sub.add_parser(
        "validate",
        help="check definition files",
        description="Load definitions and report errors and warnings.",
    )
    val.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="definition files or directories (default: everything discovered)",
    )
    val.add_argument("--subagents-dir", action="append", default=[], metavar="DIR")
    val.add_argument("--config", metavar="FILE")
    val.add_argument("--json", action="store_true")

    agents = sub.add_parser("agents", help="list available subagent definitions")
    agents.add_argument("--subagents-dir", action="append", default=[], metavar="DIR")
    agents.add_argument("--config", metavar="FILE")
    agents.add_argument("--json", action="store_true")


def _add_provider_parser(sub: Any) -> None:
    prov = sub.add_parser("provider", help="model provider tools")
    prov_sub = prov.add_subparsers(dest="provider_command", required=True, metavar="ACTION")
    serve = prov_sub.add_parser(
        "serve",
        help="serve the simulated model over HTTP (OpenAI and Anthropic formats) on 127.0.0.1",
    )
    serve.add_argument(
        "--port",
        type=_whole(0, 65535),
        required=True,
        help="TCP port, 1-65535, or 0 for a free one",
    )
    serve.add_argument("--latency-ms", type=float, default=0.0)
    serve.add_argument("--fail-rate", type=float, default=0.0)
    serve.add_argument("--rate-429", type=float, default=0.0)
    serve.add_argument("--script", metavar="FILE")
    serve.add_argument("--seed", type=int, default=0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {
        "run": cmd_run,
        "validate": cmd_validate,
        "agents": cmd_agents,
        "provider": cmd_provider,
        **CONTROL_HANDLERS,
        "trust": cmd_trust,
    }[args.command]
    try:
        return handler(args)
    except (UsageError, DefinitionError, ConfigError) as exc:
        print(f"clonefleet: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClonefleetError as exc:
        print(f"clonefleet: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("clonefleet: interrupted", file=sys.stderr)
        return 130


# -- run ---------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from ._fleet import Fleet
    from .cluster import resolve_address
    from .config import load_config
    from .trust import config_line

    # Everything that can be wrong with the request is found here, before Ray starts: config,
    # count, definition, cwd, model, and the rendering of every clone.
    config = load_config(args.config)
    print(f"clonefleet: {config_line(config)}", file=sys.stderr, flush=True)
    plan = _plan(args, config)
    address = resolve_address(args.address)
    if args.detach and address is None:
        raise UsageError(
            "--detach needs a persistent cluster: run `clonefleet cluster up` and pass --address auto"
        )
    started = time.monotonic()
    fleet = Fleet(address, config=config)
    try:
        batch = fleet.submit(plan)
        if args.detach:
            out = {"batch_id": batch.batch_id, "job_ids": list(batch.job_ids)}
            print(
                json.dumps(out)
                if args.json
                else f"batch {batch.batch_id}: " + " ".join(batch.job_ids)
            )
            return EXIT_OK
        try:
            records = _watch(fleet, batch, as_json=args.json)
        except KeyboardInterrupt:
            _say_interrupted(fleet, batch.batch_id)
            return 130
    finally:
        fleet.close()
    if not args.json:
        _summary(records, time.monotonic() - started)
    ok = all(succeeded(r) for r in records)
    return EXIT_OK if ok and len(records) == len(batch.job_ids) else EXIT_FAILED


def _plan(args: argparse.Namespace, config: Any) -> Any:
    """The checked, rendered batch of a ``run`` command line (nothing has started)."""
    from ._fleet import plan_batch

    return plan_batch(
        args.agent,
        args.prompt,
        args.count,
        config=config,
        caller_cwd=Path.cwd(),
        model=args.model,
        cwd=args.cwd,
        approve_chdir=args.allow_chdir,
        variables=dict(args.var),
        subagents_dirs=args.subagents_dir,
        sim_script=args.sim_script,
        clones_per_actor=args.clones_per_actor,
        max_concurrency=args.max_concurrency,
    )


def _say_interrupted(fleet: Any, batch_id: str) -> None:
    if fleet.embedded:
        print(
            "clonefleet: interrupted; the embedded cluster stops, and its jobs with it",
            file=sys.stderr,
        )
    else:
        print(
            f"clonefleet: interrupted; batch {batch_id} keeps running on the cluster "
            f"(`clonefleet jobs cancel {batch_id}` stops it)",
            file=sys.stderr,
        )


class _Display:
    """Progress for people: a live bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream = total, stream
        self.done = self.failed = self.running = 0
        self.latest = ""
        self._live = None
        self._last_plain = 0.0
        if stream.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._live = Progress(
                TextColumn("[bold]jobs"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=Console(file=stream),
                transient=False,
            )
            self._task = self._live.add_task("jobs", total=total, info="")
            self._live.start()

    def update(self, force: bool = False) -> None:
        queued = self.total - self.done - self.running
        info = f"running {self.running} queued {max(queued, 0)} failed {self.failed} {self.latest[:60]}"
        if self._live is not None:
            self._live.update(self._task, completed=self.done, info=info)
        elif force or time.monotonic() - self._last_plain > 2.0:
            self._last_plain = time.monotonic()
            print(
                f"clonefleet: {self.done}/{self.total} done, {info}", file=self.stream, flush=True
            )

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()


def _watch(fleet: Any, batch: Any, *, as_json: bool) -> list[dict[str, Any]]:
    """Follow the batch's events to the end; echo progress, print JSON records as jobs end."""
    display = None if as_json else _Display(len(batch.job_ids), sys.stderr)
    records: dict[str, dict[str, Any]] = {}
    try:
        for env in fleet.follow(batch.batch_id):
            event = env["event"]
            kind = event["type"]
            if kind == EventType.PROGRESS:
                print(
                    f"exec: progress {json.dumps(event.get('progress'))}",
                    file=sys.stderr,
                    flush=True,
                )
                if display:
                    display.latest = (
                        f"{env['display_name']}: {event.get('progress', {}).get('summary', '')}"
                    )
            elif kind == EventType.STARTED and display:
                display.running += 1
            elif kind == EventType.RESULT:
                record = event["record"]
                records[record["job_id"]] = record
                if as_json:
                    print(json.dumps(record), flush=True)
                elif display:
                    display.running = max(display.running - 1, 0)
                    display.done += 1
                    display.failed += not succeeded(record)
            if display:
                display.update()
    finally:
        if display:
            display.update(force=True)
            display.close()
    return [records[j] for j in batch.job_ids if j in records]


def _summary(records: list[dict[str, Any]], elapsed_s: float) -> None:
    from rich.table import Table

    table = Table(title=f"{len(records)} jobs in {elapsed_s:.1f}s")
    for col in ("job", "clone", "status", "outcome", "model", "turns"):
        table.add_column(col, no_wrap=True)
    table.add_column("result / error", no_wrap=True, overflow="ellipsis", max_width=80)
    shown = records if len(records) <= 50 else records[:25] + records[-25:]
    for r in shown:
        result = r["error"] or (
            r["result"].get("summary") if isinstance(r["result"], dict) else r["result"]
        )
        table.add_row(
            r["job_id"],
            str(r["clone_index"]),
            r["status"],
            str(r["outcome"]),
            str(r["model"]),
            str(r["turns"]),
            str(result)[:80],
        )
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    console = make_console()
    console.print(table)
    console.print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no jobs")


# -- definitions -------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from .config import load_config
    from .definitions import validate_report
    from .trust import provider_lines, provider_report

    config = load_config(args.config)
    report = validate_report(
        [Path(p) for p in args.paths], [Path(d) for d in args.subagents_dir], Path.cwd(), config
    )
    report["providers"] = provider_report(config)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        # Names, paths and messages come from files anyone may have written: printable() keeps
        # their control characters and bidi marks off the terminal (docs/cli.md).
        for d in report["definitions"]:
            print(printable(f"ok       {d['name']} ({d['dialect']}) {d['path'] or ''}"))
        for w in report["warnings"]:
            print(printable(f"warning  {w['path']}: {w['name']}: {w['message']}"))
        for e in report["errors"]:
            print(printable(f"error    {e['path']}: {e['reason']}: {e['message']}"))
        print("\n".join(provider_lines(report["providers"])))  # key variables, never values
    return EXIT_FAILED if report["errors"] else EXIT_OK


def cmd_agents(args: argparse.Namespace) -> int:
    from .config import load_config
    from .definitions import agents_report, load_catalog

    config = load_config(args.config)
    report = agents_report(load_catalog(Path.cwd(), [Path(d) for d in args.subagents_dir], config))
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    from rich.table import Table
    from rich.text import Text

    table = Table()
    table.add_column("name", no_wrap=True)
    table.add_column("dialect", no_wrap=True)
    table.add_column("path / shadows", overflow="fold", min_width=40)
    table.add_column("description", overflow="ellipsis", no_wrap=True, max_width=30)
    for a in report["agents"]:
        # Text cells: no rich markup is read from a name or description (`[/x]` would raise),
        # and printable() escapes control characters and bidi marks (docs/cli.md).
        where = printable(a["path"] or "(in code or config)")
        where += "".join(f"\n  shadows {printable(p)}" for p in a["shadows"])
        table.add_row(
            Text(printable(a["name"])),
            Text(printable(a["dialect"])),
            Text(where),
            Text(printable(" ".join((a["description"] or "").split()))),
        )
    make_console().print(table)
    return EXIT_OK


def cmd_provider(args: argparse.Namespace) -> int:
    from .providers import serve_main

    return serve_main(
        port=args.port,
        latency_ms=args.latency_ms,
        fail_rate=args.fail_rate,
        rate_429=args.rate_429,
        script=args.script,
        seed=args.seed,
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
