"""Skills: discovery of ``<folder>/<name>/SKILL.md``, a subagent's access policy, ``@skill:`` refs.

Skill folders are layered like definition folders (docs/definitions.md):
``$XDG_CONFIG_HOME/clonefleet/skills``, each extra folder given, then the project's
``.clonefleet/skills``, later replacing earlier by name. Access is decided by the *subagent's*
``skills_allow``/``skills_deny`` only. Injection into a clone's context is the agent loop's job;
this module returns what to inject.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clonefleet.config import Config
from clonefleet.definitions._catalog import global_config_dir, path_kind
from clonefleet.definitions._definition import (
    Definition,
    InjectedSkill,
    LoadFailure,
    LoadReason,
    LoadWarning,
)
from clonefleet.definitions._parse import NAMESPACE_KEYS, parse_file
from clonefleet.errors import DefinitionError
from clonefleet.vocab import skill_refs

__all__ = [
    "Skill",
    "SkillCatalog",
    "find_skill_refs",
    "load_skills",
    "resolve_skill_refs",
    "skill_allowed",
    "skill_search_path",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Skill:
    """One discovered skill."""

    name: str
    description: str
    body: str
    """Instructions injected into a clone's context when referenced."""
    path: str
    disable_model_invocation: bool = False
    """When true, a model may not pull the skill in (``@skill:`` references to it are errors)."""


@dataclass(slots=True, kw_only=True)
class SkillCatalog:
    """The skills in force, plus per-skill load failures and warnings."""

    skills: dict[str, Skill] = field(default_factory=dict)
    errors: list[LoadFailure] = field(default_factory=list)
    warnings: list[LoadWarning] = field(default_factory=list)

    def get(self, name: str) -> Skill | None:
        return self.skills.get(name)

    def names(self) -> list[str]:
        return sorted(self.skills)


def skill_search_path(cwd: Path, dirs: Sequence[Path] = ()) -> list[tuple[Path, bool]]:
    """Skill folders, lowest precedence first, as ``(folder, explicit)``."""
    return [
        (global_config_dir() / "skills", False),
        *((Path(d).expanduser(), True) for d in dirs),
        (Path(cwd) / ".clonefleet" / "skills", False),
    ]


def _flag(fm: dict[str, Any]) -> Any:
    for ns in NAMESPACE_KEYS:
        table = fm.get(ns)
        if isinstance(table, dict) and "disable_model_invocation" in table:
            return table["disable_model_invocation"]
    return fm.get("disable_model_invocation", fm.get("disable-model-invocation", False))


def _load_skill(folder: Path, skill_md: Path) -> Skill:
    raw = parse_file(skill_md)
    fm, where = raw.frontmatter, str(skill_md)
    name = fm.get("name", folder.name)
    if name != folder.name:
        raise DefinitionError(
            f"skill name {name!r} must equal its folder name {folder.name!r}",
            LoadReason.NAME_MISMATCH,
            where,
            "name",
        )
    flag = _flag(fm)
    if not isinstance(flag, bool):
        raise DefinitionError(
            "`disable_model_invocation` must be true or false [rule key-type, key `disable_model_invocation`]",
            LoadReason.INVALID_DEFINITION,
            where,
            "disable_model_invocation",
        )
    description = fm.get("description")
    return Skill(
        name=name,
        description=description.strip() if isinstance(description, str) else "",
        body=raw.body,
        path=where,
        disable_model_invocation=flag,
    )


def _skill_file(entry: Path, follow: bool) -> Path | None:
    try:
        with os.scandir(entry) as children:
            for child in children:
                # Anything but a folder is returned, so a FIFO or device named SKILL.md is
                # reported by the reader (which refuses it unopened) instead of vanishing.
                if (
                    child.name.lower() == "skill.md"
                    and (follow or not child.is_symlink())
                    and not child.is_dir()
                ):
                    return entry / child.name
    except OSError:
        return None
    return None


def _load_folder(folder: Path, follow: bool, catalog: SkillCatalog) -> None:
    try:
        with os.scandir(folder) as listing:  # closed even when a read fails midway
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as exc:
        catalog.errors.append(
            LoadFailure(path=str(folder), reason=LoadReason.IO_ERROR, message=str(exc.strerror))
        )
        return
    for entry in entries:
        path = folder / entry.name
        if entry.is_symlink() and not follow:
            catalog.warnings.append(
                LoadWarning(path=str(path), name=None, message="symbolic link skipped")
            )
            continue
        try:
            if not entry.is_dir():
                continue
        except OSError:
            continue
        skill_md = _skill_file(path, follow)
        if skill_md is None:
            continue
        try:
            skill = _load_skill(path, skill_md)
        except DefinitionError as exc:
            catalog.errors.append(
                LoadFailure(
                    path=exc.path or str(skill_md), reason=str(exc.reason), message=exc.message
                )
            )
            continue
        except Exception as exc:  # belt: one hostile skill never breaks the others
            catalog.errors.append(
                LoadFailure(
                    path=str(skill_md),
                    reason=LoadReason.INVALID_DEFINITION,
                    message=f"the skill could not be loaded ({type(exc).__name__}: {str(exc)[:200]})",
                )
            )
            continue
        catalog.skills[skill.name] = skill


def load_skills(cwd: Path, dirs: Sequence[Path] = (), config: Config | None = None) -> SkillCatalog:
    """Discover every skill for a run in ``cwd`` (missing folders are skipped).

    Args:
        cwd: the project root whose ``.clonefleet/skills`` is the strongest folder.
        dirs: extra skill folders, in increasing precedence.
        config: supplies the symlink policy (``discovery.follow_symlinks_for_configs``).
    """
    follow = bool(config and config.discovery.follow_symlinks_for_configs)
    catalog = SkillCatalog()
    for folder, explicit in skill_search_path(Path(cwd), dirs):
        mode, problem = path_kind(folder)
        if problem is not None:
            catalog.errors.append(
                LoadFailure(path=str(folder), reason=LoadReason.IO_ERROR, message=problem)
            )
        elif mode is not None and stat.S_ISDIR(mode):
            _load_folder(folder, follow, catalog)
        elif explicit:
            catalog.warnings.append(
                LoadWarning(path=str(folder), name=None, message="folder does not exist; skipped")
            )
    return catalog


def skill_allowed(defn: Definition, name: str) -> bool:
    """Whether ``defn``'s own policy lets it use skill ``name`` (an empty allow list allows all)."""
    if name in defn.skills_deny:
        return False
    return not defn.skills_allow or name in defn.skills_allow


def find_skill_refs(text: str) -> list[str]:
    """The skill names referenced as ``@skill:NAME`` in ``text``, in order of first mention."""
    return skill_refs(text)


def resolve_skill_refs(
    text: str, defn: Definition, skills: SkillCatalog
) -> tuple[InjectedSkill, ...]:
    """Resolve every ``@skill:`` reference in ``text`` against ``defn``'s own skill policy.

    Returns:
        The skills to inject ahead of the clone's first instruction, in order of first mention.

    Raises:
        DefinitionError: reason ``skill-unresolved`` (no such skill), ``skill-denied`` (the
            subagent's skills_allow/skills_deny exclude it) or ``skill-model-invocation-disabled``.
    """
    injected: list[InjectedSkill] = []
    for name in find_skill_refs(text):
        skill = skills.get(name)
        if skill is None:
            known = ", ".join(skills.names()) or "(none)"
            raise DefinitionError(
                f"@skill:{name} does not name a skill; available skills: {known}",
                "skill-unresolved",
                None,
                "prompt",
            )
        if not skill_allowed(defn, name):
            why = (
                "its skills_deny lists it"
                if name in defn.skills_deny
                else "it is not in its skills_allow"
            )
            raise DefinitionError(
                f"subagent {defn.name!r} may not use skill {name!r}: {why}",
                "skill-denied",
                skill.path,
                "prompt",
            )
        if skill.disable_model_invocation:
            raise DefinitionError(
                f"skill {name!r} sets disable_model_invocation, so it cannot be referenced with @skill:",
                "skill-model-invocation-disabled",
                skill.path,
                "prompt",
            )
        injected.append(InjectedSkill(name=name, body=skill.body))
    return tuple(injected)
