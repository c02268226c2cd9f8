"""``clonefleet jobs list|status|result|cancel|wait``: jobs on a persistent cluster, or read
from its journal when none runs (docs/cli.md, docs/json.md).

Every call has a deadline: ``jobs wait --timeout T`` returns within ``T`` + 2 s even when the
scheduler is frozen. ``jobs list`` prints one page of the table with the usage totals, or with
``--json`` streams every job as one JSON object, page by page; both end with the fleet's
rate limits per provider and model.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clonefleet.cli.cluster import add_address_options, connect, journal_dir
from clonefleet.cli.console import EXIT_FAILED, EXIT_OK, make_console, print_result, whole_number
from clonefleet.cli.summary import cache_share
from clonefleet.config import printable
from clonefleet.errors import ClonefleetError
from clonefleet.vocab import succeeded

if TYPE_CHECKING:
    from clonefleet.fleet import Fleet

__all__ = [
    "HUMAN_PAGE",
    "OFFLINE_COMMANDS",
    "STREAM_PAGE",
    "add_jobs_parser",
    "cmd_jobs",
    "dollars",
    "jobs_table",
    "rate_limits_table",
    "read_rate_limits",
    "stream_listing",
    "totals_lines",
]

WAIT_OVER_S = 2.0
"""``jobs wait --timeout T`` returns at most this long after ``T`` (from the command's start)."""
EXIT_RESERVE_S = 1.5
"""Of that, what disconnecting and the interpreter's exit are given."""

HUMAN_PAGE = 100
"""Jobs ``jobs list`` shows in its table unless ``--limit`` says otherwise."""
STREAM_PAGE = 1000
"""Jobs per reply while ``jobs list --json`` streams a whole listing."""


def add_jobs_parser(sub: Any) -> None:
    """Register ``clonefleet jobs`` on the command line's sub-parsers."""
    jobs = sub.add_parser(
        "jobs", help="list, inspect, cancel and wait for jobs on a running cluster"
    )
    jsub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    _add_list_parser(jsub)
    for name, text in (
        ("status", "status of jobs"),
        ("result", "result of finished jobs"),
        ("cancel", "cancel jobs or batches (and their descendants)"),
    ):
        p = jsub.add_parser(name, help=text)
        p.add_argument("ids", nargs="+", metavar="JOB|BATCH")
        add_address_options(p)
    wait = jsub.add_parser("wait", help="wait for jobs or batches to finish")
    wait.add_argument("ids", nargs="+", metavar="JOB|BATCH")
    wait.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait (default 3600)"
    )
    add_address_options(wait)


def _add_list_parser(jsub: Any) -> None:
    lst = jsub.add_parser(
        "list", help="jobs with status and usage, plus slots in use, queued jobs and totals"
    )
    for flag in ("--status", "--batch", "--agent", "--parent"):
        lst.add_argument(flag)
    lst.add_argument(
        "--key", metavar="K", help="only the jobs of the dataset row with key K (run --inputs)"
    )
    lst.add_argument(
        "--limit",
        type=whole_number(1),
        metavar="N",
        help=f"one page of at most N jobs (default: {HUMAN_PAGE} in the table; with --json, "
        "every job, streamed page by page)",
    )
    lst.add_argument("--cursor", metavar="C", help="start where a page ended (its next cursor)")
    add_address_options(lst)


def cmd_jobs(args: argparse.Namespace) -> int:
    """Run one ``jobs`` action on the cluster, or on the journal when no cluster runs."""
    options: dict[str, Any] = {}
    if args.jobs_command == "wait":
        # One deadline for the whole command, counted from the process's start: connecting to a
        # frozen scheduler fails by then as well as waiting on one.
        args.wait_until = _started_at() + max(args.timeout, 0.0)
        hard = args.wait_until + WAIT_OVER_S - EXIT_RESERVE_S
        options = {
            "call_timeout_s": min(max(hard - time.monotonic(), 1.0), 30.0),
            "wait_margin_s": WAIT_OVER_S - EXIT_RESERVE_S,
        }
    view = _offline_view(args)
    if view is not None:
        return _JOBS[args.jobs_command](view, args)
    fleet = connect(args.address, **options)
    try:
        return _JOBS[args.jobs_command](fleet, args)
    finally:
        fleet.close()


OFFLINE_COMMANDS = ("list", "status", "result")
"""``jobs`` commands answered from the journal on disk when no cluster runs."""


def _offline_view(args: argparse.Namespace) -> Any:
    """A read-only view of the journal when no cluster runs and none was named (else ``None``);
    says on stderr that the answer comes from the journal."""
    from clonefleet.cluster import read_state
    from clonefleet.scheduler import JournalView

    if args.jobs_command not in OFFLINE_COMMANDS or args.address or os.environ.get("RAY_ADDRESS"):
        return None
    folder = journal_dir()
    if read_state() is not None or not folder.is_dir():
        return None
    view = JournalView(folder)
    print(
        f"clonefleet: no cluster is running; read from the journal at {folder} (jobs that had not"
        " ended resume on the next `clonefleet cluster up`)",
        file=sys.stderr,
    )
    for damage in view.damage:
        print(f"clonefleet: journal damage: {damage}", file=sys.stderr)
    return view


def _started_at() -> float:
    """When this process started, on the ``time.monotonic`` clock (now where ``/proc`` cannot
    say): the interpreter's start and imports count against ``--timeout`` too."""
    try:
        # Field 22 of /proc/self/stat, counted after the command name (which may hold spaces).
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        age_s = uptime_s - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        age_s = 0.0
    return time.monotonic() - min(max(age_s, 0.0), 10.0)


def _jobs_list(fleet: Fleet, args: argparse.Namespace) -> int:
    filters: dict[str, Any] = {
        "status": args.status,
        "batch": args.batch,
        "agent": args.agent,
        "parent": args.parent,
        "key": args.key,
    }
    if args.json:
        return stream_listing(fleet, filters, args.cursor, args.limit)
    page = fleet.list_jobs(**filters, cursor=args.cursor, limit=args.limit or HUMAN_PAGE)
    console = make_console()
    console.print(jobs_table(page["jobs"]))
    for line in totals_lines(dict(page["totals"])):
        console.print(line, markup=False, highlight=False)
    cap = page["capacity"]
    console.print(
        f"slots in use: {cap['running']} of {cap['max_concurrency'] or 'unlimited'}; queued: {cap['queued']}"
    )
    if page["next_cursor"] is not None:
        flags = "".join(f" --{k} {shlex.quote(v)}" for k, v in filters.items() if v is not None)
        more = f"clonefleet jobs list{flags} --cursor {page['next_cursor']}"
        console.print(f"more jobs: {more} --limit {args.limit or HUMAN_PAGE}", markup=False)
    limits = read_rate_limits(fleet)
    if limits:
        console.print(rate_limits_table(limits))
    return EXIT_OK


def _jobs_status(fleet: Fleet, args: argparse.Namespace) -> int:
    for job_id in fleet.expand(args.ids):
        s = fleet.job_status(job_id)
        why = f" ({s['detail']})" if s.get("detail") else ""
        cause = s.get("cause")
        if isinstance(cause, dict) and cause.get("summary"):
            # The provider's words: shown printable (no terminal escapes), like the summary's.
            why += (
                f" cause: {printable(str(cause['summary']))} ({cause.get('attempts', 0)} attempts)"
            )
        usage = s["usage"]
        spent = f"tokens={usage.get('total_tokens', 0)} cost={dollars(s.get('cost_usd'))}"
        if usage.get("cache_read_tokens"):
            spent += f" cached={usage['cache_read_tokens']}"
        print_result(
            s,
            args.json,
            f"{s['job_id']} {s['display_name']}: {s['status']} outcome={s['outcome']} model={s['model']} turns={s['turns']} {spent}{why}",
        )
    return EXIT_OK


def _jobs_result(fleet: Fleet, args: argparse.Namespace) -> int:
    code = EXIT_OK
    for job_id in fleet.expand(args.ids):
        r = fleet.job_result(job_id)
        print_result(
            r,
            args.json,
            f"{r['job_id']}: {r['status']} {r['error'] or json.dumps(r['result'], default=str)}",
        )
        code |= not succeeded(r)
    return code


def _jobs_cancel(fleet: Fleet, args: argparse.Namespace) -> int:
    ids = fleet.expand(args.ids)
    running = fleet.cancel_many(args.ids)
    print_result(
        {"jobs": len(ids), "running_cancelled": running},
        args.json,
        f"cancel requested for {len(ids)} job(s) and their descendants ({running} were running)",
    )
    return EXIT_OK


def _jobs_wait(fleet: Fleet, args: argparse.Namespace) -> int:
    left_s = max(args.wait_until - time.monotonic(), 0.0)
    out = fleet.job_block(args.ids, timeout_seconds=left_s)
    for s in out["jobs"]:
        print_result(s, args.json, f"{s['job_id']}: {s['status']} outcome={s['outcome']}")
    ok = out["done"] and all(succeeded(s) for s in out["jobs"])
    if not out["done"]:
        print(
            f"clonefleet: timed out after {args.timeout:g}s with jobs still running",
            file=sys.stderr,
        )
    return EXIT_OK if ok else EXIT_FAILED


_JOBS = {
    "list": _jobs_list,
    "status": _jobs_status,
    "result": _jobs_result,
    "cancel": _jobs_cancel,
    "wait": _jobs_wait,
}


# -- what `jobs list` prints -------------------------------------------------------------
def jobs_table(jobs: list[dict[str, Any]]) -> Any:
    """The rich table of one page of jobs; a ``key`` column when a job of the page has a row
    key (a batch mapped over a dataset)."""
    from rich.markup import escape
    from rich.table import Table

    keyed = any(j.get("key") is not None for j in jobs)
    table = Table()
    for col in (
        "job",
        "batch",
        "agent",
        "clone",
        *(("key",) if keyed else ()),
        "status",
        "outcome",
        "model",
        "parent",
        "tokens",
        "cost",
        "progress",
    ):
        table.add_column(col, no_wrap=True)
    for j in jobs:
        progress = (
            (j["progress"] or {}).get("summary", "") if isinstance(j["progress"], dict) else ""
        )
        key = j.get("key")
        table.add_row(
            j["job_id"],
            j["batch_id"],
            j["agent"],
            str(j["clone_index"]),
            *((escape(printable("" if key is None else str(key))[:40]),) if keyed else ()),
            j["status"],
            str(j["outcome"] or ""),
            str(j["model"]),
            str(j["parent"] or ""),
            f"{j['usage'].get('total_tokens', 0):,}",
            dollars(j.get("cost_usd")),
            progress[:40],
        )
    return table


def read_rate_limits(source: Any) -> list[dict[str, Any]]:
    """The fleet's rate-limit rows (``Fleet.rate_limits``); none from a journal read offline,
    or when the scheduler does not answer (the jobs are still listed)."""
    read = getattr(source, "rate_limits", None)
    if not callable(read):
        return []
    try:
        rows = read()
    except ClonefleetError:
        return []
    return [r for r in rows if isinstance(r, dict)]


def _now_of(now: Any, limit: Any) -> str:
    """``1,102 / 1,140``, or ``1,102 / -`` with no limit."""
    return f"{float(now or 0):,.0f} / " + ("-" if limit is None else f"{float(limit):,.0f}")


_RATE_COLUMNS = (
    "provider/model",
    "rpm now / limit",
    "tpm now / limit",
    "source",
    "waiting",
    "in flight",
    "429s (last min)",
)
_WORDS = frozenset({"provider/model", "source"})


def rate_limits_table(rows: list[dict[str, Any]]) -> Any:
    """The rich table of the fleet's rate limits: one row per provider and model scope
    (docs/json.md, "Rate limits")."""
    from rich.table import Table

    from clonefleet.cli.progress import scope_label

    table = Table(title="rate limits", title_justify="left")
    for col in _RATE_COLUMNS:
        table.add_column(col, no_wrap=True, justify="left" if col in _WORDS else "right")
    for r in rows:
        most = r.get("max_in_flight")
        in_flight = f"{int(r.get('in_flight') or 0):,}" + ("" if most is None else f" / {most:,}")
        table.add_row(
            scope_label(r),
            _now_of(r.get("rpm_now"), r.get("rpm_limit")),
            _now_of(r.get("tpm_now"), r.get("tpm_limit")),
            printable(str(r.get("source") or "none")),
            f"{int(r.get('waiting') or 0):,}",
            in_flight,
            f"{int(r.get('rate_limited') or 0):,} ({int(r.get('rate_limited_last_min') or 0):,})",
        )
    return table


def dollars(cost: float | None) -> str:
    """``$0.0123``, or ``-`` for an unknown cost."""
    return "-" if cost is None else f"${cost:,.4f}"


def totals_lines(totals: dict[str, Any]) -> list[str]:
    """One line per batch of the page and one for the fleet: tokens, the share of input read
    from the prompt cache (when some was), cost and budget."""

    def usage(t: dict[str, Any]) -> str:
        read = t.get("cache_read_tokens") or 0
        cached = f", cached {cache_share(read, t['input_tokens'])}" if read else ""
        line = (
            f"{t['total_tokens']:,} tokens (in {t['input_tokens']:,}{cached},"
            f" out {t['output_tokens']:,}), cost {dollars(t['cost_usd'])}"
        )
        if t["unpriced_tokens"] and t["cost_usd"] is not None:
            line += f" (+{t['unpriced_tokens']:,} tokens on models without a price)"
        return line

    lines = []
    for batch_id, t in totals["batches"].items():
        line = f"batch {batch_id}: {t['jobs']:,} jobs, {usage(t)}"
        budget = t.get("budget")
        if budget:
            limits = [f"{budget['budget_tokens']:,} tokens"] if budget["budget_tokens"] else []
            if budget["budget_usd"] is not None:
                limits.append(f"${budget['budget_usd']:,.4f}")
            state = "passed: stopped" if budget["passed"] else "not passed"
            line += f"; budget {' or '.join(limits)} ({state})"
        lines.append(line)
    lines.append(f"fleet: {usage(totals['fleet'])}")
    return lines


def stream_listing(
    source: Any, filters: dict[str, Any], cursor: str | None, limit: int | None
) -> int:
    """``jobs list --json``: one JSON object (``docs/json.md``), written as its pages arrive, so
    no reply and no buffer holds every job; with ``limit``, that one page and its cursor."""
    query = {**filters, "cursor": cursor, "limit": limit or STREAM_PAGE}
    batches: dict[str, Any] = {}
    sep = "\n"
    sys.stdout.write('{"jobs": [')
    while True:
        page = source.list_jobs(**query)
        for job in page["jobs"]:
            sys.stdout.write(sep + json.dumps(job, default=str))
            sep = ",\n"
        batches.update(page["totals"]["batches"])
        if limit is not None or page["next_cursor"] is None:
            break
        query["cursor"] = page["next_cursor"]
    tail = {
        "capacity": page["capacity"],
        "totals": {"fleet": page["totals"]["fleet"], "batches": batches},
        "next_cursor": page["next_cursor"],
        "rate_limits": read_rate_limits(source),
    }
    sys.stdout.write("\n], " + json.dumps(tail, default=str)[1:] + "\n")
    return 0
