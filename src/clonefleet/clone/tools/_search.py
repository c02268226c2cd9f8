"""The search tools: ``glob`` (names) and ``grep`` (contents), bounded and off the event loop.

Both walk the launch directory themselves: each directory is opened through the sandbox, every
entry looked at is counted against the call's :class:`ToolDeadline`, and each (directory,
pattern position) pair is walked once; a pattern may hold at most two ``**`` segments. ``grep``
matches with the ``regex`` package, each line within ``ToolContext.match_timeout_s``. See
docs/architecture.md, "Tools a clone can call".
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import regex

from clonefleet.clone.tools._bounded import ToolDeadline
from clonefleet.clone.tools._confine import HardLinked, open_checked, resolve_inside
from clonefleet.clone.tools._files import read_regular
from clonefleet.clone.tools._tool import MAX_ENTRIES, MAX_HITS, ToolContext, off_loop
from clonefleet.errors import ToolRetry

__all__ = ["MAX_PATTERN", "MAX_STARS", "glob_tool", "grep_tool"]

MAX_STARS = 2
"""``**`` segments a glob pattern may hold."""
MAX_PATTERN = 2000
"""Characters a ``grep`` pattern may have."""

_Matcher = Callable[[str], object]


def _segments(pattern: str) -> list[str]:
    """The pattern's segments, checked: relative, no ``..``, at most :data:`MAX_STARS` ``**``."""
    if not pattern or "\0" in pattern or Path(pattern).is_absolute():
        raise ToolRetry("glob patterns are relative to the search directory and may not use `..`")
    segs = [s for s in pattern.split("/") if s not in ("", ".")]
    if not segs or ".." in segs:
        raise ToolRetry("glob patterns are relative to the search directory and may not use `..`")
    stars = segs.count("**")
    if stars > MAX_STARS:
        raise ToolRetry(
            f"glob pattern {pattern!r} has {stars} `**` segments; at most {MAX_STARS} are allowed"
        )
    # `**/**` matches what `**` matches: keep one of each run.
    return [s for i, s in enumerate(segs) if s != "**" or i == 0 or segs[i - 1] != "**"]


def _matcher(seg: str) -> _Matcher:
    # fnmatch's translation never backtracks catastrophically (each `*` is an atomic step).
    return re.compile(fnmatch.translate(seg), re.DOTALL).match


class _Walk:
    """Matches pattern segments against the launch directory, one listing per directory."""

    def __init__(self, root: Path, deadline: ToolDeadline) -> None:
        self.root, self.deadline = root, deadline
        self._listings: dict[Path, list[tuple[str, bool]]] = {}

    def listing(self, real: Path) -> list[tuple[str, bool]]:
        """``(name, is_dir)`` of the directory's entries, symbolic links left out."""
        if real in self._listings:
            return self._listings[real]
        out: list[tuple[str, bool]] = []
        try:
            fd = open_checked(self.root, real, os.O_RDONLY | os.O_DIRECTORY)
        except ToolRetry:
            fd = -1  # vanished, or swapped for a link meanwhile: nothing to list
        if fd >= 0:
            try:
                with os.scandir(fd) as it:
                    for e in it:
                        self.deadline.visit()
                        if not e.is_symlink():
                            out.append((e.name, e.is_dir(follow_symlinks=False)))
            finally:
                os.close(fd)
        self._listings[real] = out
        return out

    def match(self, start: Path, segs: list[str]) -> dict[Path, bool]:
        """Every path under ``start`` matching ``segs``, with whether it is a directory."""
        matchers = [None if s == "**" else _matcher(s) for s in segs]
        found: dict[Path, bool] = {}
        seen: set[tuple[Path, int]] = set()
        stack = [(start, 0)]
        while stack:
            here, i = stack.pop()
            if (here, i) in seen:
                continue
            seen.add((here, i))
            self.deadline.check()
            last, m = i == len(segs) - 1, matchers[i]
            if m is None:  # `**`: this directory and every one below it
                if last:
                    found[here] = True
                else:
                    stack.append((here, i + 1))
                stack.extend((here / n, i) for n, is_dir in self.listing(here) if is_dir)
                continue
            for name, is_dir in self.listing(here):
                if not m(name):
                    continue
                if last:
                    found[here / name] = is_dir
                elif is_dir:
                    stack.append((here / name, i + 1))
        return found


def _start(root: Path, base: str) -> Path:
    start = resolve_inside(root, base)
    if not start.is_dir():
        raise ToolRetry(f"{base} is not a directory")
    return start


def _glob_paths(root: Path, base: str, pattern: str, deadline: ToolDeadline) -> list[str]:
    segs = _segments(pattern)
    real_root = Path(os.path.realpath(root))
    found = _Walk(root, deadline).match(_start(root, base), segs)
    return [str(p.relative_to(real_root)) for p in sorted(found)[:MAX_ENTRIES]]


async def glob_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    base, pattern = str(args.get("path") or "."), str(args["pattern"])
    found = await off_loop(ctx, "glob", lambda b: _glob_paths(ctx.root, base, pattern, b))
    return "\n".join(found) or "no files match"


class _Grep:
    """One ``grep`` call's search: the files under a directory, line by line, under a deadline."""

    def __init__(
        self, root: Path, pattern: regex.Pattern[str], deadline: ToolDeadline, slice_s: float
    ) -> None:
        self.root, self.pattern, self.deadline, self.slice_s = root, pattern, deadline, slice_s
        self.real_root = Path(os.path.realpath(root))
        self.hits: list[str] = []
        self.linked = 0

    def run(self, base: str, include: str) -> list[str]:
        found = _Walk(self.root, self.deadline).match(_start(self.root, base), ["**", "*"])
        for real in sorted(p for p, is_dir in found.items() if not is_dir):
            if fnmatch.fnmatch(real.name, include):
                self.search(real)
            if len(self.hits) >= MAX_HITS:
                break
        note = [f"[{self.linked} files with more than one hard link were not searched]"]
        return self.hits[:MAX_HITS] + (note if self.linked else [])

    def search(self, real: Path) -> None:
        rel = str(real.relative_to(self.real_root))
        try:
            text = read_regular(self.root, real, rel)
        except HardLinked:
            self.linked += 1
            return
        except (ToolRetry, OSError):
            return  # vanished, unreadable, or swapped for a link meanwhile: skip it
        for n, line in enumerate(text.splitlines(), 1):
            if self.found(line, rel, n):
                self.hits.append(f"{rel}:{n}:{line[:200]}")
                if len(self.hits) >= MAX_HITS:
                    return

    def found(self, line: str, rel: str, n: int) -> bool:
        self.deadline.check()
        limit = min(self.slice_s, self.deadline.remaining())
        try:
            return self.pattern.search(line, timeout=limit) is not None
        except TimeoutError:
            self.deadline.check()  # cancelled, or the whole call's deadline passed
            if limit < self.slice_s:  # cut short by the call's deadline, not by the slice
                raise self.deadline.timed_out() from None
            raise ToolRetry(
                f"the pattern took more than {self.slice_s:g}s on one line ({rel}:{n}): it "
                "backtracks too much (nested repetition such as `(a+)+`?); simplify it"
            ) from None


def _compile(pattern: str) -> regex.Pattern[str]:
    if len(pattern) > MAX_PATTERN:
        raise ToolRetry(f"the pattern is longer than {MAX_PATTERN} characters")
    try:
        return regex.compile(pattern)
    except (regex.error, OverflowError, RecursionError) as exc:
        raise ToolRetry(f"bad regular expression: {exc}") from None


async def grep_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    pattern, base = str(args["pattern"]), str(args.get("path") or ".")
    include = str(args.get("include") or "*")

    def work(deadline: ToolDeadline) -> list[str]:
        return _Grep(ctx.root, _compile(pattern), deadline, ctx.match_timeout_s).run(base, include)

    hits = await off_loop(ctx, "grep", work)
    return "\n".join(hits) or "no matches"
