"""``clonefleet dashboard``: serve the live web view of a persistent cluster (docs/dashboard.md).

The parser and the command live here; :mod:`clonefleet.cli.program` registers them. The page is served on
127.0.0.1 unless ``--host`` says otherwise; the fleet is the cluster ``clonefleet cluster up``
recorded unless ``--address`` names another.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

__all__ = ["add_dashboard_parser", "cmd_dashboard"]

DEFAULT_PORT = 8470
CALL_TIMEOUT_S = 5.0
"""Deadline of each read of the scheduler: a frozen one shows as the page's banner this soon."""


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 0 to 65535, got {text[:20]!r}")
    return int(text)


def _refresh(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.2 <= value <= 60.0:
        raise argparse.ArgumentTypeError(f"must be seconds from 0.2 to 60, got {text[:20]!r}")
    return value


def add_dashboard_parser(sub: Any) -> None:
    """Register ``clonefleet dashboard`` on the command line's sub-parsers."""
    p = sub.add_parser(
        "dashboard",
        help="serve a live web view of a cluster's batches and jobs (127.0.0.1)",
        description=(
            "Serve one page showing the batches of the cluster `clonefleet cluster up` started, "
            "their progress, a job table filtered by status and agent, a job's events and usage "
            "totals, updated live. Runs until Ctrl-C."
        ),
    )
    p.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"TCP port (default {DEFAULT_PORT}; 0 for a free one)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; anything else shows your jobs to the network)",
    )
    p.add_argument(
        "--address",
        help="Ray address (default: the cluster `clonefleet cluster up` started, or RAY_ADDRESS)",
    )
    p.add_argument(
        "--refresh",
        type=_refresh,
        default=1.0,
        metavar="S",
        help="seconds between reads of the job table while a page is open (default 1)",
    )


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Connect to the cluster and serve the dashboard until interrupted (exit status 0)."""
    from clonefleet.cli.cluster import connect
    from clonefleet.dashboard import DashboardOptions, is_loopback, serve

    if not is_loopback(args.host):
        sys.stderr.write(
            f"clonefleet: warning: --host {args.host} is not a loopback address: anyone who can "
            "reach it sees your jobs, their results and errors (the page has no login)\n"
        )
    fleet = connect(args.address, call_timeout_s=CALL_TIMEOUT_S)

    def ready(url: str) -> None:
        sys.stdout.write(f"clonefleet dashboard: {url} (Ctrl-C stops)\n")
        sys.stdout.flush()

    options = DashboardOptions(
        refresh_s=args.refresh, call_timeout_s=CALL_TIMEOUT_S + 2.0, table_timeout_s=60.0
    )
    try:
        asyncio.run(serve(fleet, host=args.host, port=args.port, options=options, on_ready=ready))
    except KeyboardInterrupt:
        sys.stderr.write("clonefleet: dashboard stopped\n")
    finally:
        fleet.close()
    return 0
