"""The simulated provider's prompt cache: request prefixes it has seen, per model, for a while.

A request is a sequence of blocks in wire order (each tool, each system block, each message
block); :class:`Prefixes` hashes its cumulative prefixes in one pass and keeps the tokens up to
each block boundary. :class:`PromptCache` keeps the prefixes written, per model, bounded in number
(least recently used go first) and in time (a hit refreshes an entry's lifetime), and answers
how many of a request's input tokens it reads and writes: only at breakpoints on the Anthropic
wire (:meth:`PromptCache.explicit`), at every boundary past a minimum length on the OpenAI wire
and in process (:meth:`PromptCache.automatic`). Pure: time comes from an injectable clock
(docs/prompt-cache.md, "The simulated provider's cache").
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_CACHE_MIN_TOKENS",
    "DEFAULT_CACHE_TTL_S",
    "DEFAULT_MAX_ENTRIES",
    "CacheUse",
    "Prefixes",
    "PromptCache",
]

DEFAULT_CACHE_TTL_S = 300.0
"""Seconds an entry lives after it was written or last read."""
DEFAULT_CACHE_MIN_TOKENS = 1024
"""The shortest prefix, in tokens, that is written."""
DEFAULT_MAX_ENTRIES = 100_000
"""Entries kept per model; past it the least recently used go."""


@dataclass(frozen=True, slots=True)
class CacheUse:
    """What one request did with the cache: input tokens read from it and newly written to it."""

    read: int = 0
    write: int = 0


class Prefixes:
    """A request as the cache sees it: after each block, the digest of everything up to it and
    the tokens so far; and which blocks carry a breakpoint. Built with :meth:`add`, in order."""

    __slots__ = ("_hash", "breaks", "digests", "ends", "tokens")

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self.digests: list[bytes] = []
        """Digest of the prefix ending with each block."""
        self.ends: list[int] = []
        """Tokens of the prefix ending with each block."""
        self.breaks: list[int] = []
        """Indexes of the blocks that carry a breakpoint, in order."""
        self.tokens = 0
        """Tokens of every block added."""

    def add(self, data: bytes, tokens: int, breakpoint: bool = False) -> None:
        """Append one block: ``data`` identifies it, ``tokens`` is its length."""
        h = self._hash
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
        self.tokens += tokens
        self.digests.append(h.digest())
        self.ends.append(self.tokens)
        if breakpoint:
            self.breaks.append(len(self.digests) - 1)


@dataclass(slots=True)
class PromptCache:
    """The prefixes written, per model: each an entry that expires ``ttl_s`` after it was
    written or last read, at most ``max_entries`` per model.

    Args:
        ttl_s: lifetime of an entry, in seconds (more than 0).
        min_tokens: the shortest prefix written, in tokens.
        max_entries: entries kept per model.
        clock: seconds, never going back (tests pass a fake one).

    Raises:
        ValueError: ``ttl_s`` not above 0, or ``min_tokens`` or ``max_entries`` below 1.
    """

    ttl_s: float = DEFAULT_CACHE_TTL_S
    min_tokens: int = DEFAULT_CACHE_MIN_TOKENS
    max_entries: int = DEFAULT_MAX_ENTRIES
    clock: Callable[[], float] = time.monotonic
    _models: dict[str, OrderedDict[bytes, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be more than 0, not {self.ttl_s!r}")
        if self.min_tokens < 1 or self.max_entries < 1:
            raise ValueError("min_tokens and max_entries must be 1 or more")

    def entries(self, model: str) -> int:
        """Entries ``model`` has now (expired ones dropped first)."""
        return len(self._live(model, self.clock()))

    def _live(self, model: str, now: float) -> OrderedDict[bytes, float]:
        """``model``'s entries without the expired ones. Every write and hit sets ``now + ttl``
        and moves the entry to the end, so the entries are in order of expiry."""
        entries = self._models.get(model)
        if entries is None:
            entries = self._models[model] = OrderedDict()
        while entries:
            first = next(iter(entries.values()))
            if first > now:
                break
            entries.popitem(last=False)
        return entries

    def _longest(
        self, entries: OrderedDict[bytes, float], p: Prefixes, last: int, now: float
    ) -> int:
        """Index of the longest prefix up to block ``last`` that is written (refreshed), or -1."""
        digests, ends, floor = p.digests, p.ends, self.min_tokens
        for i in range(last, -1, -1):
            if ends[i] < floor:
                break  # shorter prefixes were never written
            if digests[i] in entries:
                entries[digests[i]] = now + self.ttl_s
                entries.move_to_end(digests[i])
                return i
        return -1

    def _put(self, entries: OrderedDict[bytes, float], digest: bytes, now: float) -> None:
        entries[digest] = now + self.ttl_s
        entries.move_to_end(digest)
        if len(entries) > self.max_entries:
            entries.popitem(last=False)

    def explicit(self, model: str, p: Prefixes) -> CacheUse:
        """A request that marks its breakpoints (the Anthropic wire): it reads the longest
        written prefix up to its last breakpoint, and writes the prefix at each breakpoint past
        that (of at least ``min_tokens``)."""
        if not p.breaks:
            return CacheUse()
        now = self.clock()
        entries = self._live(model, now)
        hit = self._longest(entries, p, p.breaks[-1], now)
        read = p.ends[hit] if hit >= 0 else 0
        wrote = hit
        for b in p.breaks:
            if b > hit and p.ends[b] >= self.min_tokens:
                self._put(entries, p.digests[b], now)
                wrote = b
        return CacheUse(read, p.ends[wrote] - read if wrote > hit else 0)

    def automatic(self, model: str, p: Prefixes) -> CacheUse:
        """A request cached without marks (the OpenAI wire, in process): it reads the longest
        written prefix and writes every prefix past that of at least ``min_tokens``."""
        if not p.digests or p.tokens < self.min_tokens:
            return CacheUse()
        now = self.clock()
        entries = self._live(model, now)
        last = len(p.digests) - 1
        hit = self._longest(entries, p, last, now)
        read = p.ends[hit] if hit >= 0 else 0
        for i in range(hit + 1, last + 1):
            if p.ends[i] >= self.min_tokens:
                self._put(entries, p.digests[i], now)
        return CacheUse(read, p.tokens - read)
