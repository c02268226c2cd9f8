"""Matching a call against rules: commands, paths, hosts and names, each within fixed bounds.

Every matcher here runs in time linear in its input (``*`` patterns by ordered ``str.find``,
path components by a bit-parallel automaton), and every input is capped; an argument that is too
long or cannot be read is *unsure*, which a patterned deny rule denies and no patterned allow
rule allows.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..vocab import PATH_TOOLS
from ._rules import (
    MAX_COMMAND_CHARS,
    MAX_COMMAND_PARTS,
    MAX_PATH_CHARS,
    READS_BELOW,
    Form,
    Rule,
    star_match,
)


def _name_match(pattern: str, name: str) -> bool:
    """One path component against a pattern of ``*`` and ``?`` (a bit-parallel automaton, so the
    cost is one step per character of ``name`` whatever the pattern)."""
    if "?" not in pattern:
        return star_match(pattern, name)
    literal: dict[str, int] = {}
    anyone = star = 0
    size = 0
    for ch in pattern:
        if ch == "*":
            if not (star >> (size - 1) & 1 if size else False):
                star |= 1 << size
                size += 1
            continue
        if ch == "?":
            anyone |= 1 << size
        else:
            literal[ch] = literal.get(ch, 0) | 1 << size
        size += 1
    state = _closure(1, star)
    for ch in name:
        state = ((state & (literal.get(ch, 0) | anyone)) << 1) | (state & star)
        if not state:
            return False
        state = _closure(state, star)
    return bool(state >> size & 1)


def _closure(state: int, stars: int) -> int:
    """Add the states after a ``*`` that may match nothing."""
    while True:
        grown = state | ((state & stars) << 1)
        if grown == state:
            return state
        state = grown


def _path_match(pattern: Sequence[str], path: Sequence[str], *, below: bool = False) -> bool:
    """Components of ``path`` against ``pattern`` (``**`` = any number of components). With
    ``below``, also true when something under ``path`` could match."""
    stars = sum(1 << i for i, p in enumerate(pattern) if p == "**")
    state = _closure(1, stars)
    for name in path:
        step = 0
        for i, part in enumerate(pattern):
            if state >> i & 1 and part != "**" and _name_match(part, name):
                step |= 1 << (i + 1)
        state = _closure(step | (state & stars), stars)
        if not state:
            return False
    return bool(state) if below else bool(state >> len(pattern) & 1)


def _components(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p)


# Every shell separator, substitution and grouping starts a new command part; quotes are not
# parsed, so text inside them may split too. That only ever makes a check stricter.
_SPLIT = re.compile(r"\$\(|&&|\|\||[;&|\n\r`(){}]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = frozenset(
    "! env command exec nohup time sudo doas builtin nice xargs timeout stdbuf"
    " if then else elif do while until".split()
)


def _command_parts(command: object) -> list[str] | None:
    """The simple commands of a command line, whitespace collapsed; ``None`` when too big."""
    if not isinstance(command, str) or len(command) > MAX_COMMAND_CHARS:
        return None
    parts = [" ".join(p.split()) for p in _SPLIT.split(command)]
    parts = [p for p in parts if p] or [""]
    return parts if len(parts) <= MAX_COMMAND_PARTS else None


def _deny_variants(part: str) -> set[str]:
    """The ways a deny rule reads a command: as written, unquoted, and without leading variable
    assignments, wrappers (``sudo``, ``env``, ...) or a folder on the program's name."""
    unquoted = " ".join(part.translate({ord(c): None for c in "'\"\\"}).split())
    out = {part, unquoted}
    for text in (part, unquoted):
        words = text.split(" ")
        i, wrapped = 0, False
        while i < len(words) and (
            words[i] in _WRAPPERS
            or _ASSIGNMENT.match(words[i])
            or (wrapped and (words[i].startswith("-") or words[i].replace(".", "").isdigit()))
        ):
            wrapped = wrapped or words[i] in _WRAPPERS
            i += 1
        rest = words[i:]
        if rest and "/" in rest[0]:
            rest = [rest[0].rsplit("/", 1)[1], *rest[1:]]
        out.add(" ".join(rest))
    return out


def _host(url: object) -> str | None:
    """The host a URL reaches, lower-cased; ``None`` when it cannot be told for sure."""
    if not isinstance(url, str) or len(url) > 8192 or any(c in url for c in "\\ \t\r\n"):
        return None
    try:
        host = urlsplit(url.strip()).hostname
    except ValueError:
        return None
    if not host or "%" in host:
        return None
    return host.rstrip(".").lower()


@dataclass(frozen=True, slots=True)
class Call:
    """A call as the rules see it: what its argument pattern is matched against."""

    tool: str
    subjects: tuple[Any, ...] | None
    """Command parts, ``(components, real)`` paths, a host or a name; ``None`` when the argument
    cannot be checked (too long, unreadable): deny rules with patterns then deny."""
    below: bool = False


def describe_call(tool: str, arguments: Mapping[str, Any], cwd: str) -> Call:
    """What the rules of ``tool`` match in ``arguments`` (relative paths start at ``cwd``)."""
    if tool == "shell":
        parts = _command_parts(arguments.get("command"))
        return Call(tool, None if parts is None else tuple(parts))
    if tool in PATH_TOOLS:
        raw = next(
            (arguments[k] for k in ("path", "notebook_path", "file_path") if k in arguments), "."
        )
        if not isinstance(raw, str) or "\0" in raw or len(raw) > MAX_PATH_CHARS:
            return Call(tool, None)
        # `..` is folded before matching, so `src/../secret` is checked as `secret`; the real
        # path (links resolved) is checked too, as the file tools will open it.
        lexical = posixpath.normpath(posixpath.join(cwd, raw))
        real = os.path.realpath(lexical)
        paths = {(_components(lexical), False), (_components(real), True)}
        return Call(tool, tuple(sorted(paths)), below=tool in READS_BELOW)
    if tool == "web_fetch":
        host = _host(arguments.get("url"))
        return Call(tool, None if host is None else (host,))
    if tool == "subagent":
        name = arguments.get("subagent_type") or "_default"
        return Call(tool, (name,) if isinstance(name, str) else None)
    return Call(tool, ())


def _matches(rule: Rule, subject: Any, root: str, *, deny: bool, below: bool) -> bool:
    """Whether a patterned rule matches one subject of a call."""
    if rule.form in (Form.PREFIX, Form.EXACT, Form.GLOB):
        texts = _deny_variants(subject) if deny else (subject,)
        return any(_command_match(rule, text) for text in texts)
    if rule.form is Form.PATH:
        parts, real = subject
        return _path_match(_anchored(rule, root, real), parts, below=below and deny)
    if rule.form is Form.DOMAIN:
        if rule.value == "*":
            return True
        if rule.value.startswith("*."):
            return bool(subject.endswith(rule.value[1:]))
        return bool(subject == rule.value)
    return star_match(rule.value, subject)


def _command_match(rule: Rule, text: str) -> bool:
    if rule.form is Form.PREFIX:
        return text == rule.value or text.startswith(rule.value + " ")
    if rule.form is Form.EXACT:
        return text == rule.value
    return star_match(rule.value, text)


def _anchored(rule: Rule, root: str, real: bool) -> tuple[str, ...]:
    if rule.anchor == "launch":
        base = _components(os.path.realpath(root) if real else root)
    elif rule.anchor == "home":
        base = _components(os.path.expanduser("~"))
    else:
        base = ()
    tail = () if rule.parts[-1:] == ("**",) else ("**",)  # a folder's rule covers what is in it
    return (*base, *rule.parts, *tail)


def denies(rule: Rule, call: Call, root: str) -> bool:
    """Whether deny ``rule`` matches some subject of the call (any part of a compound command,
    the lexical or the real path); a call whose argument cannot be checked is denied."""
    if not rule.applies_to(call.tool):
        return False
    if rule.form is Form.ANY or call.subjects is None:
        return True
    return any(_matches(rule, s, root, deny=True, below=call.below) for s in call.subjects)


def allowed(rules: Sequence[Rule], call: Call, root: str) -> bool:
    """Every subject of the call (each part of a compound command) matched by some rule."""
    if any(r.form is Form.ANY for r in rules):
        return True
    if not call.subjects:
        return False
    return all(
        any(_matches(r, s, root, deny=False, below=False) for r in rules) for s in call.subjects
    )
