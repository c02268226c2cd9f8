"""``clonefleet trust``: trust a project folder, list the trusted folders, or revoke one
(docs/config.md, "Trusting a project's config").

A project's own config (``.clonefleet/config.yaml`` in the working directory, say in a repository
just cloned) and the files it brings may not name providers, key variables, MCP servers or other
things only trust allows until the user trusts its folder. The records themselves are
:mod:`clonefleet.config`'s (:func:`~clonefleet.config.trust_folder`,
:func:`~clonefleet.config.revoke_folder`); this command writes them and shows what the project
may then do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from clonefleet.cli.provider import provider_lines, provider_report
from clonefleet.config import (
    Config,
    ConfigSource,
    load_config_from,
    printable,
    read_trust_records,
    revoke_folder,
    trust_file,
    trust_folder,
)
from clonefleet.errors import ConfigError, UsageError

__all__ = ["add_trust_parser", "cmd_trust"]


def _echo(text: str, stream: Any = None) -> None:
    print(text, file=stream or sys.stdout)  # noqa: T201 - a command prints by design


def add_trust_parser(sub: Any) -> None:
    """Register ``clonefleet trust`` on the command line's sub-parsers."""
    cmd = sub.add_parser(
        "trust",
        help="let a project's .clonefleet/config.yaml name providers and key variables",
        description=(
            "Trust a project folder: its .clonefleet/config.yaml may then add providers or "
            "change a provider's base_url or api_key_env. Without DIR: the current directory."
        ),
    )
    cmd.add_argument("dir", nargs="?", metavar="DIR", help="project folder (default: .)")
    which = cmd.add_mutually_exclusive_group()
    which.add_argument("--list", action="store_true", help="list the trusted folders")
    which.add_argument("--revoke", metavar="DIR", help="stop trusting DIR")
    cmd.add_argument("--json", action="store_true", help="print one JSON object")


def cmd_trust(args: argparse.Namespace) -> int:
    """Trust a folder (default: the current one), list the trusted folders, or revoke one."""
    if args.dir is not None and (args.list or args.revoke is not None):
        raise UsageError("give DIR, --list or --revoke DIR, not more than one")
    if args.list:
        return _list(as_json=args.json)
    if args.revoke is not None:
        return _revoke(args.revoke, as_json=args.json)
    return _trust(args.dir or ".", as_json=args.json)


def _project_files(folder: str) -> tuple[str | None, list[dict[str, Any]], list[dict[str, str]]]:
    """The project's config file, the providers it declares, and what its files ask for that
    only trust allows (``validate``'s ``trust.asks``); a broken file is a warning."""
    from clonefleet.definitions import discover, trust_report

    local = Path(folder) / ".clonefleet" / "config.yaml"
    config: Config | None = None
    try:
        if local.is_file():
            config = load_config_from(ConfigSource("project", str(local), False, folder))
        asks = trust_report(Path(folder), config, discover(Path(folder), (), config).asks)
    except ConfigError as exc:
        _echo(f"clonefleet: warning: {exc}", sys.stderr)
        return (str(local) if local.is_file() else None), [], []
    if config is None:
        return None, [], asks["asks"]
    providers = [p for p in provider_report(config) if p["source"] == "project"]
    return str(local), providers, asks["asks"]


def _trust(directory: str, *, as_json: bool) -> int:
    record, added = trust_folder(directory)
    config, providers, asks = _project_files(record["dir"])
    if as_json:
        out = {**record, "added": added, "file": str(trust_file()), "config": config}
        _echo(json.dumps({**out, "providers": providers, "asks": asks}))
        return 0
    folder = printable(record["dir"])
    _echo(f"trusted {folder}" if added else f"already trusted: {folder}")
    if config is None:
        _echo(f"(there is no {folder}/.clonefleet/config.yaml yet)")
    elif providers:
        _echo(f"its config {printable(config)} may name these providers:")
        _echo("\n".join(f"  {line}" for line in provider_lines(providers)))
    if asks:
        _echo("its files may now:")
        _echo("\n".join(printable(f"  {a['kind']:<8} {a['target']}  ({a['file']})") for a in asks))
    return 0


def _list(*, as_json: bool) -> int:
    records = read_trust_records()
    if as_json:
        _echo(json.dumps({"file": str(trust_file()), "trusted": records}))
    elif not records:
        _echo("no trusted project folders")
    else:
        _echo("\n".join(f"{printable(r['dir'])}  (since {printable(r['since'])})" for r in records))
    return 0


def _revoke(directory: str, *, as_json: bool) -> int:
    removed = revoke_folder(directory)
    shown = removed or os.path.abspath(Path(directory).expanduser())
    if as_json:
        _echo(json.dumps({"dir": shown, "revoked": removed is not None, "file": str(trust_file())}))
    else:
        _echo(f"revoked {printable(shown)}" if removed else f"not trusted: {printable(shown)}")
    return 0
