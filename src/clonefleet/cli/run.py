"""``clonefleet run``: launch a counted batch of one subagent and follow it to its end
(docs/cli.md).

Everything that can be wrong with the request (config, count, definition, cwd, model, the
rendering of every clone) is found before Ray starts. The batch is then followed with the live
display or plain lines on stderr (:mod:`clonefleet.cli.progress`), records go to stdout with
``--json`` and to the ``--out`` file, and the summary ends it (:mod:`clonefleet.cli.summary`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clonefleet.cli.console import EXIT_FAILED, EXIT_OK, make_console, whole_number
from clonefleet.cli.provider import config_line
from clonefleet.cli.signals import as_interrupted, interrupted_line, say_outcome
from clonefleet.errors import UsageError
from clonefleet.vocab import succeeded

__all__ = ["FOLLOW_MARGIN_S", "add_run_parser", "cmd_run"]

FOLLOW_MARGIN_S = 30.0
"""What each read that follows a run may take past its own wait before the run gives up: a
scheduler folding a big batch's events answers late, not never (docs/scaling.md)."""


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


def add_run_parser(sub: Any) -> None:
    """Register ``clonefleet run`` on the command line's sub-parsers."""
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
        default=None,
        help="number of clones (default 1, at most limits.max_count); not with --inputs",
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
    _add_run_inputs_options(run)


def _add_run_inputs_options(run: argparse.ArgumentParser) -> None:
    """A definition mapped over a dataset: one clone per row (docs/inputs.md)."""
    run.add_argument(
        "--inputs",
        metavar="FILE",
        help="run one clone per row of FILE (JSONL, CSV, TSV or text; - for standard input), "
        "each seeing its row as {{ input }}",
    )
    run.add_argument(
        "--inputs-format",
        metavar="FORMAT",
        help="jsonl, csv, tsv or text (default: from the extension)",
    )
    run.add_argument(
        "--key", metavar="FIELD", help="the field that identifies a row (default: its line)"
    )
    run.add_argument(
        "--limit", type=whole_number(1), metavar="N", help="only the first N rows of --inputs"
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="skip the rows --out already has a record for (implied when --out has records)",
    )
    run.add_argument(
        "--retry-failed",
        action="store_true",
        help="run again the rows whose record in --out failed (with --inputs)",
    )
    run.add_argument(
        "--include-input",
        action="store_true",
        help="write each row into its record in --out (as input)",
    )


def _add_run_display_options(run: argparse.ArgumentParser) -> None:
    """What ``run`` shows while the batch runs and keeps when it ends (docs/cli.md)."""
    run.add_argument(
        "--progress-lines",
        action="store_true",
        help="print each progress update as an `exec: progress {...}` line even on a terminal "
        "(with --inputs: plain progress lines instead of the bar)",
    )
    run.add_argument(
        "--table",
        action="store_true",
        help="end with the per-job table, however many jobs (with --inputs: up to 10,000 rows)",
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
        type=whole_number(1),
        metavar="K",
        help="clones hosted per Ray actor, 1 or more (1 = a process per clone)",
    )
    run.add_argument(
        "--max-concurrency",
        type=whole_number(1),
        metavar="N",
        help="jobs of this batch running at once, 1 or more",
    )
    run.add_argument(
        "--budget-tokens",
        type=whole_number(1),
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


def cmd_run(args: argparse.Namespace) -> int:
    """Plan, submit and follow one batch; 0 when every job succeeded, 1 otherwise."""
    from clonefleet.cluster import resolve_address, stop_current_session
    from clonefleet.config import load_config

    # Everything that can be wrong with the request is found here, before Ray starts: config,
    # count, definition, cwd, model, and the rendering of every clone.
    config = load_config(args.config)
    print(f"clonefleet: {config_line(config)}", file=sys.stderr, flush=True)
    _check_inputs_flags(args)
    if args.inputs is not None:
        from clonefleet.cli.run import _run_inputs as run_inputs

        return run_inputs(args, config)
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


def _check_inputs_flags(args: argparse.Namespace) -> None:
    """Refuse flags that belong to --inputs without it, and --count with it."""
    if args.inputs is not None:
        if args.count is not None:
            raise UsageError(
                "--count and --inputs do not go together: --inputs runs one clone a row"
            )
        if args.detach and (args.out or args.table or args.progress_lines or args.resume):
            raise UsageError(
                "--out, --resume, --table and --progress-lines follow a run; not with --detach "
                "(the same command without --detach, with --out, collects a detached batch's "
                "records)"
            )
        if args.resume and not args.out and not args.detach:
            raise UsageError("--resume reads the records of --out; give --out FILE")
        return
    for flag in ("inputs_format", "key", "limit"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} goes with --inputs FILE")
    for flag in ("resume", "retry_failed", "include_input"):
        if getattr(args, flag):
            raise UsageError(f"--{flag.replace('_', '-')} goes with --inputs FILE")


def _plan(args: argparse.Namespace, config: Any) -> Any:
    """The checked, rendered batch of a ``run`` command line (nothing has started)."""
    from clonefleet.fleet import plan_batch

    return plan_batch(
        args.agent,
        args.prompt,
        1 if args.count is None else args.count,
        **_plan_options(args, config),
    )


def _plan_options(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The planning options of a ``run`` command line, the same for a counted batch and for
    each part of rows."""
    return {
        "config": config,
        "caller_cwd": Path.cwd(),
        "model": args.model,
        "cwd": args.cwd,
        "approve_chdir": args.allow_chdir,
        "variables": dict(args.var),
        "subagents_dirs": args.subagents_dir,
        "sim_script": args.sim_script,
        "clones_per_actor": args.clones_per_actor,
        "max_concurrency": args.max_concurrency,
        "budget_tokens": args.budget_tokens,
        "budget_usd": args.budget_usd,
    }


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
        rate_limited=dict(tally.rate_limited),
        out_path=args.out,
        embedded=fleet.embedded,
        address=None if args.address in (None, "auto") else args.address,
    )
    print_summary(make_console(), summary(end, config, table=args.table, kept=keep_failures(end)))


def _run_inputs(args: argparse.Namespace, config: Any) -> int:
    """``run AGENT --inputs FILE``: one clone per row, fed into one growing batch; each row's
    record goes to ``--out`` (and stdout with ``--json``) as it ends. The same command again
    resumes: the rows ``--out`` has are skipped, and the batch the first run left (in its
    journal, or on the cluster) is collected rather than run again (docs/inputs.md)."""
    import tempfile

    from clonefleet.cluster import resolve_address, state_dir, stop_current_session
    from clonefleet.feed import InputsRequest, InputsRun, RunLedger, run_fingerprint

    request = InputsRequest(
        inputs=args.inputs,
        inputs_format=args.inputs_format,
        key=args.key,
        limit=args.limit,
        out=args.out,
        retry_failed=args.retry_failed,
        include_input=args.include_input,
    )
    address = resolve_address(args.address)
    if args.detach and address is None:
        raise UsageError(
            "--detach needs a persistent cluster: run `clonefleet cluster up` and pass --address auto"
        )
    ledger = RunLedger(state_dir() / "inputs")
    # The address as given, not as resolved: `auto` names the cluster `cluster up` recorded,
    # whose GCS port may change over a `cluster down` and `up` (its journal does not).
    given = args.address or os.environ.get("RAY_ADDRESS") or None
    resume = _Resume(ledger, run_fingerprint(_identity(args)), given)
    config = _checkpoint_every_turn(args, config)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="clonefleet-run-") as folder:
        prepared: Any = None
        prepared = InputsRun(
            request,
            _row_planner(args, config, lambda: prepared.to_run if prepared else 0),
            agent=args.agent,
            config=config,
            spool_dir=folder,
            count_later=True,  # while Ray starts; _feed_rows waits before the first part
        )
        resume.choose(args, prepared)
        config = resume.config(config)
        run = _Run(address)
        say_outcome(run.what_became)
        try:
            try:
                return _feed_rows(args, config, prepared, address, run, resume, started)
            finally:
                if run.fleet is not None:
                    run.fleet.close()
                prepared.close()
        except KeyboardInterrupt as exc:
            stop_current_session()
            stop = as_interrupted(exc)
            print(interrupted_line(stop), file=sys.stderr)
            return stop.exit_status


def _checkpoint_every_turn(args: argparse.Namespace, config: Any) -> Any:
    """An ``--inputs`` run with ``--out`` ships each clone's checkpoint after every turn
    (``durability.checkpoint_interval_s`` 0) unless the config sets the interval: a killed run
    is resumed from its journal, and a turn whose checkpoint waited for the interval would be
    asked of the model again (docs/inputs.md, "Resuming")."""
    durability = config.durability
    if (
        not args.out
        or args.detach
        or not durability.enabled
        or "checkpoint_interval_s" in durability.model_fields_set
    ):
        return config
    every_turn = durability.model_copy(update={"checkpoint_interval_s": 0.0})
    return config.model_copy(update={"durability": every_turn})


def _identity(args: argparse.Namespace) -> dict[str, Any]:
    """What makes two ``--inputs`` commands the same run (``--out``, display and budget options
    aside): the definition, the prompt, the rows and what each clone sees."""
    inputs = args.inputs if args.inputs == "-" else str(Path(args.inputs).resolve())
    return {
        "agent": args.agent,
        "prompt": args.prompt,
        "inputs": inputs,
        "inputs_format": args.inputs_format,
        "key": args.key,
        "limit": args.limit,
        "var": sorted(args.var),
        "model": args.model,
        "cwd": args.cwd,
        "sim_script": args.sim_script,
        "subagents_dir": list(args.subagents_dir or ()),
        "config": str(Path(args.config).resolve()) if args.config else None,
    }


class _Resume:
    """Whether an ``--inputs`` command resumes the batch an earlier run of it left behind
    (the run ledger in the state folder names it), and the ledger kept up to date."""

    def __init__(self, ledger: Any, fingerprint: str, address: str | None) -> None:
        self.ledger, self.fingerprint, self.address = ledger, fingerprint, address
        self.entry: Any = None
        """The earlier run's ledger entry, when this run resumes it."""

    def choose(self, args: argparse.Namespace, prepared: Any) -> None:
        """Resume when the ledger has an entry for this command on this cluster and the run
        resumes (``--out`` existed, ``--resume``, ``--detach``, or the entry is a detached
        batch's)."""
        entry = self.ledger.find(self.fingerprint)
        if entry is None or entry.address != self.address:
            return
        if args.detach or entry.detached or args.resume or prepared.index is not None:
            self.entry = entry

    def config(self, config: Any) -> Any:
        """An embedded run resumed reopens the earlier run's journal (when it is still there),
        so its scheduler reads that batch back: ended jobs keep their records, running ones go
        on from their last checkpoints."""
        entry = self.entry
        if entry is None or self.address is not None or not config.durability.enabled:
            return config
        if not entry.journal or not Path(entry.journal).is_dir():
            self.entry = None
            return config
        durability = config.durability.model_copy(update={"journal_dir": entry.journal})
        return config.model_copy(update={"durability": durability})

    def adopt(self, fleet: Any, prepared: Any, say: Any) -> Any:
        """What the earlier run's batch holds for the rows still to do (``None``: nothing to
        resume, or the fleet no longer knows it)."""
        from clonefleet.feed import adopt

        if self.entry is None:
            return None
        batch_id = self.entry.batch_id
        adopted = adopt(fleet.iter_pages(batch=batch_id), batch_id, prepared.unrecorded)
        if adopted is None:
            say(f"batch {batch_id} of an earlier run is gone from the fleet: starting afresh")
            return None
        done = len(adopted.ended)
        say(
            f"resuming batch {batch_id}: it has {len(adopted.jobs)} of the rows to do "
            f"({done} ended, {len(adopted.jobs) - done} still to end)"
        )
        return adopted

    def record(self, batch_id: str, fleet: Any, detached: bool) -> None:
        """Note the run's batch, so the same command resumes it."""
        from clonefleet.feed import LedgerEntry

        journal = getattr(fleet, "journal_dir", None)
        entry = LedgerEntry(batch_id, self.address, journal=journal, detached=detached)
        self.ledger.record(self.fingerprint, entry)

    def forget(self) -> None:
        """The run ended: nothing is left to resume."""
        self.ledger.forget(self.fingerprint)


def _row_planner(args: argparse.Namespace, config: Any, total: Callable[[], int]) -> Any:
    """Plans one part of rows, each row failing alone (:func:`plan_rows` with the command
    line's options), its clones numbered in the whole batch of ``total()`` rows (0 until the
    file is counted)."""
    from clonefleet.planning import plan_rows

    def plan(rows: Any, batch_id: str | None, first: int) -> Any:
        return plan_rows(
            args.agent,
            args.prompt,
            rows,
            **_plan_options(args, config),
            batch_id=batch_id,
            first_index=first,
            total=max(total(), first + len(rows)),
        )

    return plan


TABLE_ROWS_MAX = 10_000
"""The most rows an ``--inputs`` run with ``--table`` keeps the records of, for the table at
its end (without ``--table``: those of a run of ``TABLE_UP_TO`` rows or fewer)."""


def _table_rows(args: argparse.Namespace, prepared: Any) -> list[dict[str, Any]] | None:
    """Where an ``--inputs`` run keeps its records for the per-row table (``None``: no table).

    Raises:
        UsageError: ``--table`` on more than :data:`TABLE_ROWS_MAX` rows (before Ray starts).
    """
    from clonefleet.cli.summary import TABLE_UP_TO

    if args.json:
        return None
    if args.table and prepared.to_run > TABLE_ROWS_MAX:
        raise UsageError(
            f"--table keeps every row's record until the run ends: at most {TABLE_ROWS_MAX:,} "
            f"rows with --inputs, and {prepared.name} has {prepared.to_run:,} to run; the "
            "summary lists the first failures, and --out FILE keeps every record (FILE.csv as "
            "a table)"
        )
    return [] if args.table or prepared.to_run <= TABLE_UP_TO else None


def _feed_rows(
    args: argparse.Namespace,
    config: Any,
    prepared: Any,
    address: str | None,
    run: _Run,
    resume: _Resume,
    started: float,
) -> int:
    """Connect, feed the rows, write each record as its row ends, and end with the summary,
    counted as the rows end (nothing kept per row but the table's records, when it has one);
    0 when every row's record (those skipped included) is a success."""
    from clonefleet.cli.progress import RowsView
    from clonefleet.cli.summary import FailureSpill, RunTotals
    from clonefleet.feed import ahead_for
    from clonefleet.fleet import Fleet

    table = _table_rows(args, prepared)
    say = _say(args)
    if prepared.counted:  # else nothing is skipped, and the rows are counted while Ray starts
        if prepared.skipped_failed or prepared.total != prepared.to_run:
            done = prepared.total - prepared.to_run
            say(f"{done} of {prepared.total} rows already have a record in {args.out}: skipped")
        if prepared.to_run == 0:
            say("nothing to run")
            resume.forget()
            return EXIT_OK if _all_done_succeeded(prepared) else EXIT_FAILED
    fleet = run.fleet = Fleet(address, config=config)
    fleet.wait_margin_s = FOLLOW_MARGIN_S
    prepared.wait_counted()  # a duplicate key is a usage error here: nothing was submitted
    if prepared.to_run == 0:
        say("nothing to run")
        resume.forget()
        return EXIT_OK
    adopted = resume.adopt(fleet, prepared, say)
    if args.detach:
        return _submit_rows(args, prepared, fleet, run, resume, adopted)
    cap = args.max_concurrency or config.limits.max_concurrency
    feeder = prepared.feeder(fleet, ahead_for(cap), adopted=adopted, adaptive=True)
    feeder.start()
    submitted = time.monotonic()
    run.batch_id = feeder.batch_id
    if feeder.batch_id is not None and args.out:
        resume.record(feeder.batch_id, fleet, detached=False)
    say(f"batch {feeder.batch_id}: {prepared.to_run} rows of {prepared.name}")
    totals = RunTotals()
    spill = None
    if not args.json and args.out is None and fleet.embedded:
        spill = FailureSpill(feeder.batch_id or "rows")
    live = sys.stderr.isatty() and not args.progress_lines
    view = None if args.json else RowsView(prepared.to_run, live=live)
    try:
        for item in feeder.run():
            run.batch_id = feeder.batch_id
            record = item.record
            if prepared.writer is not None:
                prepared.writer.write(record, item.row)
            if args.json:
                out = dict(record)
                if args.include_input:
                    out["input"] = item.row
                print(json.dumps(out, default=str), flush=True)
            totals.add(record)
            if view is not None:
                view.ended(record)
            if spill is not None and not succeeded(record):
                spill.add(record)
            if table is not None:
                table.append(record)
    finally:
        if view is not None:
            view.close()
        kept = spill.close() if spill is not None else None
        if kept is not None and sys.exc_info()[0] is not None:
            kept.unlink(missing_ok=True)  # interrupted: no summary names it
    run.ended = True
    if totals.ended == prepared.to_run:
        resume.forget()  # every row ended: nothing is left to resume
    if feeder.adopted:
        say(f"{feeder.adopted} of the rows came from the earlier run's batch {feeder.batch_id}")
    ok = totals.failed == 0 and totals.ended == prepared.to_run and prepared.skipped_failed == 0
    if args.json:
        say(
            f"{totals.ended} rows ran: {totals.ended - totals.failed} succeeded, "
            f"{totals.failed} failed" + (f"; records in {args.out}" if args.out else "")
        )
    else:
        from clonefleet.cli.summary import print_summary, summary

        now = time.monotonic()
        if table:  # in row order; the rows that could not be read (no clone index) last
            table.sort(key=lambda r: (r["clone_index"] is None, r["clone_index"] or 0))
        end = _rows_end(
            args, fleet, prepared, records=table or (), totals=totals,
            batch_id=feeder.batch_id or "", elapsed_s=now - started, ran_s=now - submitted,
        )  # fmt: skip
        print_summary(make_console(), summary(end, config, kept=kept))
    return EXIT_OK if ok else EXIT_FAILED


def _submit_rows(
    args: argparse.Namespace, prepared: Any, fleet: Any, run: _Run, resume: _Resume, adopted: Any
) -> int:
    """``--inputs --detach``: submit every row to the cluster (the rows an earlier run of the
    command submitted are skipped), print the batch id and return; 0 when every row went in."""
    from clonefleet.feed import DEFAULT_AHEAD

    say = _say(args)
    if adopted is not None and not adopted.open:
        say(f"batch {adopted.batch_id} has every row already (an earlier run closed it)")
        _print_detached(args, adopted.batch_id, 0, len(adopted.jobs), 0)
        return EXIT_OK
    # Nothing is kept per job; `ahead` only sizes the parts (a slice each, not a row each).
    feeder = prepared.feeder(fleet, ahead=DEFAULT_AHEAD, adopted=adopted, follow=False)
    feeder.start()
    run.batch_id = feeder.batch_id
    if feeder.batch_id is not None:
        resume.record(feeder.batch_id, fleet, detached=True)
    failed = 0
    for item in feeder.submit_all():
        if run.batch_id is None and feeder.batch_id is not None:
            run.batch_id = feeder.batch_id
            resume.record(run.batch_id, fleet, detached=True)
        failed += 1
        record = item.record
        print(f"clonefleet: row {record.get('key')}: {record.get('error')}", file=sys.stderr)
    run.batch_id = feeder.batch_id
    _print_detached(args, feeder.batch_id, feeder.submitted, feeder.adopted, failed)
    return EXIT_OK if failed == 0 else EXIT_FAILED


def _print_detached(
    args: argparse.Namespace, batch_id: str | None, submitted: int, adopted: int, failed: int
) -> None:
    """The line (or JSON object) a detached ``--inputs`` run ends with."""
    if args.json:
        out = {"batch_id": batch_id, "submitted": submitted, "adopted": adopted, "failed": failed}
        print(json.dumps(out), flush=True)
        return
    parts = [f"{submitted} rows submitted"]
    if adopted:
        parts.append(f"{adopted} already in it")
    if failed:
        parts.append(f"{failed} failed without running")
    print(f"batch {batch_id}: " + ", ".join(parts), flush=True)


def _rows_end(args: argparse.Namespace, fleet: Any, prepared: Any, **end: Any) -> Any:
    """The :class:`~clonefleet.cli.summary.RunEnd` of an ``--inputs`` run: ``end`` its
    records (for the table), totals, batch id and times."""
    from clonefleet.cli.summary import RunEnd

    return RunEnd(
        total=prepared.to_run,
        out_path=args.out,
        embedded=fleet.embedded,
        address=None if args.address in (None, "auto") else args.address,
        unit="rows",
        skipped=prepared.skipped,
        skipped_failed=prepared.skipped_failed,
        **end,
    )


def _all_done_succeeded(prepared: Any) -> bool:
    """Whether no row skipped as done had a failed record (read the rows to count them)."""
    for _ in prepared.rows():
        pass
    return bool(prepared.skipped_failed == 0)


def _say(args: argparse.Namespace) -> Any:
    """Print a progress line on stderr (``clonefleet: ...``)."""

    def say(text: str) -> None:
        print(f"clonefleet: {text}", file=sys.stderr, flush=True)

    return say
