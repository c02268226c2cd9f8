"""The caps a template render runs under, and the error a render stops with past one.

A template is untrusted input (a nested spawn's prompt is written by a model), so its work and
memory are bounded: between operations by a per-render budget of time and memory
(``_render_budget``), and before each operation by its worst case computed from its operands'
sizes (``_sizes``, ``_format_limits``, ``_operator_limits``) against :data:`MAX_OUTPUT_CHARS`
and :data:`MAX_ITEMS`. ``_jinja_env`` wires these checks into Jinja2; ``_render`` sets the
budget and counts output. See docs/definitions.md, "Templating".
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "MAX_DICT_LITERAL",
    "MAX_FORMAT_FIELDS",
    "MAX_HASH_COLLISIONS",
    "MAX_INT_BITS",
    "MAX_ITEMS",
    "MAX_OUTPUT_CHARS",
    "MAX_RANGE",
    "MAX_RENDER_MEMORY",
    "MAX_SLOW_TEXT_CHARS",
    "MAX_WIDTH",
    "MEMORY_SAMPLE_S",
    "RENDER_TIMEOUT_S",
    "TEXT_CODECS",
    "Size",
    "TemplateLimitError",
    "too_big",
]

MAX_OUTPUT_CHARS = 1 << 20
"""Largest rendered text, and largest string or list a template may build (1 MiB)."""
MAX_ITEMS = 100_000
"""Most objects one list, tuple or dict a template holds may contain (all levels, a shared
reference counted each time), and most items a filter may iterate (a string counts its
characters): filters do per-item work in Python that no deadline check can interrupt."""
MAX_RANGE = 10_000
"""Longest ``range()`` a template may create."""
MAX_INT_BITS = 65_536
"""Largest integer (in bits) ``*`` and ``**`` may produce."""
MAX_WIDTH = 10_000
"""Largest padding width or precision in format specs and width-like filter arguments."""
MAX_FORMAT_FIELDS = 10_000
"""Most conversions in one ``%`` or ``str.format`` format string."""
MAX_SLOW_TEXT_CHARS = 64 * 1024
"""Longest text ``wordwrap`` takes (``textwrap`` works word by word in Python)."""
MAX_HASH_COLLISIONS = 256
"""Most keys of one dict, or items of one ``|unique``, that may share a hash value: integers
that differ by a multiple of 2**61 - 1 share one, and a hash table of n such keys takes n² steps
to build."""
MAX_DICT_LITERAL = 1_000
"""Most entries one dict literal in a template may have."""
MAX_RENDER_MEMORY = 64 << 20
"""Most bytes the values one render makes may add up to (counted as they are made, never given
back), and most the process's resident memory may grow during one render."""
MEMORY_SAMPLE_S = 0.02
"""How often (at most) a render's budget check reads the process's resident memory. Reading it
briefly releases the GIL, and a thread that releases it more often than the interpreter's switch
interval (5 ms) keeps a waiting thread from ever asking for it: the event loop a render runs
beside would starve."""
RENDER_TIMEOUT_S = 0.5
"""Wall-clock budget of one template render, in seconds."""

TEXT_CODECS = frozenset(
    {
        "utf-8", "utf-8-sig", "ascii", "latin-1", "iso8859-1", "cp1252",
        "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be",
    }
)  # fmt: skip
"""The codecs ``encode``/``decode`` may name: plain text codecs, linear and at most four bytes a
character. Others are refused: ``punycode`` and ``idna`` take quadratic time, the escaping codecs
multiply the size tenfold."""


class TemplateLimitError(Exception):
    """A template went over a time, size or work cap (turned into ``TemplateError`` by callers)."""


def too_big(what: str, size: int, cap: int = MAX_OUTPUT_CHARS) -> TemplateLimitError:
    return TemplateLimitError(f"{what} would be {size:,} long, over the template limit of {cap:,}")


class Size(NamedTuple):
    """What ``_sizes.measure`` found."""

    units: int
    """Characters of every string plus one per object: the size caps count these."""
    objects: int
    """Objects, a shared reference counted each time."""
    text: int
    """At least the length of ``str()`` of the value."""
