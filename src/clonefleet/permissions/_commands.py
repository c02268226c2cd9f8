"""Reading a ``shell`` command for the rules: its simple commands and the files it writes.

A command's output redirections (``>``, ``>>``, ``>|``, ``&>``, ``2>``, ``<>``, ``>&file``) and
the output options of a few commands often granted as read-only (``git ... --output``, ``sort
-o``, ``tee``, ``find -fprint``) are its *write targets*: the rules check each one as a write of
that path, apart from the command (docs/permissions.md#what-a-command-writes). Quotes are not
parsed: a ``>`` inside quotes is read as a redirection too, which only ever makes a check
stricter, and a target that cannot be told for sure (``$VAR``, ``*``, a quote inside a word, a
relative path after ``cd``) is read as *unsure*.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MAX_WRITE_TARGETS = 8
"""Different write targets one command may have; past it the whole command is unsure (each
target costs a path check against every ``Write``/``Edit`` rule)."""

# Every shell separator, substitution and grouping starts a new command part; quotes are not
# parsed, so text inside them may split too. That only ever makes a check stricter.
_SPLIT = re.compile(r"\$\(|&&|\|\||[;&|\n\r`(){}]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = frozenset(
    "! env command exec nohup time sudo doas builtin nice xargs timeout stdbuf"
    " if then else elif do while until".split()
)
_WORD_END = frozenset(" \t\n\r;&|()<>`")
_UNSURE_CHARS = frozenset("'\"\\$`*?[]{}")
_NOT_WRITES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_MOVERS = frozenset({"cd", "pushd", "popd"})
"""Programs that change the folder later parts of the command run in."""


@dataclass(frozen=True, slots=True)
class Reading:
    """A command as the rules read it."""

    parts: tuple[str, ...]
    """Its simple commands with the redirections taken out, whitespace collapsed."""
    written: tuple[str, ...]
    """Its simple commands as written (redirections kept), for deny rules."""
    targets: tuple[str | None, ...]
    """The paths it writes, ``~`` expanded; ``None`` for a target that cannot be told."""


def split_parts(command: str) -> list[str]:
    """The simple commands of a command line, whitespace collapsed (at least one, maybe ``""``)."""
    parts = [" ".join(p.split()) for p in _SPLIT.split(command)]
    return [p for p in parts if p] or [""]


def unwrapped(words: list[str]) -> list[str]:
    """The words from the program on: leading variable assignments and wrappers (``sudo``,
    ``env``, ``timeout 5``, ...) with their options dropped."""
    i, wrapped = 0, False
    while i < len(words) and (
        words[i] in _WRAPPERS
        or _ASSIGNMENT.match(words[i])
        or (wrapped and (words[i].startswith("-") or words[i].replace(".", "").isdigit()))
    ):
        wrapped = wrapped or words[i] in _WRAPPERS
        i += 1
    return words[i:]


def read_command(command: str, max_parts: int) -> Reading | None:
    """The parts and write targets of ``command``; ``None`` past ``max_parts`` parts or
    :data:`MAX_WRITE_TARGETS` targets."""
    stripped, targets = _redirections(command)
    parts = split_parts(stripped)
    written = split_parts(command)
    if len(parts) > max_parts or len(written) > max_parts:
        return None
    moved = False
    for part in parts:
        words = unwrapped(part.split(" "))
        program = words[0].rsplit("/", 1)[-1] if words else ""
        moved = moved or program in _MOVERS
        targets.extend(_option_targets(program, words[1:]))
    targets = list(dict.fromkeys(targets))
    if len(targets) > MAX_WRITE_TARGETS:
        return None
    # After a `cd` the shell's folder is no longer the launch directory: a relative target
    # could be anywhere.
    sure = [_expanded(t, moved) for t in targets]
    return Reading(parts=tuple(parts), written=tuple(written), targets=tuple(sure))


def _expanded(target: str | None, moved: bool) -> str | None:
    if target is None:
        return None
    if target == "~" or target.startswith("~/"):
        return os.path.expanduser("~") + target[1:]
    if target.startswith("~") or (moved and not target.startswith("/")):
        return None
    return target


def _redirections(command: str) -> tuple[str, list[str | None]]:
    """``command`` with its output redirections blanked out, and their targets."""
    kept: list[str] = []
    targets: list[str | None] = []
    start = i = 0
    while (at := command.find(">", i)) >= 0:
        begin = _operator_start(command, at)
        end = at + 1
        if command[end : end + 1] in (">", "|") and command[at - 1 : at] != "<":
            end += 1
        if command[end : end + 1] == "(" and end == at + 1:  # >(...): a process substitution
            i = end
            continue
        duplicate = command[end : end + 1] == "&"
        end += duplicate
        word_end, target = _target_word(command, end)
        if duplicate and target is not None and re.fullmatch(r"\d*-?", target):
            target = "/dev/stdout"  # >&2, >&-: a descriptor, not a file
        if target not in _NOT_WRITES:
            targets.append(target)
        kept.append(command[start:begin])
        kept.append(" ")
        start = i = max(word_end, end)
    kept.append(command[start:])
    return "".join(kept), targets


def _operator_start(command: str, at: int) -> int:
    """Where the redirection whose ``>`` is at ``at`` starts: a ``<`` (``<>``) or a descriptor
    number that is a word of its own (``2>``). The ``&`` of ``&>`` is left in place: ``/bin/sh``
    may read it as ``&`` then ``>``, so it still separates two commands."""
    if command[at - 1 : at] == "<":
        at -= 1
    begin = at
    while begin > 0 and command[begin - 1].isdigit():
        begin -= 1
    if begin < at and (begin == 0 or command[begin - 1] in _WORD_END):
        return begin
    return at


def _target_word(command: str, at: int) -> tuple[int, str | None]:
    """The word after a redirection operator: where it ends, and the path it names (``None``
    when it cannot be told for sure).

    Quotes are not followed: the word ends at the first blank or shell metacharacter, so taking
    it out of the command never hides a separator (``> " ; rm x"`` leaves ``; rm x`` in place).
    """
    while command[at : at + 1] in (" ", "\t"):
        at += 1
    end = at
    while end < len(command) and command[end] not in _WORD_END:
        end += 1
    return end, path_word(command[at:end])


def path_word(word: str) -> str | None:
    """The path a shell word names, when that can be told without running the shell: plain, or
    wholly in simple quotes."""
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        inner = word[1:-1]
        if inner and not any(c in inner for c in "'\"\\$`"):
            return inner
        return None
    if not word or any(c in _UNSURE_CHARS for c in word):
        return None
    return word


def _option_targets(program: str, args: list[str]) -> list[str | None]:
    """The files ``program`` writes by its own options (``None``: an option's value is
    missing or cannot be told)."""
    if program == "git":
        return _git_targets(args)
    if program == "sort":
        return _short_or_long(args, short="o", long=("--output",), with_value="kStT")
    if program == "tee":
        return _operands(args)
    if program == "find":
        out: list[str | None] = []
        for i, arg in enumerate(args):
            if arg in ("-fprint", "-fprint0", "-fprintf", "-fls"):
                out.append(path_word(args[i + 1]) if i + 1 < len(args) else None)
        return out
    return []


def _git_targets(args: list[str]) -> list[str | None]:
    i, moved = 0, False
    while i < len(args) and args[i].startswith("-"):  # git's own options, before the command
        moved = moved or args[i].startswith("-C")
        i += 2 if args[i] in ("-C", "-c", "--git-dir", "--work-tree", "--namespace") else 1
    if i >= len(args):
        return []
    short = "o" if args[i] in ("format-patch", "archive") else ""
    found = _short_or_long(
        args[i + 1 :], short=short, long=("--output", "--output-directory"), with_value=""
    )
    # `git -C dir` runs in `dir`: its relative targets are not in the launch directory.
    return [None if moved and t is not None and not t.startswith("/") else t for t in found]


def _short_or_long(
    args: list[str], *, short: str, long: tuple[str, ...], with_value: str
) -> list[str | None]:
    """Values of a short option (``-o F``, ``-oF``, ``-uo F``) and of long ones or any
    abbreviation of them (``--output=F``, ``--out F``), up to ``--``."""
    out: list[str | None] = []
    for i, arg in enumerate(args):
        following = path_word(args[i + 1]) if i + 1 < len(args) else None
        if arg == "--":
            break
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if len(name) > 2 and any(full.startswith(name) for full in long):
                out.append(path_word(value) if eq else following)
        elif short and arg.startswith("-") and len(arg) > 1:
            for j, flag in enumerate(arg[1:], start=1):
                if flag in with_value:
                    break
                if flag == short:
                    out.append(path_word(arg[j + 1 :]) if j + 1 < len(arg) else following)
                    break
    return out


def _operands(args: list[str]) -> list[str | None]:
    """Every operand: each argument that is not an option, and all after ``--``."""
    out: list[str | None] = []
    options = True
    for arg in args:
        if options and arg == "--":
            options = False
        elif not (options and arg.startswith("-") and len(arg) > 1):
            out.append(path_word(arg))
    return out
