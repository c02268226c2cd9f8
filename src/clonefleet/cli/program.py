"""The ``clonefleet`` command line (docs/cli.md).

Each sub-command parses its arguments, calls the Python API and prints either for people (a live
display on a terminal, a summary table) or, with ``--json``, for scripts. Exit status: 0 when
every job completed with outcome success, 1 otherwise, 2 for usage or definition errors (with
nothing started).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clonefleet.cli.bench import add_bench_parser, cmd_bench
from clonefleet.cli.control import CONTROL_HANDLERS, add_control_parsers, make_console
from clonefleet.cli.dashboard import add_dashboard_parser, cmd_dashboard
from clonefleet.cli.signals import as_interrupted, interrupted_line, say_outcome, stop_signals_raise
from clonefleet.cli.trust import add_trust_parser, cmd_trust
from clonefleet.config import printable
from clonefleet.errors import ClonefleetError, ConfigError, DefinitionError, UsageError
from clonefleet.vocab import succeeded

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
    add_dashboard_parser(sub)
    add_bench_parser(sub)
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
    _add_run_display_options(run)


def _add_run_display_options(run: argparse.ArgumentParser) -> None:
    """What ``run`` shows while the batch runs and keeps when it ends (docs/cli.md)."""
    run.add_argument(
        "--progress-lines",
        action="store_true",
        help="print each progress update as an `exec: progress {...}` line even on a terminal",
    )
    run.add_argument(
        "--table", action="store_true", help="end with the per-job table, however many jobs"
    )
    run.add_argument(
        "--out",
        metavar="FILE.jsonl",
        help="append one `run --json` record per job to FILE as each job ends",
    )


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
        "--budget-tokens",
        type=_whole(1),
        metavar="N",
        help="once the batch (with its subagents) used more than N tokens, start no more of its "
        "jobs and cancel those running (they end cancelled, stop reason budget)",
    )
    run.add_argument(
        "--budget-usd",
        type=float,
        metavar="X",
        help="the same in US dollars (every model the batch may use needs a price in the config)",
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
    val.add_argument(
        "--tools",
        action="store_true",
        help="per definition, the tools it asked for, those it gets and why any are missing",
    )

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


FOLLOW_MARGIN_S = 30.0
"""What each read that follows a run may take past its own wait before the run gives up: a
scheduler folding a big batch's events answers late, not never (docs/scaling.md)."""


OWN_SIGNAL_HANDLING = ("provider", "dashboard")
"""Commands that serve until stopped and take SIGINT and SIGTERM as a clean stop (status 0)."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in OWN_SIGNAL_HANDLING:
        return _main(args)
    with stop_signals_raise():
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    handler = {
        "run": cmd_run,
        "validate": cmd_validate,
        "agents": cmd_agents,
        "provider": cmd_provider,
        **CONTROL_HANDLERS,
        "trust": cmd_trust,
        "dashboard": cmd_dashboard,
        "bench": cmd_bench,
    }[args.command]
    try:
        return handler(args)
    except (UsageError, DefinitionError, ConfigError) as exc:
        print(f"clonefleet: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClonefleetError as exc:
        print(f"clonefleet: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:
        stop = as_interrupted(exc)
        print(interrupted_line(stop), file=sys.stderr)
        return stop.exit_status


def entry() -> None:
    """The ``clonefleet`` program: :func:`main`, then a quick exit.

    Once a command has finished, with Ray stopped and every file closed, the interpreter's own
    teardown (unloading Ray and every other module one by one) still took about 0.3 s of each
    run here, with nothing left for it to do; the process ends at once instead. Anything that
    could still need that teardown (a connection to Ray, a thread still running, output that
    cannot be flushed) gets the ordinary exit.
    """
    code = main()
    if _nothing_left_to_finish():
        os._exit(code)
    raise SystemExit(code)


def _nothing_left_to_finish() -> bool:
    import threading

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe: the ordinary exit reports it
        return False
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return False
    main_thread = threading.main_thread()
    return not any(t is not main_thread and not t.daemon for t in threading.enumerate())


# -- run ---------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from clonefleet.cli.trust import config_line
    from clonefleet.cluster import resolve_address, stop_current_session
    from clonefleet.config import load_config

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
    sink = _record_file(args)  # before Ray starts: a bad --out is a usage error
    started = time.monotonic()
    run = _Run(address)
    say_outcome(run.what_became)  # also for an end at once (see clonefleet.cli.signals)
    try:
        try:
            return _run_batch(args, config, plan, address, sink, started, run)
        finally:
            if run.fleet is not None:
                run.fleet.close()
            if sink is not None:
                sink.close()
    except KeyboardInterrupt as exc:
        # Interrupted while the Fleet was being made (Ray starting), or while it was closing.
        stop_current_session()
        stop = as_interrupted(exc)
        print(interrupted_line(stop), file=sys.stderr)
        return stop.exit_status


class _Run:
    """How far a ``run`` got: what an interruption leaves behind depends on it."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        """Where the batch runs (``None``: an embedded Ray)."""
        self.fleet: Any = None
        self.batch_id: str | None = None
        self.ended = False
        """Whether every job had ended (the summary was being printed)."""

    def what_became(self) -> str:
        """What became of the batch, for the line that says the run was interrupted."""
        embedded = self.address is None if self.fleet is None else self.fleet.embedded
        if self.batch_id is None:
            if embedded:
                return "no batch was submitted, and the embedded cluster stopped"
            return "no batch id came back (`clonefleet jobs list` shows whether one started)"
        if self.ended:
            return f"batch {self.batch_id} had ended"
        if embedded:
            return f"batch {self.batch_id} cancelled: the embedded cluster stopped, and its jobs"
        return (
            f"batch {self.batch_id} keeps running on the cluster "
            f"(`clonefleet jobs cancel {self.batch_id}` stops it)"
        )


def _run_batch(
    args: argparse.Namespace,
    config: Any,
    plan: Any,
    address: str | None,
    sink: Any,
    started: float,
    run: _Run,
) -> int:
    """Connect, submit, follow and summarise; ``run`` records how far it got."""
    from clonefleet.fleet import Fleet

    fleet = run.fleet = Fleet(address, config=config)
    fleet.wait_margin_s = FOLLOW_MARGIN_S  # the reads that follow the run (see above)
    batch = fleet.submit(plan)
    run.batch_id = batch.batch_id
    if args.detach:
        out = {"batch_id": batch.batch_id, "job_ids": list(batch.job_ids)}
        print(
            json.dumps(out) if args.json else f"batch {batch.batch_id}: " + " ".join(batch.job_ids)
        )
        return EXIT_OK
    tally = _watch(fleet, batch, args, sink)
    run.ended = True
    records = tally.ordered_records()
    if not args.json:
        _summary(args, config, fleet, tally, time.monotonic() - started)
    ok = all(succeeded(r) for r in records) and (sink is None or sink.error is None)
    return EXIT_OK if ok and len(records) == len(batch.job_ids) else EXIT_FAILED


def _plan(args: argparse.Namespace, config: Any) -> Any:
    """The checked, rendered batch of a ``run`` command line (nothing has started)."""
    from clonefleet.fleet import plan_batch

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
        budget_tokens=args.budget_tokens,
        budget_usd=args.budget_usd,
    )


def _record_file(args: argparse.Namespace) -> Any:
    """The ``--out`` file, open for appending (``None`` without ``--out``)."""
    from clonefleet.cli.summary import RecordFile

    if args.detach and (args.out or args.table or args.progress_lines):
        raise UsageError("--out, --table and --progress-lines follow a run; not with --detach")
    return RecordFile(args.out) if args.out else None


def _watch(fleet: Any, batch: Any, args: argparse.Namespace, sink: Any) -> Any:
    """Follow the batch to its end with the live display (or plain lines) on stderr; records
    go to stdout with ``--json`` and to the ``--out`` file as each job ends."""
    from clonefleet.cli.progress import watch

    writers = [sink.write] if sink is not None else []
    return watch(
        fleet, batch, as_json=args.json, progress_lines=args.progress_lines, writers=writers
    )


def _summary(
    args: argparse.Namespace, config: Any, fleet: Any, tally: Any, elapsed_s: float
) -> None:
    from clonefleet.cli.summary import RunEnd, keep_failures, print_summary, summary

    end = RunEnd(
        records=tally.ordered_records(),
        total=tally.total,
        batch_id=tally.batch_id,
        elapsed_s=elapsed_s,
        ran_s=tally.elapsed_s,
        details=tally.details,
        out_path=args.out,
        embedded=fleet.embedded,
        address=None if args.address in (None, "auto") else args.address,
    )
    print_summary(make_console(), summary(end, config, table=args.table, kept=keep_failures(end)))


# -- definitions -------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from clonefleet.cli.trust import provider_lines, provider_report
    from clonefleet.config import load_config
    from clonefleet.definitions import validate_lines, validate_report
    from clonefleet.planning import clone_tools

    # An untrusted project's config loads here all the same: validate runs nothing, and lists
    # what the project asks for that only `clonefleet trust` allows.
    config = load_config(args.config, check_trust=False)
    cwd = Path.cwd()
    report = validate_report(
        [Path(p) for p in args.paths],
        [Path(d) for d in args.subagents_dir],
        cwd,
        config,
        # What a clone started here would get: the planner's own answer (docs/permissions.md).
        effective_of=lambda defn: clone_tools(defn, config, cwd),
        tools=args.tools,
        trust=True,
    )
    report["providers"] = provider_report(config)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(validate_lines(report)))  # printable: see validate_lines
        print("\n".join(provider_lines(report["providers"])))  # key variables, never values
    untrusted = report["trust"]["asks"] and not report["trust"]["trusted"]
    return EXIT_FAILED if report["errors"] or untrusted else EXIT_OK


def cmd_agents(args: argparse.Namespace) -> int:
    from clonefleet.config import load_config
    from clonefleet.definitions import agents_report, load_catalog

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
    from clonefleet.providers import serve_main

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
