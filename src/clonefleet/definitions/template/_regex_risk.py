"""A static, conservative check for regular expressions that can backtrack catastrophically.

An exit schema's ``pattern`` and ``patternProperties`` are matched against payloads a model
chooses. The check reads a pattern with the standard library's own parser (``re._parser``) and
flags what can match one text in many ways inside a part quantified more than once (a part that
can match nothing, an unguarded nested quantifier, alternatives that can start alike), and any
backreference; when in doubt it assumes the worst. What it flags and what passes:
docs/definitions.md, "Exit schema limits".
"""

from __future__ import annotations

import functools
import importlib
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_PATTERN_CHARS", "regex_risk"]

MAX_PATTERN_CHARS = 1000
"""Longest ``pattern`` or ``patternProperties`` key an exit schema may hold."""

_PARSER: Any = importlib.import_module("re._parser")  # the parser `re.compile` itself uses
_ENUM_LIMIT = 4096
"""Classes of at most this many characters are enumerated; larger ones are tested by predicate."""
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT")
_ZERO_WIDTH = ("AT", "ASSERT", "ASSERT_NOT")
_CATEGORIES: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdecimal,
    "CATEGORY_NOT_DIGIT": lambda c: not ("0" <= c <= "9"),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda c: c not in " \t\n\r\f\v",
    "CATEGORY_WORD": lambda c: c.isalnum() or c == "_",
    "CATEGORY_NOT_WORD": lambda c: not (c.isascii() and (c.isalnum() or c == "_")),
    "CATEGORY_LINEBREAK": lambda c: c == "\n",
    "CATEGORY_NOT_LINEBREAK": lambda c: c != "\n",
}
"""Each category as a superset of what it matches in any flag mode (so overlaps are not missed)."""
_SAMPLE = tuple(
    [*range(0x250), *range(0x370, 0x530), *range(0x2000, 0x2070), *range(0x3000, 0x3100)]
    + [0x660, 0x669, 0x966, 0x96F, 0x1680, 0x4E2D, 0xFEFF, 0xFF10, 0xFF21, 0xFF41]
)
"""Characters on which two large classes (``\\s`` and ``\\w``, ``[^,]`` and ``\\d``) are compared:
ASCII, Latin, Greek, Cyrillic, Unicode spaces and punctuation, CJK, and a few digits."""


def _always(c: str) -> bool:
    return True


def _in_range(lo: int, hi: int, c: int) -> bool:
    return lo <= c <= hi


def _in_category(category: Callable[[str], bool], c: int) -> bool:
    return category(chr(c))


class _Risky(Exception):
    """Carries the reason a pattern is flagged."""


@dataclass(frozen=True, slots=True)
class _Chars:
    """An approximate set of characters: a membership test, and the members when few."""

    test: Callable[[int], bool]
    members: frozenset[int] | None

    def disjoint(self, other: _Chars) -> bool:
        """True only when surely no character is in both (unknown large sets overlap)."""
        small, big = (self, other)
        if small.members is None or (
            big.members is not None and len(big.members) < len(small.members)
        ):
            small, big = big, small
        if small.members is None:  # two large sets: compared on a sample of characters
            return not any(small.test(c) and big.test(c) for c in _SAMPLE)
        return not any(big.test(c) for c in small.members)

    def __or__(self, other: _Chars) -> _Chars:
        members = (
            self.members | other.members
            if self.members is not None and other.members is not None
            else None
        )
        return _Chars(lambda c: self.test(c) or other.test(c), members)


_EMPTY = _Chars(lambda c: False, frozenset())
_ANY = _Chars(lambda c: True, None)


def _union(parts: Iterable[_Chars]) -> _Chars:
    result = _EMPTY
    for part in parts:
        result = result | part
    return result


class _Analysis:
    """The checks of one parsed pattern (see the module docstring)."""

    def __init__(self, parsed: Any, icase: bool) -> None:
        self.state, self.icase = parsed.state, icase

    # -- character sets ----------------------------------------------------------------------
    def _fold(self, chars: _Chars) -> _Chars:
        if not self.icase:
            return chars
        test = chars.test

        def folded(c: int) -> bool:
            ch = chr(c)
            return test(c) or any(test(ord(v)) for v in {ch.lower(), ch.upper()} if len(v) == 1)

        members = None
        if chars.members is not None:
            members = frozenset(
                ord(v)
                for c in chars.members
                for v in {chr(c), chr(c).lower(), chr(c).upper()}
                if len(v) == 1
            )
        return _Chars(folded, members)

    def _class(self, items: Sequence[tuple[Any, Any]]) -> _Chars:
        negate = False
        tests: list[Callable[[int], bool]] = []
        members: set[int] = set()
        total = 0
        for op, av in items:
            name = str(op)
            if name == "NEGATE":
                negate = True
            elif name == "LITERAL":
                tests.append(functools.partial(operator.eq, av))
                members.add(av)
                total += 1
            elif name == "RANGE":
                tests.append(functools.partial(_in_range, av[0], av[1]))
                total += av[1] - av[0] + 1
                if total <= _ENUM_LIMIT:
                    members.update(range(av[0], av[1] + 1))
            else:  # a category, or anything unknown: whatever it might match
                tests.append(functools.partial(_in_category, _CATEGORIES.get(str(av), _always)))
                total = _ENUM_LIMIT + 1

        def test(c: int) -> bool:
            return any(t(c) for t in tests) != negate

        enumerable = not negate and total <= _ENUM_LIMIT
        return self._fold(_Chars(test, frozenset(members) if enumerable else None))

    def first(self, seq: Iterable[tuple[Any, Any]]) -> _Chars:
        """Characters a match of ``seq`` may start with."""
        parts = []
        for item in seq:
            parts.append(self._item_chars(item, first=True))
            if self.min_width([item]) > 0:
                break
        return _union(parts)

    def chars(self, seq: Iterable[tuple[Any, Any]]) -> _Chars:
        """Every character a match of ``seq`` may consume."""
        return _union(self._item_chars(item, first=False) for item in seq)

    def _item_chars(self, item: tuple[Any, Any], *, first: bool) -> _Chars:
        op, av = str(item[0]), item[1]
        of = self.first if first else self.chars
        if op == "LITERAL":
            return self._fold(_Chars(lambda c: c == av, frozenset({av})))
        if op == "NOT_LITERAL":
            return _Chars(lambda c: c != av, None)
        if op == "IN":
            return self._class(av)
        if op in (*_REPEATS, "POSSESSIVE_REPEAT"):
            return of(av[2])
        if op == "SUBPATTERN":
            return of(av[3])
        if op == "ATOMIC_GROUP":
            return of(av)
        if op == "BRANCH":
            return _union(of(alt) for alt in av[1])
        if op in _ZERO_WIDTH:
            return _EMPTY
        return _ANY  # ANY, backreferences and anything unknown

    def min_width(self, seq: Sequence[tuple[Any, Any]]) -> int:
        width: int = _PARSER.SubPattern(self.state, list(seq)).getwidth()[0]
        return width

    def follow(self, rest: Sequence[tuple[Any, Any]], after: _Chars | None) -> _Chars | None:
        """Characters that may be consumed right after a part followed by ``rest``, then
        ``after`` (``None``: unknown). Anchors and lookarounds consume nothing: they only filter."""
        parts = []
        for item in rest:
            parts.append(self._item_chars(item, first=True))
            if self.min_width([item]) > 0:
                return _union(parts)
        return None if after is None else _union(parts) | after

    # -- the checks ----------------------------------------------------------------------------
    def scan(self, seq: Sequence[tuple[Any, Any]], after: _Chars | None) -> None:
        """Check every part of ``seq``; ``after`` is what may follow ``seq`` (None: unknown)."""
        items = list(seq)
        for i, (op, av) in enumerate(items):
            name, follow = str(op), self.follow(items[i + 1 :], after)
            if name in _REPEATS and av[1] > 1:
                wrap = None if follow is None else self.first(av[2]) | follow
                self.repeated(av[2], wrap)
                self.scan(av[2], wrap)
            elif name in (*_REPEATS, "SUBPATTERN"):
                self.scan(av[-1], follow)
            elif name in ("POSSESSIVE_REPEAT", "ATOMIC_GROUP", "ASSERT", "ASSERT_NOT"):
                self.scan(av[-1] if name != "ATOMIC_GROUP" else av, None)
            elif name == "BRANCH":
                for alt in av[1]:
                    self.scan(alt, follow)
            elif name in ("GROUPREF", "GROUPREF_EXISTS"):
                raise _Risky("a backreference")

    def repeated(self, body: Sequence[tuple[Any, Any]], wrap: _Chars | None) -> None:
        """Check the body of a part quantified more than once; ``wrap`` may follow each pass."""
        if self.min_width(body) == 0:
            raise _Risky("a quantified part that can match the empty string")
        self.inner(body, wrap)

    def inner(self, seq: Sequence[tuple[Any, Any]], after: _Chars | None) -> None:
        items = list(seq)
        for i, (op, av) in enumerate(items):
            name, follow = str(op), self.follow(items[i + 1 :], after)
            if name in _REPEATS and av[1] > 1 and av[0] != av[1]:
                if follow is None or not self.chars(av[2]).disjoint(follow):
                    raise _Risky("a nested quantifier")
            elif name in _REPEATS:
                self.inner(av[2], follow if av[1] <= 1 else None)
            elif name == "SUBPATTERN":
                self.inner(av[3], follow)
            elif name == "BRANCH":
                self._branches(av[1])
                for alt in av[1]:
                    self.inner(alt, follow)
            elif name in ("ASSERT", "ASSERT_NOT"):
                self.inner(av[1], None)

    def _branches(self, alts: Sequence[Sequence[tuple[Any, Any]]]) -> None:
        firsts: list[_Chars] = []
        for alt in alts:
            if self.min_width(alt) == 0:
                raise _Risky(
                    "an alternation whose branches overlap or can be empty, inside a quantifier"
                )
            mine = self.first(alt)
            if any(not mine.disjoint(other) for other in firsts):
                raise _Risky(
                    "an alternation whose branches overlap or can be empty, inside a quantifier"
                )
            firsts.append(mine)


_INLINE_I = re.compile(r"\(\?[a-zA-Z-]*i")
"""An inline flag group that may turn on ``IGNORECASE`` (a few false hits only make it stricter)."""


def regex_risk(pattern: str) -> str | None:
    """Why ``pattern`` may backtrack catastrophically or is too long, or ``None`` when it passes.

    The pattern must already compile (the meta-schema checks that).
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    try:
        parsed = _PARSER.parse(pattern)
        icase = bool(parsed.state.flags & re.IGNORECASE) or bool(_INLINE_I.search(pattern))
        _Analysis(parsed, icase).scan(parsed, _EMPTY)
    except _Risky as exc:
        return f"can backtrack catastrophically: {exc}"
    except RecursionError:
        return "nested too deeply"
    except re.error as exc:
        return f"not a valid regular expression ({exc})"
    return None
