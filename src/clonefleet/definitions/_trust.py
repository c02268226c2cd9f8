"""Which definitions came with a project, and what they ask for that only ``clonefleet trust``
allows: an MCP server's command (a process every clone host starts as soon as a clone of the
definition starts, before any model chose to) or its URL (where the clone hosts send requests).

A project's sources are its own ``.clonefleet/subagents`` folder and, when its
``.clonefleet/config.yaml`` is the config in use, the folders that file adds to discovery and its
inline ``subagents``. Until the project's folder is trusted, a definition of theirs that asks
for a server is held back (``invalid-definition``, rule ``untrusted-mcp-server``) and blocks its
name, so a definition of that name from a weaker layer (a shipped one) does not run in its place.
Nothing here reads a file but the trust records; :mod:`._catalog` applies it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clonefleet.config import (
    Config,
    McpServerConfig,
    TrustNeed,
    config_needs,
    mcp_need,
    printable,
    read_trust_records,
    trust_command,
    user_config,
)
from clonefleet.definitions._definition import Definition, Dialect, LoadFailure, LoadReason
from clonefleet.errors import ConfigError

__all__ = [
    "ProjectOrigin",
    "ProjectSources",
    "Refusal",
    "definition_needs",
    "refusal",
    "trust_lines",
    "trust_report",
]

RULE = "untrusted-mcp-server"
_KEYS = {Dialect.CLAUDE: "mcpServers", Dialect.NATIVE: "clonefleet.mcp_servers"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ProjectOrigin:
    """A source of definitions that came with a project."""

    project_dir: str
    """The folder ``clonefleet trust`` would trust (its real path)."""
    trusted: bool
    """Whether that folder is in the trust records."""
    whose: str
    """What the source is, for messages: ``this project's folder``, ..."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A definition held back until its project is trusted (its failure is also in ``errors``)."""

    at: int
    """How many loaded definitions come before it in precedence order."""
    definition: Definition
    failure: LoadFailure


def _trusted(project: Path) -> bool:
    try:
        records = read_trust_records()
    except ConfigError:
        return False  # an unreadable trust file trusts nothing
    return any(r.get("dir") == str(project.resolve()) for r in records)


class ProjectSources:
    """Which of a run's sources of definitions came with a project (see the module docstring).

    Folders the user names (``--subagents-dir``), their global folder and definitions
    registered in code are the user's own, even when the project's config names the folder too.
    """

    def __init__(self, cwd: Path, users: Sequence[Path], config: Config | None) -> None:
        """``users``: the folders that are the user's own (``--subagents-dir``, the global
        folder); ``config``: the config in use (its source says whether it is a project's)."""
        project = Path(cwd) / ".clonefleet" / "subagents"
        self._project = _abs(project)
        self._project_origin = ProjectOrigin(
            project_dir=str(Path(cwd).resolve()),
            trusted=_trusted(Path(cwd)),
            whose="this project's folder",
        )
        source = config.source if config is not None else None
        self.inline: ProjectOrigin | None = None
        """The project the config's inline ``subagents`` came with, or ``None``."""
        self._extra: set[Path] = set()
        self._extra_origin = self._project_origin
        if config is not None and source is not None and source.kind == "project":
            project_dir = source.project_dir or str(Path(cwd).resolve())
            self.inline = ProjectOrigin(
                project_dir=project_dir, trusted=source.trusted, whose="this project's config"
            )
            base = Path(config.path).parent if config.path else Path(cwd)
            self._extra = {
                _abs(base / Path(d).expanduser()) for d in config.discovery.extra_subagents_dirs
            }
            self._extra_origin = ProjectOrigin(
                project_dir=project_dir,
                trusted=source.trusted,
                whose="a folder this project's config adds to discovery",
            )
        self._users = {_abs(Path(d).expanduser()) for d in users}

    def folder(self, folder: Path) -> ProjectOrigin | None:
        """The project a searched folder came with, or ``None`` for the user's own folders."""
        path = _abs(folder)
        if path == self._project:
            return self._project_origin
        if path in self._extra and path not in self._users:
            return self._extra_origin
        return None


def _abs(path: Path) -> Path:
    return Path(os.path.abspath(path))


def definition_needs(defn: Definition, origin: ProjectOrigin) -> list[TrustNeed]:
    """The MCP servers of ``defn`` that start a command or reach a URL (a server named by name
    only is the config's and starts nothing new), as :class:`~clonefleet.config.TrustNeed`."""
    needs = []
    file = printable(defn.path or f"<definition {defn.name!r}>")
    trust = trust_command(origin.project_dir)
    for name, entry in defn.mcp_servers:
        if not entry:
            continue
        server = McpServerConfig.model_validate(entry)
        key = f"{_KEYS.get(defn.dialect, 'mcp_servers')}.{name}"
        needs.append(mcp_need(name, server, file=file, key=key, whose=origin.whose, trust=trust))
    return needs


def refusal(defn: Definition, needs: Sequence[TrustNeed], at: int) -> Refusal:
    """The refusal of ``defn`` for its first need (``needs`` is not empty)."""
    more = f" (and {len(needs) - 1} more MCP server(s))" if len(needs) > 1 else ""
    failure = LoadFailure(
        path=needs[0].file,
        reason=LoadReason.INVALID_DEFINITION,
        message=f"rule {RULE}: {needs[0].message}{more}",
    )
    return Refusal(at=at, definition=defn, failure=failure)


def trust_report(cwd: Path, config: Config | None, asks: Sequence[TrustNeed]) -> dict[str, Any]:
    """The ``trust`` part of ``validate --json``: the project folder of ``cwd``, whether it is
    trusted, and everything its files ask for that only ``clonefleet trust`` allows (``asks``:
    its definitions'; the config's are added here when it is the project's), as
    ``{file, key, kind, target}`` rows.

    Raises:
        ConfigError: the user's global config, read to compare against, is invalid.
    """
    needs = list(asks)
    if config is not None and config.source.kind == "project":
        needs = [*config_needs(config, user_config()), *needs]
    return {
        "project": str(Path(cwd).resolve()),
        "trusted": _trusted(Path(cwd)),
        "asks": [n.to_json() for n in needs],
    }


def trust_lines(report: Mapping[str, Any]) -> list[str]:
    """``validate``'s ``trust`` lines for people (not yet :func:`printable`): nothing when the
    project asks for nothing, else what trust allows (or allowed) and where it is asked."""
    asks = report["asks"]
    if not asks:
        return []
    project = report["project"]
    if report["trusted"]:
        head = f"trust    {project} is trusted; its files may:"
    else:
        head = f"trust    {project} is not trusted; `{trust_command(project)}` would allow:"
    return [
        head,
        *(f"trust      {a['kind']:<8} {a['target']}  ({a['file']}, key {a['key']})" for a in asks),
    ]
