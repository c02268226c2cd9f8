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
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clonefleet.definitions._definition import RESERVED_NAME, LoadReason
from clonefleet.errors import DefinitionError
from clonefleet.permissions import EXEMPT_TOOLS, Default, Rule, RuleSet, parse_rule
from clonefleet.vocab import (
    CONTROL_TOOLS,
    KNOWN_TOOLS,
    SPAWN_TOOLS,
    UNDENIABLE_TOOLS,
    canonical_tool,
)

__all__ = [
    "NativeKeys",
    "PermissionKeys",
    "ToolLists",
    "base_tool",
    "broken_rules",
    "claude_permissions",
    "claude_spawn",
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


class PermissionKeys(BaseModel):
    """A definition's ``permissions`` table: its own layer of the permission policy."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    allow: list[str] = Field(default_factory=list)
    """Rules (``Bash(git diff:*)``); a tool they name may run only as one of them says."""
    deny: list[str] = Field(default_factory=list)
    """Rules that deny matching calls, for this subagent and every subagent it spawns."""
    default: Literal["allow", "deny"] = "allow"
    """For a tool no allow rule of this definition names (its ``tools`` entries included)."""


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
    subagent_provider: Literal["spawn", "fork"] | None = None
    """How its ``subagent`` tool starts children: ``spawn`` or ``fork``; ``None`` = the config's."""
    exit_tool_schema: dict[str, Any] | None = None
    """JSON Schema (Draft 2020-12) of the ``exit_tool`` payload."""
    max_turns: int | None = Field(default=None, ge=1)
    """Most model turns of one run."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Token budget of one run."""
    permissions: PermissionKeys | None = None
    """Allow and deny rules of this definition's layer of the policy (docs/permissions.md)."""
    mcp_servers: dict[str, Any] | list[Any] | None = None
    """MCP servers of this subagent: name → server entry, or a list of configured servers'
    names (``definitions._mcp``, docs/mcp.md)."""


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
            where, names = prefix, known
            if err["loc"][:1] == ("permissions",) and len(err["loc"]) == 2:
                where, names = f"{prefix}permissions.", list(PermissionKeys.model_fields)
            guess = difflib.get_close_matches(str(err["loc"][-1]), names, n=1)
            hint = (
                f"; did you mean `{where}{guess[0]}`?"
                if guess
                else f"; known keys: {', '.join(names)}"
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
    """A definition's tool lists with aliases mapped and duplicates dropped, and its rules."""

    granted: tuple[str, ...] | None
    """``None`` = every tool of the caller."""
    denied: tuple[str, ...]
    undeferred: tuple[str, ...]
    rules: RuleSet = RuleSet()
    """The definition's layer of the permission policy (its ``source`` is set by the builder)."""
    problems: tuple[Broken, ...] = ()
    """Unreadable rules of a native or python definition (a claude file gets warnings)."""


def _is_shorthand(tool: str) -> bool:
    return tool.startswith("tag!") or (tool.startswith("mcp__") and "__" not in tool[5:])


@dataclass(slots=True)
class _Reading:
    """What reading the tool lists and rules found: warnings, and problems that are errors."""

    warnings: list[str]
    strict: bool
    """Native and python definitions: an unreadable rule is an error, not a warning."""
    problems: list[Broken] = field(default_factory=list)

    def rule(self, text: str, key: str, *, deny: bool) -> Rule | None:
        """``text`` as a rule; ``None`` (with a problem or a warning) when it cannot be one.

        A claude file's unreadable ``Tool(pattern)`` deny entry denies all of the tool.
        """
        try:
            rule = parse_rule(text, key)
        except ValueError as exc:
            patterned = _PATTERNED_TOOL.match(text.strip())
            if self.strict:
                self.problems.append(("permission-rule", key, str(exc)))
            elif deny and patterned:
                self.warnings.append(
                    f"`{key}` entry {text!r}: {exc}; all of {canonical_tool(patterned.group(1))}"
                    " is denied"
                )
                return self.rule(patterned.group(1), key, deny=True)
            else:
                what = "the tool is not granted" if key.endswith("tools") else "it is ignored"
                self.warnings.append(f"`{key}` entry {text!r}: {exc}; {what}")
            return None
        if deny and rule.tool in EXEMPT_TOOLS:
            # A `tools_deny` entry breaks tools-deny-protected instead (or is a patterned one).
            if "permissions" in key:
                self._unreadable(text, key, f"{rule.tool} cannot be denied")
            return None
        return rule

    def _unreadable(self, text: str, key: str, problem: str) -> None:
        if self.strict:
            self.problems.append(("permission-rule", key, f"{text!r}: {problem}"))
        else:
            self.warnings.append(f"`{key}` entry {text!r}: {problem}; it is ignored")


def _normalise(
    values: Sequence[str], key: str, reading: _Reading, *, grant: bool
) -> tuple[tuple[str, ...], list[Rule]]:
    """Map aliases and warn about tools clonefleet lacks; every entry is a rule too. A
    ``Tool(pattern)`` entry grants the tool only for calls that match, or denies only those."""
    out: list[str] = []
    rules: list[Rule] = []
    for raw in values:
        name = raw.strip()
        if not name:
            continue
        patterned = _PATTERNED_TOOL.match(name)
        if patterned is not None:
            rule = reading.rule(name, key, deny=not grant)
            if rule is None:
                continue
            rules.append(rule)
            if not grant and rule.text == name:
                continue  # a deny of the matching calls only: the tool stays
            name = patterned.group(1)
        elif not name.startswith("tag!"):
            with suppress(ValueError):  # a name no rule can spell stays out of the layer
                bare = parse_rule(name, key)
                if grant or bare.tool not in EXEMPT_TOOLS:
                    rules.append(bare)
        name = canonical_tool(name)
        if name in out:
            continue
        if grant and name.startswith("mcp__"):
            reading.warnings.append(
                f"`{key}` names MCP tool {name!r}: a clone gets it only where its server is"
                " configured (config `mcp_servers` or the definition's own)"
            )
        elif grant and name not in KNOWN_TOOLS and name not in _GRANT_SHORTHANDS:
            reading.warnings.append(
                f"`{key}` names tool {name!r}, which is not available in clonefleet; the definition loads and"
                " the tool is left out unless a host provides it"
            )
        out.append(name)
    return tuple(out), rules


def _permission_rules(
    keys: NativeKeys, key: str, reading: _Reading
) -> tuple[list[Rule], list[Rule], Default]:
    table = keys.permissions
    if table is None:
        return [], [], Default.ALLOW
    allow = [reading.rule(t, f"{key}.allow", deny=False) for t in table.allow]
    deny = [reading.rule(t, f"{key}.deny", deny=True) for t in table.deny]
    return (
        [r for r in allow if r is not None],
        [r for r in deny if r is not None],
        Default(table.default),
    )


def tool_lists(
    keys: NativeKeys, key_names: Mapping[str, str], warnings: list[str], *, strict: bool = True
) -> ToolLists:
    """Normalise the granted, denied and undeferred tools, appending warnings in that order, and
    gather the definition's rules: its ``tools`` and ``tools_deny`` entries and its
    ``permissions`` table. ``strict`` (native, python): an unreadable rule is a problem."""
    reading = _Reading(warnings, strict)
    granted: tuple[str, ...] | None = None
    allow: list[Rule] = []
    if keys.tools is not None:
        granted, allow = _normalise(keys.tools, key_names["tools"], reading, grant=True)
    denied, deny = _normalise(keys.tools_deny, key_names["tools_deny"], reading, grant=False)
    undeferred, _ = _normalise(
        keys.undeferred_tools, key_names["undeferred_tools"], _Reading(warnings, False), grant=True
    )
    more_allow, more_deny, default = _permission_rules(keys, key_names["permissions"], reading)
    rules = RuleSet(allow=tuple(allow + more_allow), deny=tuple(deny + more_deny), default=default)
    return ToolLists(granted, denied, undeferred, rules, tuple(reading.problems))


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
        *tools.problems,
        *_deny_rules(tools, names),
        *_undeferred_rules(tools, keys, names),
        *_model_rules(model, names),
    ]


# -- claude files ---------------------------------------------------------------------------------


def base_tool(entry: str) -> tuple[str, bool]:
    """The canonical tool an entry names, and whether it carries a pattern."""
    patterned = _PATTERNED_TOOL.match(entry.strip())
    return canonical_tool(patterned.group(1) if patterned else entry.strip()), bool(patterned)


def claude_spawn(
    tools: Sequence[str] | None, denied: Sequence[str], warnings: list[str]
) -> tuple[bool, list[str]]:
    """Whether a claude file may spawn, and its ``disallowedTools`` left for ``tools_deny``.

    Listing Claude Code's subagent tool (``Task``, ``Agent``) in ``tools`` allows spawning;
    naming it in ``disallowedTools`` forbids it (``tools_deny`` may not name ``subagent``, so it
    is taken out of the list). A Claude Code name for a tool every subagent keeps (``Skill``,
    ``TaskList``, ``TaskGet``, …) is left out of ``disallowedTools`` with a warning: such a file
    loads, as it did before those names meant anything here. The tools' own names still break
    the ``tools-deny-protected`` rule.
    """
    kept: list[str] = []
    no_spawn = False
    for entry in denied:
        tool, patterned = base_tool(entry)
        if tool == "subagent" and not patterned:
            no_spawn = True
        elif tool in UNDENIABLE_TOOLS and not patterned and entry.strip() != tool:
            warnings.append(
                f"`disallowedTools` entry {entry.strip()!r} is ignored: {tool} cannot be denied"
            )
        else:
            kept.append(entry)
    spawn = not no_spawn and any(base_tool(t)[0] == "subagent" for t in tools or ())
    return spawn, kept


def claude_permissions(
    value: object, path: str | None, warnings: list[str]
) -> PermissionKeys | None:
    """A claude file's ``permissions`` in Claude Code settings' shape: ``allow`` and ``deny``
    rules; ``ask`` rules deny (a subagent has no one to ask); other keys are ignored.

    Raises:
        DefinitionError: ``permissions`` or one of its lists has the wrong type.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise rule_error("key-type", "permissions", "`permissions` must be a mapping", path)
    lists: dict[str, list[str]] = {}
    for key, items in value.items():
        if key not in ("allow", "deny", "ask"):
            warnings.append(
                f"key `permissions.{key}` is not supported by clonefleet and is ignored"
            )
            continue
        items = [items] if isinstance(items, str) else items
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise rule_error(
                "key-type",
                f"permissions.{key}",
                f"`permissions.{key}` must be a list of rules",
                path,
            )
        lists[key] = items
    if lists.get("ask"):
        warnings.append("`permissions.ask` rules deny their calls: a subagent has no one to ask")
    return PermissionKeys.model_construct(
        allow=lists.get("allow", []), deny=[*lists.get("deny", []), *lists.get("ask", [])]
    )
