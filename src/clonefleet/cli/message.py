"""``clonefleet message``: queue a message for a running job's clone, taken at its next turn
boundary, or show what became of one delivery (docs/cli.md)."""

from __future__ import annotations

import argparse
from typing import Any

from clonefleet.cli.cluster import add_address_options, connect
from clonefleet.cli.console import EXIT_OK, print_result
from clonefleet.errors import ClusterError, UsageError

__all__ = ["add_message_parser", "cmd_message"]


def add_message_parser(sub: Any) -> None:
    """Register ``clonefleet message`` on the command line's sub-parsers."""
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
    add_address_options(msg)


def cmd_message(args: argparse.Namespace) -> int:
    """Queue a message for a job, or show a delivery's state (``--status``)."""
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
            print_result(
                out, args.json, f"{out['delivery_id']}: {out['status']} (job {out['job_id']})"
            )
            return EXIT_OK
        try:
            out = fleet.message(args.job, args.text)
        except ClusterError as exc:
            # The request may have reached the inbox before the answer was lost: say how to
            # find out (a message is never queued twice, and this command never sends again).
            raise ClusterError(
                f"{exc}. The message may have been queued before the connection was lost; "
                f"`clonefleet jobs status {args.job} --json` shows the job's messages by status "
                "once the cluster can be reached"
            ) from None
        print_result(out, args.json, f"{out['delivery_id']}: {out['status']}")
        return EXIT_OK
    finally:
        fleet.close()
