"""Rules and rule sets: what ``Tool``, ``Tool(pattern)`` and ``mcp__server__*`` mean, parsed once.

A :class:`Rule` keeps its text (messages name a rule as it was written) and its pattern in a
normalised form the matchers of ``_match`` read. Parsing never compiles a user's text into a
regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from clonefleet.vocab import CONTROL_TOOLS, JOB_TOOLS, PATH_TOOLS, SEARCH_TOOLS, canonical_tool

MAX_RULE_CHARS = 1000
"""Longest rule, in characters."""
MAX_RULES = 256
"""Most rules of one list (``allow`` or ``deny``) of one layer."""
MAX_COMMAND_CHARS = 100_000
MAX_COMMAND_PARTS = 512
MAX_PATH_CHARS = 4096
MAX_NAME_CHARS = 255
MAX_PATH_PARTS = 32

EXEMPT_TOOLS: frozenset[str] = frozenset((*CONTROL_TOOLS, *JOB_TOOLS)) - {"subagent"}
"""Tools the policy never checks and no deny rule may name: ending a run, reporting progress,
finding tools, loading skills (``skills_allow``/``skills_deny`` decide those) and watching or
stopping the caller's own subagents."""

FAMILY: dict[str, frozenset[str]] = {
    "file_read": frozenset(SEARCH_TOOLS),
    "file_edit": frozenset({"file_write", "notebook_edit"}),
}
"""As in Claude Code, ``Read`` rules also govern the tools that read files and ``Edit`` rules the
tools that change them."""
READS_BELOW = frozenset({"grep"})
"""Tools that read the contents of everything under their ``path``."""


def star_match(pattern: str, text: str) -> bool:
    """``*`` matches any text; everything else is literal. Linear: no backtracking."""
    pieces = pattern.split("*")
    if len(pieces) == 1:
        return pattern == text
    first, last = pieces[0], pieces[-1]
    if len(text) < len(first) + len(last) or not text.startswith(first) or not text.endswith(last):
        return False
    pos, end = len(first), len(text) - len(last)
    for piece in pieces[1:-1]:
        found = text.find(piece, pos, end)
        if found < 0:
            return False
        pos = found + len(piece)
    return True


class Default(StrEnum):
    """What a layer decides for a tool none of its allow rules names."""

    ALLOW = "allow"
    DENY = "deny"


class Form(StrEnum):
    """What a rule's pattern is matched against, and how."""

    ANY = "any"
    """A bare tool name: every call of the tool."""
    PREFIX = "prefix"
    EXACT = "exact"
    GLOB = "glob"
    PATH = "path"
    DOMAIN = "domain"
    NAME = "name"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One parsed rule; build it with :func:`parse_rule`."""

    text: str
    """The rule as written (``Bash(git diff:*)``); messages name it so."""
    key: str = ""
    """Where it was written (``permissions.deny``, ``disallowedTools``)."""
    tool: str
    """The canonical tool name, or a ``*`` pattern of names (``mcp__github__*``)."""
    form: Form = Form.ANY
    value: str = ""
    """The normalised pattern: a command, a domain, a subagent name."""
    anchor: str = ""
    """Path patterns: ``launch`` (``./x``, ``x/y``), ``abs`` (``//x``), ``home`` (``~/x``)."""
    parts: tuple[str, ...] = ()
    """Path patterns: the components, ``**`` for any number of folders."""

    def applies_to(self, tool: str) -> bool:
        """Whether this rule is about ``tool``."""
        if tool == self.tool or tool in FAMILY.get(self.tool, ()):
            return True
        return "*" in self.tool and star_match(self.tool, tool)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleSet:
    """The rules of one layer before it is bound to a launch directory (config or definition)."""

    source: str = ""
    """Who wrote them, for messages: ``config``, ``definition reviewer``."""
    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    default: Default = Default.ALLOW
    """For a tool no allow rule names: ``allow`` it, or ``deny`` it."""

    @property
    def is_empty(self) -> bool:
        """True when the rules allow every call."""
        return not self.allow and not self.deny and self.default is Default.ALLOW


# -- parsing --------------------------------------------------------------------------------------

_RULE = re.compile(r"([A-Za-z0-9_*][A-Za-z0-9_.*-]*)(?:\((.*)\))?", re.DOTALL)
_DOMAIN = re.compile(r"(\*|(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*)")


def parse_rule(text: str, key: str = "") -> Rule:
    """Parse one rule: ``Tool``, ``Tool(pattern)`` or an MCP name with ``*`` wildcards.

    Claude Code names become canonical (``Bash`` is ``shell``); ``mcp__server`` means every tool
    of that server. Patterns: ``shell`` takes a command (``git diff:*`` = a word prefix, else
    exact, ``*`` any text); file tools a gitignore-style path (``./src/**``, ``//abs``, ``~/x``,
    ``*.env``); ``web_fetch`` a ``domain:host`` (``domain:*.host`` for its subdomains);
    ``subagent`` a subagent name.

    Raises:
        ValueError: the rule cannot be read; the message says why.
    """
    if not isinstance(text, str):
        raise ValueError(f"a rule is text, not {type(text).__name__}")
    raw = text.strip()
    if not raw or len(raw) > MAX_RULE_CHARS:
        raise ValueError(f"a rule has 1 to {MAX_RULE_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise ValueError(f"{raw!r} contains control characters")
    match = _RULE.fullmatch(raw)
    if match is None:
        raise ValueError(f"{raw!r} is not a rule: write Tool, Tool(pattern) or mcp__server__*")
    tool = canonical_tool(match.group(1))
    if tool.startswith("mcp__") and "__" not in tool[5:]:
        tool += "__*"
    spec = match.group(2)
    if spec is None or spec.strip() == "*":
        return Rule(text=raw, key=key, tool=tool)
    if "*" in tool:
        raise ValueError(f"{raw!r}: a tool-name wildcard takes no argument pattern")
    return _patterned(raw, key, tool, spec.strip())


def _patterned(raw: str, key: str, tool: str, spec: str) -> Rule:
    if not spec:
        raise ValueError(f"{raw!r}: the pattern is empty")
    base = Rule(text=raw, key=key, tool=tool)
    if tool == "shell":
        if spec.endswith(":*"):
            prefix = " ".join(spec[:-2].split())
            if not prefix:
                raise ValueError(f"{raw!r}: write a command before `:*`")
            return _with(base, form=Form.PREFIX, value=prefix)
        form = Form.GLOB if "*" in spec else Form.EXACT
        return _with(base, form=form, value=" ".join(spec.split()))
    if tool in PATH_TOOLS:
        anchor, parts = _path_pattern(raw, spec)
        return _with(base, form=Form.PATH, anchor=anchor, parts=parts)
    if tool == "web_fetch":
        domain = spec[7:].strip().lower().rstrip(".") if spec.startswith("domain:") else ""
        if not _DOMAIN.fullmatch(domain):
            raise ValueError(f"{raw!r}: write WebFetch(domain:example.com) or domain:*.example.com")
        return _with(base, form=Form.DOMAIN, value=domain)
    if tool == "subagent":
        return _with(base, form=Form.NAME, value=spec)
    raise ValueError(f"{raw!r}: {tool} takes no argument pattern; name the tool alone")


def _with(rule: Rule, **changes: Any) -> Rule:
    return replace(rule, **changes)


def _path_pattern(raw: str, spec: str) -> tuple[str, tuple[str, ...]]:
    """``(anchor, components)`` of a gitignore-style path pattern."""
    if spec.startswith("//"):
        anchor, rest = "abs", spec[2:]
    elif spec == "~" or spec.startswith("~/"):
        anchor, rest = "home", spec[1:]
    elif spec.startswith("./") or spec == ".":
        anchor, rest = "launch", spec[1:]
    elif spec.startswith("/"):
        raise ValueError(
            f"{raw!r}: a path starting with one `/` is ambiguous; write //abs/path for an absolute"
            " path or ./path for one in the launch directory"
        )
    else:
        # gitignore: a slash before the end anchors the pattern; without one it matches a name
        # at any depth.
        anchor, rest = ("launch" if "/" in spec.rstrip("/") else "any"), spec
    parts: list[str] = []
    for part in rest.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise ValueError(f"{raw!r}: `..` is not allowed in a path pattern")
        if len(part) > MAX_NAME_CHARS:
            raise ValueError(
                f"{raw!r}: a path component is longer than {MAX_NAME_CHARS} characters"
            )
        if not (part == "**" and parts[-1:] == ["**"]):
            parts.append(part)
    if len(parts) > MAX_PATH_PARTS:
        raise ValueError(f"{raw!r}: a path pattern has at most {MAX_PATH_PARTS} components")
    if anchor == "any":
        anchor, parts = "abs", ["**", *parts]
    return anchor, tuple(parts)


def parse_rules(texts: Iterable[str], key: str, *, deny: bool = False) -> tuple[Rule, ...]:
    """Parse a list of rules written under ``key``; deny rules may not name :data:`EXEMPT_TOOLS`.

    Raises:
        ValueError: naming the first bad entry and why.
    """
    rules: list[Rule] = []
    for i, text in enumerate(texts):
        if i >= MAX_RULES:
            raise ValueError(f"{key} has more than {MAX_RULES} rules")
        try:
            rule = parse_rule(text, key)
        except ValueError as exc:
            raise ValueError(f"{key} entry {i + 1}: {exc}") from None
        if deny and rule.tool in EXEMPT_TOOLS:
            raise ValueError(f"{key} entry {i + 1}: {rule.tool} cannot be denied")
        rules.append(rule)
    return tuple(rules)
