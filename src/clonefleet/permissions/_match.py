"""Matching a call against rules: commands, paths, hosts and names, each within fixed bounds.

Every matcher here runs in time linear in its input (``*`` patterns by ordered ``str.find``,
path components by a bit-parallel automaton), and every input is capped; an argument that is too
long or cannot be read is *unsure*, which a patterned deny rule denies and no patterned allow
rule allows.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from clonefleet.permissions._commands import read_command, unwrapped
from clonefleet.permissions._rules import (
    MAX_COMMAND_CHARS,
    MAX_COMMAND_PARTS,
    MAX_PATH_CHARS,
    READS_BELOW,
    Form,
    Rule,
    star_match,
)
from clonefleet.vocab import PATH_TOOLS


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


def _deny_variants(part: str) -> set[str]:
    """The ways a deny rule reads a command: as written, unquoted, and without leading variable
    assignments, wrappers (``sudo``, ``env``, ...) or a folder on the program's name."""
    unquoted = " ".join(part.translate({ord(c): None for c in "'\"\\"}).split())
    out = {part, unquoted}
    for text in (part, unquoted):
        rest = unwrapped(text.split(" "))
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
    written: tuple[Any, ...] = ()
    """A command's parts as written, redirections kept: deny rules read them too."""
    writes: tuple[Call, ...] = ()
    """What a command writes (its redirections and output options), each as a ``file_write``
    call of that path (docs/permissions.md#what-a-command-writes)."""
    text: str = ""
    """A written path as the command names it, for messages."""


def describe_call(tool: str, arguments: Mapping[str, Any], cwd: str) -> Call:
    """What the rules of ``tool`` match in ``arguments`` (relative paths start at ``cwd``)."""
    if tool == "shell":
        return _describe_command(arguments.get("command"), cwd)
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


_UNSURE_WRITE = Call("file_write", None, text="a path that cannot be told before it runs")


def _describe_command(command: object, cwd: str) -> Call:
    """A command's parts, and what it writes; one it cannot read may write anything."""
    reading = None
    if isinstance(command, str) and len(command) <= MAX_COMMAND_CHARS:
        reading = read_command(command, MAX_COMMAND_PARTS)
    if reading is None:
        return Call("shell", None, writes=(_UNSURE_WRITE,))
    writes = tuple(
        _UNSURE_WRITE
        if target is None
        else replace(describe_call("file_write", {"path": target}, cwd), text=target)
        for target in reading.targets
    )
    return Call("shell", reading.parts, written=reading.written, writes=writes)


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
    subjects = (*call.subjects, *call.written)
    return any(_matches(rule, s, root, deny=True, below=call.below) for s in subjects)


def allowed(rules: Sequence[Rule], call: Call, root: str) -> bool:
    """Every subject of the call (each part of a compound command) matched by some rule."""
    if any(r.form is Form.ANY for r in rules):
        return True
    if not call.subjects:
        return False
    return all(
        any(_matches(r, s, root, deny=False, below=False) for r in rules) for s in call.subjects
    )
