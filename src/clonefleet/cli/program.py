"""The ``clonefleet`` program (docs/cli.md): the parser assembled from each command group's
module, :func:`main` and :func:`entry`.

Each sub-command parses its arguments, calls the Python API and prints either for people (a live
display on a terminal, a summary table) or, with ``--json``, for scripts. Exit status: 0 when
every job completed with outcome success, 1 otherwise, 2 for usage or definition errors (with
nothing started).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from clonefleet.cli.bench import add_bench_parser, cmd_bench
from clonefleet.cli.cluster import add_cluster_parser, cmd_cluster
from clonefleet.cli.console import EXIT_FAILED, EXIT_USAGE
from clonefleet.cli.dashboard import add_dashboard_parser, cmd_dashboard
from clonefleet.cli.definitions import add_definition_parsers, cmd_agents, cmd_validate
from clonefleet.cli.events import add_events_parser, cmd_events
from clonefleet.cli.jobs import add_jobs_parser, cmd_jobs
from clonefleet.cli.message import add_message_parser, cmd_message
from clonefleet.cli.provider import add_provider_parser, cmd_provider
from clonefleet.cli.run import add_run_parser, cmd_run
from clonefleet.cli.signals import as_interrupted, interrupted_line, stop_signals_raise
from clonefleet.cli.trust import add_trust_parser, cmd_trust
from clonefleet.errors import ClonefleetError, ConfigError, DefinitionError, UsageError

__all__ = ["HANDLERS", "build_parser", "entry", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: each group's module adds its sub-commands, in the order of
    ``clonefleet --help``."""
    parser = argparse.ArgumentParser(
        prog="clonefleet",
        description="Run counted batches of LLM subagents as Ray actors (embedded local Ray and a simulated model by default).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_parser(sub)
    add_definition_parsers(sub)
    add_provider_parser(sub)
    add_jobs_parser(sub)
    add_events_parser(sub)
    add_message_parser(sub)
    add_cluster_parser(sub)
    add_trust_parser(sub)
    add_dashboard_parser(sub)
    add_bench_parser(sub)
    return parser


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "validate": cmd_validate,
    "agents": cmd_agents,
    "provider": cmd_provider,
    "jobs": cmd_jobs,
    "events": cmd_events,
    "cluster": cmd_cluster,
    "message": cmd_message,
    "trust": cmd_trust,
    "dashboard": cmd_dashboard,
    "bench": cmd_bench,
}
"""Each sub-command's function: it returns the exit status."""


OWN_SIGNAL_HANDLING = ("provider", "dashboard")
"""Commands that serve until stopped and take SIGINT and SIGTERM as a clean stop (status 0)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments), run the command and return its exit
    status; stop signals end it cleanly, except for commands that serve until stopped."""
    args = build_parser().parse_args(argv)
    if args.command in OWN_SIGNAL_HANDLING:
        return _main(args)
    with stop_signals_raise():
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    handler = HANDLERS[args.command]
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
    # Cut off first: asking Ray Client whether it is connected would wait for the head.
    if _cut_off_from_the_head() or _nothing_left_to_finish():
        os._exit(code)
    raise SystemExit(code)


def _cut_off_from_the_head() -> bool:
    """Whether the command gave up on a step of Ray Client because the head could not be
    reached: what is left would only wait for the head (Ray's exit handlers wait for a minute
    or more), so the process ends at once, its output flushed."""
    from clonefleet.cluster import client_steps_left_behind

    if not client_steps_left_behind():
        return False
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    return True


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
