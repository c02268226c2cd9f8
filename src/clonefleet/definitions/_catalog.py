"""Discovery and precedence of definitions, and the :class:`Catalog` a run looks agents up in.

Sources are searched in order, a later definition replacing an earlier one by name: shipped,
the user's folder, ``discovery.extra_subagents_dirs``, each ``--subagents-dir``, the project's
``.clonefleet/subagents``, definitions registered in code, then config ``subagents.<name>``. A
per-file failure is recorded with its reason and never stops the rest; a definition that came
with an untrusted project and asks for an MCP server is held back and blocks its name
(``._trust``). See docs/definitions.md, "Discovery and precedence".
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from clonefleet.config import Config, TrustNeed, printable
from clonefleet.definitions._build import build_definition, build_python
from clonefleet.definitions._definition import (
    RESERVED_NAME,
    Definition,
    LoadFailure,
    LoadReason,
    LoadWarning,
)
from clonefleet.definitions._parse import parse_file
from clonefleet.definitions._python import registered
from clonefleet.definitions._trust import (
    ProjectOrigin,
    ProjectSources,
    Refusal,
    definition_needs,
    refusal,
)
from clonefleet.errors import DefinitionError

__all__ = [
    "SHIPPED_DIR",
    "Catalog",
    "DirectoryLoad",
    "discover",
    "global_config_dir",
    "load_catalog",
    "load_directory",
    "load_file",
    "load_file_reported",
    "not_regular",
    "path_kind",
    "subagent_search_path",
]

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
"""The definitions built into the package (``_default``, ``general-purpose``, ``researcher``)."""


def global_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/clonefleet`` (default ``~/.config/clonefleet``)."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "clonefleet"


@dataclass(slots=True, kw_only=True)
class DirectoryLoad:
    """What one folder (or one explicit file) yielded."""

    definitions: list[Definition] = field(default_factory=list)
    errors: list[LoadFailure] = field(default_factory=list)
    warnings: list[LoadWarning] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    """Definitions of an untrusted project held back until it is trusted (``._trust``)."""
    asks: list[TrustNeed] = field(default_factory=list)
    """What the project's definitions ask for that only trust allows, granted or not."""

    def extend(self, other: DirectoryLoad) -> None:
        self.refused += [replace(r, at=r.at + len(self.definitions)) for r in other.refused]
        self.definitions += other.definitions
        self.errors += other.errors
        self.warnings += other.warnings
        self.asks += other.asks


def _stem(path: Path) -> str:
    return path.name[:-3] if path.name.lower().endswith(".md") else path.stem


def load_file(path: Path, *, shipped: bool = False) -> Definition:
    """Load and validate one definition file.

    Args:
        path: the Markdown file.
        shipped: whether it is one of the package's own files (may use the ``_default`` name).

    Raises:
        DefinitionError: with its structured load-failure reason (docs/definitions.md).
    """
    return build_definition(parse_file(path), _stem(path), shipped=shipped)


def _failure(exc: DefinitionError, path: Path) -> LoadFailure:
    return LoadFailure(path=exc.path or str(path), reason=str(exc.reason), message=exc.message)


def load_file_reported(path: Path, *, shipped: bool = False) -> Definition | LoadFailure:
    """:func:`load_file`, with any failure turned into the file's :class:`LoadFailure`.

    Besides the loader's own ``DefinitionError``, an unexpected exception while loading one file
    is reported for that file (``invalid-definition``) rather than stopping the other files.
    """
    try:
        return load_file(path, shipped=shipped)
    except DefinitionError as exc:
        return _failure(exc, path)
    except Exception as exc:  # belt: one hostile file never breaks the others
        return LoadFailure(
            path=str(path),
            reason=LoadReason.INVALID_DEFINITION,
            message=f"the definition could not be loaded ({type(exc).__name__}: {str(exc)[:200]})",
        )


def path_kind(path: Path) -> tuple[int | None, str | None]:
    """``(st_mode, None)`` of ``path`` (symbolic links followed), or ``(None, None)`` when it does
    not exist, or ``(None, problem)`` when it cannot be looked at (a name too long, no access)."""
    try:
        return os.stat(path).st_mode, None
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"cannot look at it: {getattr(exc, 'strerror', None) or exc}"


def not_regular(mode: int) -> str:
    """Why a path of this mode is not a definition file (a FIFO, a device, a socket)."""
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return f"not a regular file ({kind}); it is not opened"
    return "not a regular file; it is not opened"


def _warnings_of(defn: Definition) -> list[LoadWarning]:
    return [LoadWarning(path=defn.path, name=defn.name, message=m) for m in defn.warnings]


def _md_entries(folder: Path, follow_symlinks: bool, result: DirectoryLoad) -> list[Path]:
    try:
        with os.scandir(folder) as listing:  # closed even when a read fails midway
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as exc:
        result.errors.append(
            LoadFailure(
                path=str(folder),
                reason=LoadReason.IO_ERROR,
                message=f"cannot list the folder: {exc.strerror}",
            )
        )
        return []
    files: list[Path] = []
    for entry in entries:
        if not entry.name.lower().endswith(".md"):
            continue
        path = folder / entry.name
        if entry.is_symlink() and not follow_symlinks:
            result.warnings.append(
                LoadWarning(
                    path=str(path),
                    name=None,
                    message="symbolic link skipped; set discovery.follow_symlinks_for_configs: true to follow it",
                )
            )
            continue
        if entry.is_symlink() and not path.exists():
            result.errors.append(
                LoadFailure(
                    path=str(path),
                    reason=LoadReason.IO_ERROR,
                    message="symbolic link points nowhere",
                )
            )
            continue
        try:
            mode = entry.stat(follow_symlinks=follow_symlinks).st_mode
        except OSError as exc:
            result.errors.append(
                LoadFailure(
                    path=str(path),
                    reason=LoadReason.IO_ERROR,
                    message=f"cannot read the file: {exc.strerror or exc}",
                )
            )
            continue
        if stat.S_ISREG(mode):
            files.append(path)
        elif not stat.S_ISDIR(mode):
            # A FIFO would block the reader forever; devices and sockets are no files either.
            result.errors.append(
                LoadFailure(path=str(path), reason=LoadReason.IO_ERROR, message=not_regular(mode))
            )
    return files


def load_directory(
    folder: Path, *, follow_symlinks: bool = False, shipped: bool = False, explicit: bool = False
) -> DirectoryLoad:
    """Load every ``*.md`` file directly inside ``folder`` (non-recursive, case-insensitive).

    A missing folder yields nothing (with a warning when ``explicit``, i.e. the user named it).
    Files of this folder that define the same name are all rejected with ``name-collision``.
    """
    result = DirectoryLoad()
    mode, problem = path_kind(folder)
    if problem is not None:
        result.errors.append(
            LoadFailure(path=str(folder), reason=LoadReason.IO_ERROR, message=problem)
        )
        return result
    if mode is None:
        if explicit:
            result.warnings.append(
                LoadWarning(path=str(folder), name=None, message="folder does not exist; skipped")
            )
        return result
    if not stat.S_ISDIR(mode):
        result.errors.append(
            LoadFailure(path=str(folder), reason=LoadReason.IO_ERROR, message="not a folder")
        )
        return result
    loaded: list[Definition] = []
    for path in _md_entries(folder, follow_symlinks, result):
        defn = load_file_reported(path, shipped=shipped)
        if isinstance(defn, LoadFailure):
            result.errors.append(defn)
            continue
        loaded.append(defn)
        result.warnings += _warnings_of(defn)
    by_name: dict[str, list[Definition]] = {}
    for defn in loaded:
        by_name.setdefault(defn.name, []).append(defn)
    for name, group in by_name.items():
        if len(group) == 1:
            result.definitions.append(group[0])
            continue
        for defn in group:
            others = ", ".join(str(o.path) for o in group if o is not defn)
            result.errors.append(
                LoadFailure(
                    path=str(defn.path),
                    reason=LoadReason.NAME_COLLISION,
                    message=f"name {name!r} is also defined by {others} in the same folder; neither file is loaded",
                )
            )
    return result


def subagent_search_path(
    cwd: Path, subagents_dirs: Sequence[Path] = (), config: Config | None = None
) -> list[tuple[Path, bool]]:
    """The folders searched for definitions, lowest precedence first, as ``(folder, explicit)``."""
    config = config or Config()
    base = Path(config.path).parent if config.path else cwd
    layers: list[tuple[Path, bool]] = [(global_config_dir() / "subagents", False)]
    layers += [((base / Path(d).expanduser()), True) for d in config.discovery.extra_subagents_dirs]
    layers += [(Path(d).expanduser(), True) for d in subagents_dirs]
    layers.append((cwd / ".clonefleet" / "subagents", False))
    # A folder named twice counts once, at its last (strongest) position.
    last: dict[Path, int] = {}
    for i, (folder, _) in enumerate(layers):
        last[Path(os.path.abspath(folder))] = i
    return [
        (folder, explicit)
        for i, (folder, explicit) in enumerate(layers)
        if last[Path(os.path.abspath(folder))] == i
    ]


def _origin(defn: Definition) -> str:
    return defn.path or f"<{defn.dialect} definition {defn.name!r}>"


@dataclass(slots=True, kw_only=True, eq=False)
class Catalog:
    """The definitions in force for one invocation, plus what failed or warned while loading.

    A catalog never changes after loading: an edited file takes effect only through
    :meth:`reload`, which returns a new catalog.
    """

    definitions: dict[str, Definition]
    """Every loaded definition by name, ``_default`` included."""
    errors: list[LoadFailure] = field(default_factory=list)
    """Per-file failures, in discovery order."""
    warnings: list[LoadWarning] = field(default_factory=list)
    """Per-file warnings (including those of definitions later shadowed), in discovery order."""
    refused: dict[str, LoadFailure] = field(default_factory=dict)
    """Names whose strongest definition came with an untrusted project and asks for what only
    ``clonefleet trust`` allows, with its failure; :meth:`get` raises it for them."""
    cwd: Path = field(default_factory=Path.cwd)
    subagents_dirs: tuple[Path, ...] = ()
    config: Config | None = None

    def get(self, name: str) -> Definition:
        """Return the definition called ``name``.

        Raises:
            DefinitionError: ``unknown-agent`` listing the available agents, or the load
                failure's own reason when a file of that name failed to load or was held back
                until its project is trusted (never a weaker definition of the name instead).
        """
        found = self.definitions.get(name)
        if found is not None:
            return found
        available = ", ".join(d.name for d in self.listed()) or "(none)"
        held = self.refused.get(name)
        if held is not None:
            raise DefinitionError(
                f"agent {name!r} did not load: {printable(held.message)}",
                held.reason,
                held.path,
                "name",
            )
        available = ", ".join(d.name for d in self.listed()) or "(none)"
        for failure in self.errors:
            if Path(failure.path).name.lower() == f"{name}.md".lower():
                raise DefinitionError(
                    # The message may quote the file (a key, a value): keep its control
                    # characters off the terminal the error is printed on.
                    f"agent {name!r} did not load: {printable(failure.message)}; available agents: {available}",
                    failure.reason,
                    failure.path,
                    "name",
                )
        guess = difflib.get_close_matches(name, list(self.definitions), n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise DefinitionError(
            f"unknown agent {name!r}{hint}; available agents: {available}",
            "unknown-agent",
            None,
            "name",
        )

    def listed(self) -> list[Definition]:
        """Definitions shown to models and users, sorted by name (``_default`` is left out)."""
        return [self.definitions[n] for n in sorted(self.definitions) if n != RESERVED_NAME]

    def reload(self) -> Catalog:
        """Read every source again and return a fresh catalog (this one is left unchanged)."""
        return load_catalog(self.cwd, self.subagents_dirs, self.config)


def _add(table: dict[str, Definition], defn: Definition) -> None:
    previous = table.get(defn.name)
    if previous is not None:
        defn = replace(defn, shadows=(*previous.shadows, _origin(previous)))
    table[defn.name] = defn


def discover(
    cwd: Path, subagents_dirs: Sequence[Path] = (), config: Config | None = None
) -> DirectoryLoad:
    """Load every source of definitions, lowest precedence first, without layering them.

    The result lists each definition that loaded (shadowed ones included) in precedence order,
    followed by registered and config definitions; ``load_catalog`` layers it by name.
    """
    follow = bool(config and config.discovery.follow_symlinks_for_configs)
    total = load_directory(SHIPPED_DIR, shipped=True)
    # Folders the user names, and their own global one, stay theirs whoever else names them.
    users = [*subagents_dirs, global_config_dir() / "subagents"]
    sources = ProjectSources(Path(cwd), users, config)
    for folder, explicit in subagent_search_path(Path(cwd), subagents_dirs, config):
        load = load_directory(folder, follow_symlinks=follow, explicit=explicit)
        if (origin := sources.folder(folder)) is not None:
            _hold_back_untrusted(load, origin)
        total.extend(load)
    for defn in registered():
        total.definitions.append(defn)
        total.warnings += _warnings_of(defn)
    if config is not None:
        total.extend(_inline(config, sources.inline))
    return total


def _inline(config: Config, origin: ProjectOrigin | None) -> DirectoryLoad:
    """The config's ``subagents`` entries (a project's held back until it is trusted)."""
    load = DirectoryLoad()
    for name, spec in config.subagents.items():
        where = f"{config.path or 'config'}:subagents.{name}"
        try:
            defn = build_python(
                spec if isinstance(spec, dict) else {}, path=where, expected_name=name
            )
        except DefinitionError as exc:
            load.errors.append(LoadFailure(path=where, reason=str(exc.reason), message=exc.message))
            continue
        except Exception as exc:  # belt: one hostile entry never breaks the others
            load.errors.append(
                LoadFailure(
                    path=where,
                    reason=LoadReason.INVALID_DEFINITION,
                    message=f"the definition could not be loaded ({type(exc).__name__}: {str(exc)[:200]})",
                )
            )
            continue
        load.definitions.append(defn)
        load.warnings += _warnings_of(defn)
    if origin is not None:
        _hold_back_untrusted(load, origin)
    return load


def _hold_back_untrusted(load: DirectoryLoad, origin: ProjectOrigin) -> None:
    """Record what the definitions of a project's source ask for that needs trust; while the
    project is not trusted, hold back each one that asks for any (``._trust``): it is reported
    (``invalid-definition``, rule ``untrusted-mcp-server``) and blocks its name."""
    kept: list[Definition] = []
    for defn in load.definitions:
        needs = definition_needs(defn, origin)
        load.asks += needs
        if not needs or origin.trusted:
            kept.append(defn)
            continue
        held = refusal(defn, needs, len(kept))
        load.refused.append(held)
        load.errors.append(held.failure)
    load.definitions[:] = kept


def load_catalog(
    cwd: Path, subagents_dirs: Sequence[Path] = (), config: Config | None = None
) -> Catalog:
    """Discover, validate and layer every definition for a run in ``cwd``.

    Args:
        cwd: the working directory; its ``.clonefleet/subagents`` is the strongest folder.
        subagents_dirs: ``--subagents-dir`` folders, in the order given.
        config: the loaded config (``None`` = built-in defaults, no inline definitions).

    Returns:
        A :class:`Catalog`; per-file failures are in ``errors``, never raised.
    """
    cwd = Path(cwd)
    total = discover(cwd, subagents_dirs, config)
    table: dict[str, Definition] = {}
    refused: dict[str, LoadFailure] = {}
    held = sorted(total.refused, key=lambda r: r.at)
    for i, defn in enumerate([*total.definitions, None]):
        # A held-back definition takes its name out of the table, until a stronger source
        # defines the name again: what runs is never a weaker definition in its place.
        while held and (defn is None or held[0].at <= i):
            first = held.pop(0)
            table.pop(first.definition.name, None)
            refused[first.definition.name] = first.failure
        if defn is not None:
            _add(table, defn)
            refused.pop(defn.name, None)
    return Catalog(
        definitions=table,
        refused=refused,
        errors=total.errors,
        warnings=total.warnings,
        cwd=cwd,
        subagents_dirs=tuple(Path(d) for d in subagents_dirs),
        config=config,
    )
