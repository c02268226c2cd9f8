"""What a definition's keys mean and the rules they must keep, whatever the dialect.

Every dialect is read into :class:`NativeKeys` (the strict ``clonefleet:`` namespace, a pydantic
model with ``extra="forbid"``), so one set of rules applies to all: the name format, tool-name
normalisation (Claude Code aliases, ``Tool(pattern)`` entries, tools clonefleet lacks) and the
tool and model rules of ``docs/definitions.md``. A broken rule raises
``DefinitionError(reason="invalid-definition")`` whose message names the rule and the key.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import DefinitionError
from ..vocab import CONTROL_TOOLS, KNOWN_TOOLS, SPAWN_TOOLS, UNDENIABLE_TOOLS, canonical_tool
from ._model import RESERVED_NAME, LoadReason

__all__ = [
    "NativeKeys",
    "ToolLists",
    "broken_rules",
    "check_expected_name",
    "check_name",
    "pydantic_error",
    "raise_broken",
    "rule_error",
    "tool_lists",
]

Broken = tuple[str, str, str]
"""A broken rule: ``(rule, key, message)``."""

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@+-]{0,127}$")
_PATTERNED_TOOL = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)\((.*)\)$")
_GRANT_SHORTHANDS = ("tag!ALL", "tag!ALL_MCP")


class NativeKeys(BaseModel):
    """The keys allowed under a native definition's ``clonefleet:`` namespace (typos are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, protected_namespaces=())

    model: str | None = None
    """``@mg:GROUP``, an alias or a model id; unknown ids are resolved at spawn time, not here."""
    fallback_models: list[str] = Field(default_factory=list)
    """Models tried after the group's candidates, in order."""
    tools: list[str] | None = None
    """Granted tools; absent = every tool of the caller; ``[]`` = none."""
    tools_deny: list[str] = Field(default_factory=list)
    """Literal tool names removed from the granted set."""
    skills_allow: list[str] = Field(default_factory=list)
    """Skills the subagent may use; empty = all not denied."""
    skills_deny: list[str] = Field(default_factory=list)
    """Skills the subagent may never use."""
    undeferred_tools: list[str] = Field(default_factory=list)
    """Tools whose full schemas are shown up front."""
    autonomous_hint: str | None = None
    """Hint passed to an autonomous permission classifier."""
    auto_facet_hint: str | None = None
    """Older spelling of ``autonomous_hint``; ``autonomous_hint`` wins when both are given."""
    inherit_tools: bool = False
    """Union the caller's tools into ``tools`` at spawn time."""
    allow_subagent_spawn: bool = False
    """Let this subagent spawn subagents of its own."""
    exit_tool_schema: dict[str, Any] | None = None
    """JSON Schema (Draft 2020-12) of the ``exit_tool`` payload."""
    max_turns: int | None = Field(default=None, ge=1)
    """Most model turns of one run."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Token budget of one run."""


def rule_error(rule: str, key: str, message: str, path: str | None) -> DefinitionError:
    """The ``invalid-definition`` error of one broken rule."""
    return DefinitionError(
        f"{message} [rule {rule}, key `{key}`]", LoadReason.INVALID_DEFINITION, path, key
    )


def raise_broken(broken: Sequence[Broken], path: str | None) -> None:
    """Raise one ``invalid-definition`` error naming every broken rule (none: return)."""
    if broken:
        message = "; ".join(f"{msg} [rule {rule}, key `{key}`]" for rule, key, msg in broken)
        raise DefinitionError(message, LoadReason.INVALID_DEFINITION, path, broken[0][1])


def pydantic_error(
    exc: ValidationError, prefix: str, path: str | None, known: Sequence[str]
) -> DefinitionError:
    """Turn pydantic's report into one ``invalid-definition`` error (unknown keys get a guess)."""
    problems: list[str] = []
    first_key = prefix.rstrip(".")
    for i, err in enumerate(exc.errors()):
        key = prefix + ".".join(str(p) for p in err["loc"])
        if i == 0:
            first_key = key
        if err["type"] == "extra_forbidden":
            guess = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
            hint = (
                f"; did you mean `{prefix}{guess[0]}`?"
                if guess
                else f"; known keys: {', '.join(known)}"
            )
            problems.append(f"`{key}` is not a known key{hint} [rule unknown-key]")
        else:
            problems.append(f"`{key}`: {err['msg'].lower()} [rule key-type]")
    return DefinitionError("; ".join(problems), LoadReason.INVALID_DEFINITION, path, first_key)


def check_name(name: object, key: str, path: str | None, *, shipped: bool) -> str:
    """Return a valid definition name or raise (``_default`` only for shipped definitions)."""
    if not isinstance(name, str) or not name.strip():
        raise rule_error(
            "name-required", key, "the definition needs a non-empty string `name`", path
        )
    if not _NAME.match(name):
        raise rule_error(
            "name-format",
            key,
            f"name {name!r} must be 1-128 characters of letters, digits and `_.:@+-`, without spaces",
            path,
        )
    if name == RESERVED_NAME and not shipped:
        raise rule_error(
            "reserved-name",
            key,
            f"`{RESERVED_NAME}` is built in and cannot be replaced; choose another name",
            path,
        )
    return name


def check_expected_name(
    name: str, expected: str | None, path: str | None, *, what: str, advice: str = ""
) -> None:
    """Raise ``name-mismatch`` when ``name`` differs from ``expected`` (``what`` names it)."""
    if expected is not None and name != expected:
        raise DefinitionError(
            f"name {name!r} must equal {what} {expected!r}{advice}",
            LoadReason.NAME_MISMATCH,
            path,
            "name",
        )


# -- tool lists -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolLists:
    """A definition's tool lists with aliases mapped and duplicates dropped."""

    granted: tuple[str, ...] | None
    """``None`` = every tool of the caller."""
    denied: tuple[str, ...]
    undeferred: tuple[str, ...]


def _is_shorthand(tool: str) -> bool:
    return tool.startswith("tag!") or (tool.startswith("mcp__") and "__" not in tool[5:])


def _normalise(
    values: Sequence[str], key: str, warnings: list[str], *, grant: bool
) -> tuple[str, ...]:
    """Map aliases, handle ``Tool(pattern)`` entries and warn about tools clonefleet lacks."""
    out: list[str] = []
    for raw in values:
        name = raw.strip()
        patterned = _PATTERNED_TOOL.match(name)
        if patterned:
            base = canonical_tool(patterned.group(1))
            if grant:
                warnings.append(
                    f"`{key}` entry {raw!r}: argument patterns are not supported; {base} is not granted"
                )
                continue
            warnings.append(
                f"`{key}` entry {raw!r}: argument patterns are not supported; all of {base} is denied"
            )
            name = patterned.group(1)
        name = canonical_tool(name)
        if not name or name in out:
            continue
        if grant and name not in KNOWN_TOOLS and name not in _GRANT_SHORTHANDS:
            warnings.append(
                f"`{key}` names tool {name!r}, which is not available in clonefleet; the definition loads and"
                " the tool is left out unless a host provides it"
            )
        out.append(name)
    return tuple(out)


def tool_lists(keys: NativeKeys, key_names: Mapping[str, str], warnings: list[str]) -> ToolLists:
    """Normalise the granted, denied and undeferred tools, appending warnings in that order."""
    granted = (
        None
        if keys.tools is None
        else _normalise(keys.tools, key_names["tools"], warnings, grant=True)
    )
    denied = _normalise(keys.tools_deny, key_names["tools_deny"], warnings, grant=False)
    undeferred = _normalise(
        keys.undeferred_tools, key_names["undeferred_tools"], warnings, grant=True
    )
    return ToolLists(granted, denied, undeferred)


# -- rules ----------------------------------------------------------------------------------------


def _grant_rules(tools: ToolLists, names: Mapping[str, str]) -> Iterator[Broken]:
    granted = tools.granted or ()
    if "exit_tool" in granted:
        yield (
            "exit-tool-in-tools",
            names["tools"],
            "`exit_tool` is given to every subagent; do not list it",
        )
    for key, listed in (("tools", granted), ("undeferred_tools", tools.undeferred)):
        if "switch_facet" in listed:
            yield (
                "switch-facet-listed",
                names[key],
                "`switch_facet` is never available to a subagent",
            )


def _deny_rules(tools: ToolLists, names: Mapping[str, str]) -> Iterator[Broken]:
    key = names["tools_deny"]
    for tool in tools.denied:
        if tool.startswith("tag!"):
            yield ("tools-deny-tag", key, f"{tool!r}: use literal tool names, not tag! references")
        elif _is_shorthand(tool):
            yield (
                "tools-deny-mcp-shorthand",
                key,
                f"{tool!r}: name full mcp__<server>__<tool> tools",
            )
        elif tool in UNDENIABLE_TOOLS:
            yield ("tools-deny-protected", key, f"{tool!r} cannot be denied")


def _undeferred_rules(
    tools: ToolLists, keys: NativeKeys, names: Mapping[str, str]
) -> Iterator[Broken]:
    key = names["undeferred_tools"]
    for tool in tools.undeferred:
        if tool.startswith("tag!"):
            yield ("undeferred-tag", key, f"{tool!r}: use literal tool names")
        elif tool in tools.denied:
            yield ("deny-and-undeferred", key, f"{tool!r} is also in tools_deny")
    granted = tools.granted
    if keys.inherit_tools or granted is None or any(_is_shorthand(t) for t in granted):
        return  # the granted set is only known at spawn time
    always = set(CONTROL_TOOLS) | (set(SPAWN_TOOLS) if keys.allow_subagent_spawn else set())
    for tool in tools.undeferred:
        if tool not in granted and tool not in always and not tool.startswith("tag!"):
            yield ("undeferred-not-granted", key, f"{tool!r} is undeferred but not in tools")


def _model_rules(model: str | None, names: Mapping[str, str]) -> Iterator[Broken]:
    if model is not None and not model:
        yield (
            "model-format",
            names["model"],
            "`model` must not be empty; omit it for the default group",
        )
    elif model is not None and model.startswith("@mg:") and not model[4:].strip():
        yield ("model-format", names["model"], "`@mg:` must be followed by a model group name")


def broken_rules(
    tools: ToolLists, keys: NativeKeys, model: str | None, names: Mapping[str, str]
) -> list[Broken]:
    """Every broken tool and model rule, tool grants first; ``names`` maps a key to its spelling."""
    return [
        *_grant_rules(tools, names),
        *_deny_rules(tools, names),
        *_undeferred_rules(tools, keys, names),
        *_model_rules(model, names),
    ]
