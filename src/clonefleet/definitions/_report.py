"""The data behind ``clonefleet validate`` and ``clonefleet agents`` as plain dicts (docs/json.md).

The CLI only parses arguments, prints these dicts (``--json``) or a table, and picks the exit
status; everything it reports is computed here so it can be tested without a subprocess.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clonefleet.config import Config, printable
from clonefleet.definitions._catalog import (
    SHIPPED_DIR,
    Catalog,
    DirectoryLoad,
    discover,
    load_directory,
    load_file_reported,
    not_regular,
    path_kind,
)
from clonefleet.definitions._definition import Definition, LoadFailure, LoadReason, LoadWarning
from clonefleet.definitions._tool_report import EffectiveOf, definition_tools, tool_resolution
from clonefleet.definitions._trust import trust_lines, trust_report

__all__ = ["agents_report", "validate_lines", "validate_report"]


def _is_shipped(path: Path) -> bool:
    try:
        resolved = path.resolve()
    except OSError:
        return False
    return resolved == SHIPPED_DIR or resolved.parent == SHIPPED_DIR


def _load_paths(paths: Sequence[Path], config: Config | None) -> DirectoryLoad:
    follow = bool(config and config.discovery.follow_symlinks_for_configs)
    total = DirectoryLoad()
    for raw in paths:
        path = Path(raw).expanduser()
        mode, problem = path_kind(path)
        if problem is not None or mode is None:
            message = problem or "no such file or folder"
            total.errors.append(
                LoadFailure(path=str(path), reason=LoadReason.IO_ERROR, message=message)
            )
        elif stat.S_ISDIR(mode):
            total.extend(
                load_directory(
                    path, follow_symlinks=follow, shipped=_is_shipped(path), explicit=True
                )
            )
        elif not stat.S_ISREG(mode):
            # A FIFO named on the command line would block `validate` forever: never open it.
            total.errors.append(
                LoadFailure(path=str(path), reason=LoadReason.IO_ERROR, message=not_regular(mode))
            )
        else:
            defn = load_file_reported(path, shipped=_is_shipped(path))
            if isinstance(defn, LoadFailure):
                total.errors.append(defn)
                continue
            total.definitions.append(defn)
            total.warnings += [
                LoadWarning(path=defn.path, name=defn.name, message=m) for m in defn.warnings
            ]
    return total


def validate_report(
    paths: Sequence[Path] = (),
    subagents_dirs: Sequence[Path] = (),
    cwd: Path | None = None,
    config: Config | None = None,
    *,
    effective_of: EffectiveOf | None = None,
    tools: bool = False,
    trust: bool = False,
) -> dict[str, Any]:
    """Validate definition files and report the ``validate --json`` shape (docs/json.md).

    Args:
        paths: files or folders to validate (with ``subagents_dirs`` added); when empty, the whole
            discovered catalog of ``cwd`` is validated, config entries included.
        subagents_dirs: ``--subagents-dir`` folders.
        cwd: working directory for discovery (default: the process's).
        config: the loaded config (symlink policy, extra folders, inline definitions).
        effective_of: what a clone of a definition gets (``clonefleet.planning.clone_tools``);
            with it, each definition's row has its ``tools`` and the ``rules`` of its policy.
        tools: add ``tool_resolution`` (``validate --tools``); needs ``effective_of``.
        trust: add ``trust`` (``validate`` always does): what the project of ``cwd`` asks for
            that only ``clonefleet trust`` allows (:func:`._trust.trust_report`).

    Returns:
        ``{"definitions": [{name, path, dialect}], "errors": [{path, reason, message}],
        "warnings": [{path, name, message}]}``, with ``trust: {project, trusted, asks}`` when
        asked; definitions are listed once per source that loaded, shadowed ones included, in
        precedence order. The CLI exits 1 when ``errors`` is non-empty or an untrusted project
        asks for anything.

    Raises:
        ConfigError: the user's global config, read to compare a project's against, is invalid.
    """
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    if paths:
        total = _load_paths([*paths, *subagents_dirs], config)
    else:
        total = discover(cwd, subagents_dirs, config)
    rows = []
    for d in total.definitions:
        row: dict[str, Any] = {"name": d.name, "path": d.path, "dialect": str(d.dialect)}
        if effective_of is not None:
            row.update(definition_tools(d, effective_of(d)))
        rows.append(row)
    report: dict[str, Any] = {
        "definitions": rows,
        "errors": [
            {"path": e.path, "reason": str(e.reason), "message": e.message} for e in total.errors
        ],
        "warnings": [
            {"path": w.path, "name": w.name, "message": w.message} for w in total.warnings
        ],
    }
    if trust:
        report["trust"] = trust_report(cwd, config, total.asks)
    if tools and effective_of is not None:
        report["tool_resolution"] = tool_resolution(total.definitions, config, effective_of)
    return report


def _agent_row(defn: Definition) -> dict[str, Any]:
    return {
        "name": defn.name,
        "description": defn.description,
        "dialect": str(defn.dialect),
        "path": defn.path,
        "shadows": list(defn.shadows),
        "model": defn.model,
        "tools": None if defn.tools is None else list(defn.tools),
        "warnings": list(defn.warnings),
    }


def agents_report(catalog: Catalog) -> dict[str, list[dict[str, Any]]]:
    """The ``agents --json`` shape: every definition in force, sorted by name, ``_default`` included.

    ``tools`` is ``None`` for "every tool of the caller"; ``shadows`` lists the sources this
    definition replaced, earliest first.
    """
    return {"agents": [_agent_row(catalog.definitions[n]) for n in sorted(catalog.definitions)]}


def _rules_text(layers: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for layer in layers:
        said = [f"{kind} {', '.join(layer[kind])}" for kind in ("allow", "deny") if layer[kind]]
        if layer["default"] == "deny":
            said.append("default deny")
        parts.append(f"{layer['source']}: {'; '.join(said)}")
    return " | ".join(parts) or "none (every call allowed)"


def _tool_lines(resolution: Mapping[str, Any]) -> list[str]:
    lines = []
    for row in resolution["definitions"]:
        asked = "no tools key (every tool of the caller)"
        if row["asked"] is not None:
            asked = f"asked {row['mentions']}, {row['resolved']} resolved, {row['granted']} granted"
        lines.append(f"tools    {row['name']}: {asked}")
        lines += [
            f"         missing {m['tool']}: {m['reason']} ({m['detail']})" for m in row["missing"]
        ]
    t = resolution["totals"]
    lines.append(
        f"tools    total: {t['mentions']:,} mentions in {t['definitions_listing_tools']:,} of"
        f" {t['definitions']:,} definitions; {t['resolved']:,} resolved ({t['resolved_pct']}%),"
        f" {t['granted']:,} granted ({t['granted_pct']}%)"
    )
    return lines


def validate_lines(report: Mapping[str, Any]) -> list[str]:
    """``clonefleet validate`` for people: one ``ok`` line per definition (with its tools and
    rules when the report has them), then warnings, errors, the ``--tools`` report and what
    trust of the project allows. Names,
    paths and messages come from files anyone may have written, so every line is passed through
    :func:`~clonefleet.config.printable` (docs/cli.md)."""
    lines = []
    for d in report["definitions"]:
        lines.append(f"ok       {d['name']} ({d['dialect']}) {d['path'] or ''}")
        if "tools" in d:
            lines.append(f"         tools: {', '.join(d['tools']) or 'none'}")
            lines.append(f"         rules: {_rules_text(d['rules'])}")
    lines += [f"warning  {w['path']}: {w['name']}: {w['message']}" for w in report["warnings"]]
    lines += [f"error    {e['path']}: {e['reason']}: {e['message']}" for e in report["errors"]]
    if "tool_resolution" in report:
        lines += _tool_lines(report["tool_resolution"])
    if "trust" in report:
        lines += trust_lines(report["trust"])
    return [printable(line) for line in lines]
