"""Command-line job control: ``clonefleet jobs``, ``clonefleet events`` and ``clonefleet cluster``.

These commands talk to a persistent cluster (``clonefleet cluster up`` or ``--address``); an
embedded Ray instance ends with the command that started it, so there is nothing to control.
They only call the scheduler actor, so they send no package to the cluster, and every call has a
deadline: ``jobs wait --timeout T`` returns within ``T`` + 2 s even when the scheduler is frozen.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clonefleet.cli.listing import HUMAN_PAGE, dollars, jobs_table, stream_listing, totals_lines
from clonefleet.errors import ClonefleetError, ClusterError, UsageError
from clonefleet.vocab import EVENT_LEVELS, EventType, succeeded

if TYPE_CHECKING:
    from clonefleet.fleet import Fleet

__all__ = ["add_control_parsers", "connect", "make_console", "CONTROL_HANDLERS"]

EXIT_OK, EXIT_FAILED = 0, 1
WAIT_OVER_S = 2.0
"""``jobs wait --timeout T`` returns at most this long after ``T`` (from the command's start)."""
EXIT_RESERVE_S = 1.5
"""Of that, what disconnecting and the interpreter's exit are given."""
EVENT_PAGE = 5000
"""Most events one reply of the scheduler holds."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more, got {text[:40]!r}")
    return value


def make_console() -> Any:
    """A rich console; piped output gets a fixed wide width instead of 80 squeezed columns."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def _address_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        help="Ray address (default: the cluster `clonefleet cluster up` started, or RAY_ADDRESS)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def add_control_parsers(sub: Any) -> None:
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
        _address_arg(p)
    wait = jsub.add_parser("wait", help="wait for jobs or batches to finish")
    wait.add_argument("ids", nargs="+", metavar="JOB|BATCH")
    wait.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds to wait (default 3600)"
    )
    _address_arg(wait)
    _add_events_parser(sub)

    msg = sub.add_parser(
        "message",
        help="send a message to a running job's clone (taken at its next turn boundary)",
        description=(
            "Queue TEXT for job JOB: it enters the clone's context as a user message at its next "
            "turn boundary. Exits 0 once queued (on disk), 2 for an unknown or finished job, a "
            "refused @skill: reference or a full queue, 1 when the cluster cannot be reached. "
            "With --status ID, shows what became of a delivery: queued, delivered or undelivered."
        ),
    )
    msg.add_argument("job", nargs="?", metavar="JOB")
    msg.add_argument("text", nargs="?", metavar="TEXT")
    msg.add_argument("--status", metavar="DELIVERY_ID", help="show a delivery's state instead")
    _address_arg(msg)

    cl = sub.add_parser("cluster", help="a persistent local Ray cluster on 127.0.0.1")
    csub = cl.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    up = csub.add_parser("up", help="start a head (and --nodes - 1 worker nodes) on this machine")
    up.add_argument("--nodes", type=int, default=1)
    up.add_argument("--cpus-per-node", type=int)
    up.add_argument("--port", type=int, help="GCS port of the head (default: a free one)")
    up.add_argument("--json", action="store_true")
    down = csub.add_parser("down", help="stop the cluster `up` started")
    down.add_argument("--json", action="store_true")
    st = csub.add_parser("status", help="address and nodes of the running cluster")
    st.add_argument("--json", action="store_true")


def _add_list_parser(jsub: Any) -> None:
    lst = jsub.add_parser(
        "list", help="jobs with status and usage, plus slots in use, queued jobs and totals"
    )
    for flag in ("--status", "--batch", "--agent", "--parent"):
        lst.add_argument(flag)
    lst.add_argument(
        "--limit",
        type=_positive,
        metavar="N",
        help=f"one page of at most N jobs (default: {HUMAN_PAGE} in the table; with --json, "
        "every job, streamed page by page)",
    )
    lst.add_argument("--cursor", metavar="C", help="start where a page ended (its next cursor)")
    _address_arg(lst)


def _add_events_parser(sub: Any) -> None:
    ev = sub.add_parser("events", help="read a batch's or job's events (subagent_event envelopes)")
    ev.add_argument("target", metavar="BATCH|JOB")
    ev.add_argument("--follow", action="store_true", help="keep reading until every job has ended")
    ev.add_argument("--level", choices=tuple(EVENT_LEVELS), default="lifecycle")
    ev.add_argument(
        "--cursor",
        type=int,
        default=0,
        help="start at this event number (an envelope's `seq` + 1 continues after it); older "
        "events the scheduler spilled to its journal are read from there",
    )
    ev.add_argument(
        "--limit",
        type=_positive,
        metavar="N",
        help="print at most N events, then the --cursor that continues (on stderr)",
    )
    _address_arg(ev)


def connect(address: str | None, **options: Any) -> Fleet:
    """A job-control :class:`Fleet` on a persistent cluster: ``address``, else the cluster
    ``clonefleet cluster up`` recorded, else ``RAY_ADDRESS``. It sends no package to the cluster
    (it only calls the scheduler actor); ``options`` go to :class:`Fleet`.

    Raises:
        UsageError: no address given and no cluster recorded.
        ClusterError: the cluster does not answer.
    """
    from clonefleet.cluster import read_state
    from clonefleet.fleet import Fleet

    if address is None:
        recorded = read_state()
        address = "auto" if recorded else os.environ.get("RAY_ADDRESS") or None
    if address is None:
        raise UsageError(
            "no running clonefleet cluster: start one with `clonefleet cluster up`, or pass --address"
        )
    return Fleet(address, ship_package=False, **options)


def _print(obj: Any, as_json: bool, human: str) -> None:
    print(json.dumps(obj, default=str) if as_json else human)


def cmd_jobs(args: argparse.Namespace) -> int:
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


def journal_dir() -> Path:
    """The journal of the cluster ``cluster up`` starts: ``durability.journal_dir`` of the
    config found here, else ``journal/`` in the state folder."""
    from clonefleet.cluster import state_dir
    from clonefleet.config import load_config
    from clonefleet.scheduler import journal_folder

    try:
        configured = load_config(None, Path.cwd()).durability.journal_dir
    except ClonefleetError:
        configured = None
    return Path(journal_folder(configured, embedded=False, base=state_dir()))


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
        flags = "".join(f" --{k} {v}" for k, v in filters.items() if v is not None)
        more = f"clonefleet jobs list{flags} --cursor {page['next_cursor']}"
        console.print(f"more jobs: {more} --limit {args.limit or HUMAN_PAGE}", markup=False)
    return EXIT_OK


def _jobs_status(fleet: Fleet, args: argparse.Namespace) -> int:
    for job_id in fleet.expand(args.ids):
        s = fleet.job_status(job_id)
        why = f" ({s['detail']})" if s.get("detail") else ""
        spent = f"tokens={s['usage'].get('total_tokens', 0)} cost={dollars(s.get('cost_usd'))}"
        _print(
            s,
            args.json,
            f"{s['job_id']} {s['display_name']}: {s['status']} outcome={s['outcome']} model={s['model']} turns={s['turns']} {spent}{why}",
        )
    return EXIT_OK


def _jobs_result(fleet: Fleet, args: argparse.Namespace) -> int:
    code = EXIT_OK
    for job_id in fleet.expand(args.ids):
        r = fleet.job_result(job_id)
        _print(
            r,
            args.json,
            f"{r['job_id']}: {r['status']} {r['error'] or json.dumps(r['result'], default=str)}",
        )
        code |= not succeeded(r)
    return code


def _jobs_cancel(fleet: Fleet, args: argparse.Namespace) -> int:
    ids = fleet.expand(args.ids)
    running = fleet.cancel_many(args.ids)
    _print(
        {"jobs": len(ids), "running_cancelled": running},
        args.json,
        f"cancel requested for {len(ids)} job(s) and their descendants ({running} were running)",
    )
    return EXIT_OK


def _jobs_wait(fleet: Fleet, args: argparse.Namespace) -> int:
    left_s = max(args.wait_until - time.monotonic(), 0.0)
    out = fleet.job_block(args.ids, timeout_seconds=left_s)
    for s in out["jobs"]:
        _print(s, args.json, f"{s['job_id']}: {s['status']} outcome={s['outcome']}")
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


def describe(env: dict[str, Any]) -> str:
    """One human line for an envelope (nested envelopes shown as a path of display names)."""
    names = [env["display_name"]]
    event = env["event"]
    while event.get("type") == EventType.ENVELOPE:
        names.append(event["display_name"])
        event = event["event"]
    detail = {k: v for k, v in event.items() if k not in ("type", "ts", "record")}
    return f"{' > '.join(names)} [{env['subagent_run_id']}] {event['type']} {json.dumps(detail, default=str)[:200]}"


def cmd_events(args: argparse.Namespace) -> int:
    if args.cursor < 0:
        raise UsageError("--cursor is an event number, 0 or more")
    fleet = connect(args.address)
    try:
        page = min(args.limit, EVENT_PAGE) if args.limit else None
        source = (
            fleet.follow(args.target, level=args.level, cursor=args.cursor)
            if args.follow
            else fleet.history(args.target, level=args.level, cursor=args.cursor, page=page)
        )
        shown = 0
        for env in source:
            print(json.dumps(env, default=str) if args.json else describe(env), flush=True)
            shown += 1
            if args.limit is not None and shown >= args.limit:
                print(
                    f"clonefleet: {shown} event(s) shown; more may follow: --cursor {env['seq'] + 1}",
                    file=sys.stderr,
                )
                break
    finally:
        fleet.close()
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    from clonefleet.cluster import cluster_down, cluster_up, dead_daemon_state, read_state

    if args.cluster_command == "up":
        print(
            f"clonefleet: starting a local cluster with {args.nodes} node(s) on 127.0.0.1 ...",
            file=sys.stderr,
            flush=True,
        )
        state = cluster_up(nodes=args.nodes, cpus_per_node=args.cpus_per_node, port=args.port)
        _resume_unfinished(args.json)
        _print(
            state,
            args.json,
            f"cluster up at {state['address']} ({state['nodes']} node(s)); `clonefleet run --detach --address auto ...` uses it",
        )
        return EXIT_OK
    if args.cluster_command == "down":
        ending: list[int | None] = []
        died = dead_daemon_state()
        stopped = cluster_down(
            announce=lambda n: _say_ending(_unfinished_jobs(n), ending, args.json)
        )
        human = "cluster stopped" if stopped else "no cluster was running"
        if stopped and died is not None:
            human = (
                f"cluster ended: its daemon (pid {died['pid']}) had died; what it left was killed"
            )
        _print(
            {
                "stopped": stopped,
                "running_jobs_ended": ending[0] if ending else None,
                "daemon_had_died": died is not None,
            },
            args.json,
            human,
        )
        return EXIT_OK
    found = read_state()
    if found is None:
        died = dead_daemon_state()
        human = (
            f"the clonefleet cluster's daemon (pid {died['pid']}) died; "
            "`clonefleet cluster down` ends what is left of it"
            if died is not None
            else "no clonefleet cluster is running"
        )
        _print({"running": False, "daemon_died": died is not None}, args.json, human)
        return EXIT_FAILED
    _print(
        {"running": True, **found},
        args.json,
        f"running at {found['address']} with {found['nodes']} node(s), pid {found['pid']}",
    )
    return EXIT_OK


def _resume_unfinished(as_json: bool) -> None:
    """Start the scheduler at once when the journal holds jobs that had not ended, so they
    resume now rather than at the next command."""
    waiting = _unfinished_jobs(None)
    if not waiting:
        return
    if not as_json:
        print(
            f"clonefleet: resuming {waiting} unfinished job(s) from the journal",
            file=sys.stderr,
            flush=True,
        )
    connect("auto").close()


def _unfinished_jobs(known: int | None) -> int | None:
    """How many jobs of the cluster's journal have not ended (read from disk: no Ray)."""
    if known is not None:
        return known
    from clonefleet.scheduler import JournalView

    folder = journal_dir()
    if not folder.is_dir():
        return None
    return len(JournalView(folder).table.unfinished())


def _say_ending(running: int | None, seen: list[int | None], as_json: bool) -> None:
    seen.append(running)
    if running is not None and not as_json:
        print(
            f"clonefleet: ending {running} unfinished job(s); they resume on the next"
            " `clonefleet cluster up`",
            file=sys.stderr,
            flush=True,
        )


def cmd_message(args: argparse.Namespace) -> int:
    if args.status is None and (args.job is None or args.text is None):
        raise UsageError("give JOB and TEXT, or --status DELIVERY_ID")
    if args.status is not None and args.job is not None:
        raise UsageError("--status takes a delivery id alone, without JOB or TEXT")
    try:
        fleet = connect(args.address)
    except UsageError as exc:  # no cluster to reach: exit 1, not a usage error
        raise ClusterError(str(exc)) from None
    try:
        if args.status is not None:
            out = fleet.delivery(args.status)
            _print(out, args.json, f"{out['delivery_id']}: {out['status']} (job {out['job_id']})")
            return EXIT_OK
        out = fleet.message(args.job, args.text)
        _print(out, args.json, f"{out['delivery_id']}: {out['status']}")
        return EXIT_OK
    finally:
        fleet.close()


CONTROL_HANDLERS = {
    "jobs": cmd_jobs,
    "events": cmd_events,
    "cluster": cmd_cluster,
    "message": cmd_message,
}
