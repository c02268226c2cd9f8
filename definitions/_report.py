"""The data behind ``clonefleet validate`` and ``clonefleet agents`` as plain dicts (docs/json.md).

The CLI only parses arguments, prints these dicts (``--json``) or a table, and picks the exit
status; everything it reports is computed here so it can be tested without a subprocess.
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import Config
from ._catalog import (
    SHIPPED_DIR,
    Catalog,
    DirectoryLoad,
    discover,
    load_directory,
    load_file_reported,
    not_regular,
    path_kind,
)
from ._model import Definition, LoadFailure, LoadReason, LoadWarning

__all__ = ["agents_report", "validate_report"]


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
) -> dict[str, list[dict[str, Any]]]:
    """Validate definition files and report the ``validate --json`` shape (docs/json.md).

    Args:
        paths: files or folders to validate (with ``subagents_dirs`` added); when empty, the whole
            discovered catalog of ``cwd`` is validated, config entries included.
        subagents_dirs: ``--subagents-dir`` folders.
        cwd: working directory for discovery (default: the process's).
        config: the loaded config (symlink policy, extra folders, inline definitions).

    Returns:
        ``{"definitions": [{name, path, dialect}], "errors": [{path, reason, message}],
        "warnings": [{path, name, message}]}``; definitions are listed once per source that loaded,
        shadowed ones included, in precedence order. The CLI exits 1 when ``errors`` is non-empty.
    """
    if paths:
        total = _load_paths([*paths, *subagents_dirs], config)
    else:
        total = discover(Path(cwd) if cwd is not None else Path.cwd(), subagents_dirs, config)
    return {
        "definitions": [
            {"name": d.name, "path": d.path, "dialect": str(d.dialect)} for d in total.definitions
        ],
        "errors": [
            {"path": e.path, "reason": str(e.reason), "message": e.message} for e in total.errors
        ],
        "warnings": [
            {"path": w.path, "name": w.name, "message": w.message} for w in total.warnings
        ],
    }


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
