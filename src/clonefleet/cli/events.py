"""``clonefleet events``: a batch's or job's events (``subagent_event`` envelopes) from a
persistent cluster, one line each or as JSON; ``--follow`` reads until every job has ended
(docs/cli.md, docs/json.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from clonefleet.cli.cluster import add_address_options, connect
from clonefleet.cli.console import EXIT_OK, whole_number
from clonefleet.config import printable
from clonefleet.errors import UsageError
from clonefleet.vocab import EVENT_LEVELS, EventType

__all__ = ["EVENT_PAGE", "add_events_parser", "cmd_events", "describe", "rate_limited_text"]

EVENT_PAGE = 5000
"""Most events one reply of the scheduler holds."""


def add_events_parser(sub: Any) -> None:
    """Register ``clonefleet events`` on the command line's sub-parsers."""
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
        type=whole_number(1),
        metavar="N",
        help="print at most N events, then the --cursor that continues (on stderr)",
    )
    add_address_options(ev)


def describe(env: dict[str, Any]) -> str:
    """One human line for an envelope (nested envelopes shown as a path of display names)."""
    names = [env["display_name"]]
    event = env["event"]
    while event.get("type") == EventType.ENVELOPE:
        names.append(event["display_name"])
        event = event["event"]
    if event.get("type") == EventType.RATE_LIMITED:
        said = rate_limited_text(event)
    else:
        detail = {k: v for k, v in event.items() if k not in ("type", "ts", "record")}
        said = json.dumps(detail, default=str)[:200]
    return f"{' > '.join(names)} [{env['subagent_run_id']}] {event['type']} {said}"


def rate_limited_text(event: dict[str, Any]) -> str:
    """A ``rate_limited`` event in words: ``HTTP 429 from p on sim-small; retry after 2.0s; the
    request waits for capacity`` (printable, bounded)."""
    status = event.get("status")
    where = printable(str(event.get("provider") or "the provider"))[:100]
    text = (
        f"HTTP {printable(str(status))[:20]} from {where}"
        if status is not None
        else f"refused by {where}"
    )
    if event.get("model"):
        text += f" on {printable(str(event['model']))[:100]}"
    wait = event.get("retry_after_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool):
        text += f"; retry after {wait:.1f}s"
    return text + "; the request waits for capacity"


def cmd_events(args: argparse.Namespace) -> int:
    """Print the target's events from ``--cursor`` on, at most ``--limit``, following with
    ``--follow``."""
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
