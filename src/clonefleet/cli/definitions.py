"""``clonefleet validate`` and ``clonefleet agents``: the definitions a run could use, their
errors and warnings, the tools each would get, and what a project asks for that only
``clonefleet trust`` allows (docs/cli.md, docs/definitions.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from clonefleet.cli.console import EXIT_FAILED, EXIT_OK, make_console
from clonefleet.cli.provider import provider_lines, provider_report
from clonefleet.config import printable

__all__ = ["add_definition_parsers", "cmd_agents", "cmd_validate"]


def add_definition_parsers(sub: Any) -> None:
    """Register ``clonefleet validate`` and ``clonefleet agents`` on the sub-parsers."""
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


def cmd_validate(args: argparse.Namespace) -> int:
    """Report the definitions' errors and warnings, the providers and what trust would allow;
    1 on an error or an untrusted project that asks for something, else 0."""
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
    """List the definitions a run could use (a table, or JSON), with what each shadows."""
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
