"""Trust records, the provider report, and the ``clonefleet trust`` command.

A project's own config (``.clonefleet/config.yaml`` in the working directory, say in a repository
just cloned) may not add a provider or change a provider's ``base_url`` or ``api_key_env`` until
the user trusts its folder (docs/config.md, "Trusting a project's config"). The loader,
:func:`clonefleet.config.load_config`, reads the records; this module writes and lists them, and
says which provider would receive which key variable (the variable's name, never its value).

The records are ``$XDG_STATE_HOME/clonefleet/trusted.json`` (default
``~/.local/state/clonefleet/trusted.json``):
``{"version": 1, "trusted": [{"dir": "/abs/project", "since": "2025-01-01T00:00:00+00:00"}]}``.
They are rewritten whole (a temporary file renamed over the old one) under a lock file beside
them, so two ``trust`` commands at once lose neither folder.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clonefleet.config import (
    Config,
    ConfigSource,
    load_config_from,
    printable,
    provider_route,
    read_trust_records,
    shown_url,
    trust_file,
)
from clonefleet.errors import ConfigError, UsageError

__all__ = [
    "add_trust_parser",
    "cmd_trust",
    "config_line",
    "provider_lines",
    "provider_report",
    "revoke",
    "trust",
]

_LABELS = {"explicit": "--config", "env": "$CLONEFLEET_CONFIG", "global": "global"}


# -- what a config sends where ---------------------------------------------------------------
def config_line(config: Config) -> str:
    """``config /p/.clonefleet/config.yaml (project, trusted)``, or ``config: built-in defaults``."""
    source = config.source
    if source.path is None:
        return "config: built-in defaults" if source.kind == "built-in" else "config: made in code"
    label = _LABELS.get(source.kind) or f"project, {'trusted' if source.trusted else 'not trusted'}"
    return f"config {printable(source.path)} ({label})"


def provider_report(config: Config) -> list[dict[str, Any]]:
    """``[{name, kind, base_url, api_key_env, source}]`` sorted by name: where each provider
    sends requests and which variable's key goes with them, as the provider will use them
    (``null`` for a simulated provider; a password in a URL masked); ``source`` is
    ``built-in`` or the kind of config that declared it (``project``, ``global``, ``explicit``,
    ``env``). Never a key's value."""
    out = []
    for name in sorted(config.providers):
        route = provider_route(config.providers[name])
        declared = name in config.declared_providers
        out.append(
            {
                "name": name,
                "kind": config.providers[name].kind,
                "base_url": shown_url(route[0]) if route else None,
                "api_key_env": route[1] if route else None,
                "source": config.source.kind if declared else "built-in",
            }
        )
    return out


def provider_lines(report: list[dict[str, Any]]) -> list[str]:
    """One line per provider of :func:`provider_report`, for people:
    ``provider gh (openai): https://host/v1 gets the key in $GITHUB_TOKEN [project]``."""
    lines = []
    for p in report:
        if p["base_url"] is None:
            where = "in process, no key"
        elif p["api_key_env"]:
            where = f"{p['base_url']} gets the key in ${printable(p['api_key_env'])}"
        else:
            where = f"{p['base_url']}, no key"
        source = _LABELS.get(p["source"], p["source"])
        lines.append(f"provider {printable(p['name'])} ({p['kind']}): {where} [{source}]")
    return lines


# -- the records ---------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(file: Path) -> Iterator[None]:
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(file.with_name(file.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _write(file: Path, records: list[dict[str, str]]) -> None:
    text = json.dumps({"version": 1, "trusted": records}, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".trusted-", suffix=".json")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def trust(directory: str | os.PathLike[str]) -> tuple[dict[str, str], bool]:
    """Trust the project folder ``directory``: returns its record and whether it is new.

    Raises:
        UsageError: ``directory`` is not a folder.
        ConfigError: the records cannot be read (see :func:`~clonefleet.config.read_trust_records`).
    """
    folder = Path(directory).expanduser().resolve()
    if not folder.is_dir():
        raise UsageError(f"{printable(os.fspath(directory))}: no such folder")
    file = trust_file()
    with _locked(file):
        records = read_trust_records(file)
        old = next((r for r in records if r["dir"] == str(folder)), None)
        if old is not None:
            return old, False
        record = {"dir": str(folder), "since": datetime.now(UTC).isoformat(timespec="seconds")}
        _write(file, sorted([*records, record], key=lambda r: r["dir"]))
    return record, True


def revoke(directory: str | os.PathLike[str]) -> str | None:
    """Stop trusting ``directory`` (which may no longer exist): returns the folder removed from
    the records, or ``None`` when it was not in them."""
    raw = Path(directory).expanduser()
    names = {str(raw.resolve()), os.path.abspath(raw)}
    file = trust_file()
    if not file.exists():
        return None
    with _locked(file):
        records = read_trust_records(file)
        kept = [r for r in records if r["dir"] not in names]
        if len(kept) == len(records):
            return None
        _write(file, kept)
    return next(r["dir"] for r in records if r["dir"] in names)


# -- the command ---------------------------------------------------------------------------
def _echo(text: str, stream: Any = None) -> None:
    print(text, file=stream or sys.stdout)  # noqa: T201 - a command prints by design


def add_trust_parser(sub: Any) -> None:
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
    record, added = trust(directory)
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
    removed = revoke(directory)
    shown = removed or os.path.abspath(Path(directory).expanduser())
    if as_json:
        _echo(json.dumps({"dir": shown, "revoked": removed is not None, "file": str(trust_file())}))
    else:
        _echo(f"revoked {printable(shown)}" if removed else f"not trusted: {printable(shown)}")
    return 0
