"""The persistent local cluster: ``clonefleet cluster up|down|status``, and how the other commands
reach the cluster it started (:func:`connect`, :func:`journal_dir`, :func:`add_address_options`).

Commands that control jobs talk to a persistent cluster (``clonefleet cluster up`` or
``--address``); an embedded Ray instance ends with the command that started it, so there is
nothing to control. They only call the scheduler actor, so they send no package to the cluster.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clonefleet.cli.console import EXIT_FAILED, EXIT_OK, print_result
from clonefleet.errors import ClonefleetError, UsageError

if TYPE_CHECKING:
    from clonefleet.fleet import Fleet

__all__ = ["add_address_options", "add_cluster_parser", "cmd_cluster", "connect", "journal_dir"]


def add_address_options(p: argparse.ArgumentParser) -> None:
    """``--address`` and ``--json``, the options of every command that reaches the cluster."""
    p.add_argument(
        "--address",
        help="Ray address (default: the cluster `clonefleet cluster up` started, or RAY_ADDRESS)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


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


def add_cluster_parser(sub: Any) -> None:
    """Register ``clonefleet cluster`` on the command line's sub-parsers."""
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


def cmd_cluster(args: argparse.Namespace) -> int:
    """Start, stop or describe the local cluster."""
    if args.cluster_command == "up":
        return _cluster_up(args)
    if args.cluster_command == "down":
        return _cluster_down(args)
    return _cluster_status(args)


def _cluster_up(args: argparse.Namespace) -> int:
    from clonefleet.cluster import cluster_up

    print(
        f"clonefleet: starting a local cluster with {args.nodes} node(s) on 127.0.0.1 ...",
        file=sys.stderr,
        flush=True,
    )
    state = cluster_up(nodes=args.nodes, cpus_per_node=args.cpus_per_node, port=args.port)
    _resume_unfinished(args.json)
    print_result(
        state,
        args.json,
        f"cluster up at {state['address']} ({state['nodes']} node(s)); `clonefleet run --detach --address auto ...` uses it",
    )
    return EXIT_OK


def _cluster_down(args: argparse.Namespace) -> int:
    from clonefleet.cluster import cluster_down, dead_daemon_state

    ending: list[int | None] = []
    died = dead_daemon_state()
    stopped = cluster_down(announce=lambda n: _say_ending(_unfinished_jobs(n), ending, args.json))
    human = "cluster stopped" if stopped else "no cluster was running"
    if stopped and died is not None:
        human = f"cluster ended: its daemon (pid {died['pid']}) had died; what it left was killed"
    print_result(
        {
            "stopped": stopped,
            "running_jobs_ended": ending[0] if ending else None,
            "daemon_had_died": died is not None,
        },
        args.json,
        human,
    )
    return EXIT_OK


def _cluster_status(args: argparse.Namespace) -> int:
    from clonefleet.cluster import dead_daemon_state, read_state

    found = read_state()
    if found is None:
        died = dead_daemon_state()
        human = (
            f"the clonefleet cluster's daemon (pid {died['pid']}) died; "
            "`clonefleet cluster down` ends what is left of it"
            if died is not None
            else "no clonefleet cluster is running"
        )
        print_result({"running": False, "daemon_died": died is not None}, args.json, human)
        return EXIT_FAILED
    print_result(
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
