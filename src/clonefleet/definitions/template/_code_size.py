"""How much template code a source holds, measured before Jinja reads it.

Jinja's lexing, parsing and compiling cost grows with the code inside ``{{ }}`` and ``{% %}``
tags (a list literal of 300,000 items takes seconds and hundreds of MB before any render-time
check can run), while text between tags costs almost nothing. :func:`code_exceeds` finds the tags
as Jinja's lexer does (a string may hold ``}}``, and a tag ends only once its brackets are
balanced; comments and ``{% raw %}`` blocks are text) and stops counting as soon as the code
passes the cap, so measuring never costs more than the cap itself. No Jinja import.
"""

from __future__ import annotations

import re

__all__ = ["code_exceeds"]

_OPENER = re.compile(r"\{[{%#]")
_RAW_BEGIN = re.compile(r"\{%[-+]?\s*raw\s*[-+]?%\}")
_RAW_END = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
_PIECE = re.compile(
    r"""[^'"()\[\]{}%]+"""  # a run of plain code
    r"""|'[^'\\]*(?:\\.[^'\\]*)*'|"[^"\\]*(?:\\.[^"\\]*)*\""""  # a string, as Jinja's lexer reads one
    r"""|.""",  # one bracket, quote or '%'
    re.DOTALL,
)
_OPEN_BRACKETS = frozenset("([{")
_CLOSE_BRACKETS = frozenset(")]}")
_CLOSERS = {"{{": "}}", "{%": "%}"}


def code_exceeds(source: str, cap: int) -> bool:
    """Whether the tags of ``source`` hold more than ``cap`` characters of code in all.

    Code is the text between a tag's opening and closing delimiters; text outside tags, comments
    and the contents of ``{% raw %}`` blocks are not code. A tag left open runs to the end.
    """
    used = 0
    pos = 0
    while (match := _OPENER.search(source, pos)) is not None:
        start = match.start()
        opener = match.group()
        if opener == "{#":
            end = source.find("#}", start + 2)
            pos = len(source) if end < 0 else end + 2
            continue
        raw = _RAW_BEGIN.match(source, start) if opener == "{%" else None
        if raw is not None:
            end_raw = _RAW_END.search(source, raw.end())
            pos = len(source) if end_raw is None else end_raw.end()
            continue
        pos, size = _tag_end(source, start + 2, _CLOSERS[opener], cap - used)
        used += size
        if used > cap:
            return True
    return False


def _tag_end(source: str, pos: int, closer: str, room: int) -> tuple[int, int]:
    """Where the tag whose code starts at ``pos`` ends, and its code's size; stops counting
    once the size passes ``room``."""
    start = pos
    depth = 0
    while pos < len(source):
        if depth == 0 and source.startswith(closer, pos):
            return pos + len(closer), pos - start
        if pos - start > room:
            break
        piece = _PIECE.match(source, pos)
        assert piece is not None  # the last alternative matches any one character
        end = piece.end()
        if end == pos + 1:  # one character (no copy of a long run is made)
            if source[pos] in _OPEN_BRACKETS:
                depth += 1
            elif source[pos] in _CLOSE_BRACKETS and depth:
                depth -= 1
        pos = end
    return len(source), pos - start
