"""The simulated provider's prompt cache as a pure object: writes only at breakpoints (explicit)
or past the minimum length (automatic), the longest written prefix read, expiry on a fake clock
with hits refreshing it, the bound on entries, models kept apart; and the in-process
:class:`SimulatedModel` filling usage from it."""

from __future__ import annotations

import pytest

from clonefleet.providers import Message, ModelRequest, Role, SimulatedModel, ToolSpec
from clonefleet.providers.sim._cache import CacheUse, Prefixes, PromptCache

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def prefixes(*blocks: tuple[str, int] | tuple[str, int, bool]) -> Prefixes:
    """Blocks given as (text, tokens[, breakpoint])."""
    p = Prefixes()
    for block in blocks:
        p.add(block[0].encode(), block[1], len(block) > 2 and bool(block[2]))
    return p


def cache(**opts: object) -> tuple[PromptCache, FakeClock]:
    clock = FakeClock()
    return PromptCache(clock=clock, **opts), clock  # type: ignore[arg-type]


def test_prefixes_digest_the_whole_prefix_not_just_the_block():
    a = prefixes(("tools", 0), ("system", 10), ("task", 5))
    b = prefixes(("other tools", 0), ("system", 10), ("task", 5))
    assert a.ends == [0, 10, 15] and a.tokens == 15
    assert a.digests[0] != b.digests[0]
    assert a.digests[1] != b.digests[1]  # same block after a different prefix
    assert prefixes(("tools", 0), ("system", 10)).digests == a.digests[:2]
    # Blocks are length-prefixed: "ab" + "c" is not "a" + "bc".
    assert prefixes(("ab", 1), ("c", 1)).digests[1] != prefixes(("a", 1), ("bc", 1)).digests[1]


def test_explicit_writes_only_at_breakpoints_and_reads_the_longest_written_prefix():
    c, _ = cache(min_tokens=10)
    first = prefixes(("tools", 0), ("system", 100, True), ("task 0", 20), ("turn", 30, True))
    assert c.explicit("m", first) == CacheUse(read=0, write=150)
    # Another clone: same tools and system, its own task; the breakpoint at the system block
    # was written, the one after the first clone's turn is not this request's prefix.
    other = prefixes(("tools", 0), ("system", 100, True), ("task 1", 20, True))
    assert c.explicit("m", other) == CacheUse(read=100, write=20)
    # The first clone's next turn reads everything up to its previous last breakpoint.
    again = prefixes(
        ("tools", 0), ("system", 100, True), ("task 0", 20), ("turn", 30), ("more", 5, True)
    )
    assert c.explicit("m", again) == CacheUse(read=150, write=5)


def test_explicit_without_a_breakpoint_neither_reads_nor_writes():
    c, _ = cache(min_tokens=10)
    marked = prefixes(("system", 100, True), ("task", 20))
    assert c.explicit("m", marked) == CacheUse(read=0, write=100)
    unmarked = prefixes(("system", 100), ("task", 20))
    assert c.explicit("m", unmarked) == CacheUse()  # the prefix is there, but nothing asks
    # A prefix between breakpoints was never written, so it is not read.
    c2, _ = cache(min_tokens=10)
    c2.explicit("m", prefixes(("a", 50), ("b", 50), ("c", 50, True)))
    assert c2.explicit("m", prefixes(("a", 50), ("b", 50, True))) == CacheUse(read=0, write=100)


def test_explicit_breakpoint_shorter_than_the_minimum_is_not_written():
    c, _ = cache(min_tokens=1024)
    short = prefixes(("system", 1000, True), ("task", 20))
    assert c.explicit("m", short) == CacheUse()
    assert c.explicit("m", short) == CacheUse()
    long = prefixes(("system", 1000), ("skill", 30, True))
    assert c.explicit("m", long) == CacheUse(read=0, write=1030)
    assert c.explicit("m", long) == CacheUse(read=1030, write=0)


def test_automatic_writes_prefixes_of_the_minimum_length_or_more():
    c, _ = cache(min_tokens=1024)
    short = prefixes(("tools", 0), ("system", 1000), ("task", 23))
    assert c.automatic("m", short) == CacheUse()
    assert c.automatic("m", short) == CacheUse()
    assert c.entries("m") == 0
    long = prefixes(("tools", 0), ("system", 1000), ("task 0", 24), ("turn", 100))
    assert c.automatic("m", long) == CacheUse(read=0, write=1124)
    # Another clone shares only the system block (1,000 tokens, under the minimum): no read.
    assert c.automatic("m", prefixes(("tools", 0), ("system", 1000), ("task 1", 30))).read == 0
    # The same clone's next turn reads the longest prefix written: all of the last request.
    nxt = prefixes(("tools", 0), ("system", 1000), ("task 0", 24), ("turn", 100), ("x", 7))
    assert c.automatic("m", nxt) == CacheUse(read=1124, write=7)
    # A prefix of a written request, past the minimum, is written too.
    assert c.automatic("m", prefixes(("tools", 0), ("system", 1000), ("task 0", 24))).read == 1024


def test_entries_expire_after_the_ttl_and_a_hit_refreshes_them():
    c, clock = cache(min_tokens=1, ttl_s=300)
    p = prefixes(("system", 100, True))
    c.explicit("m", p)
    clock.now += 200
    assert c.explicit("m", p).read == 100  # a hit at +200 lives until +500
    clock.now += 299
    assert c.explicit("m", p).read == 100  # +499: still there (refreshed again, to +799)
    clock.now += 300
    assert c.entries("m") == 0
    assert c.explicit("m", p) == CacheUse(read=0, write=100)  # expired at +799: written anew


def test_the_least_recently_used_entry_goes_past_the_bound():
    c, clock = cache(min_tokens=1, max_entries=2)
    a, b, d = (prefixes((name, 10, True)) for name in "abd")
    c.explicit("m", a)
    clock.now += 1
    c.explicit("m", b)
    clock.now += 1
    assert c.explicit("m", a).read == 10  # a is now the most recently used
    clock.now += 1
    c.explicit("m", d)  # evicts b
    assert c.entries("m") == 2
    assert c.explicit("m", a).read == 10
    assert c.explicit("m", b).read == 0


def test_models_have_caches_of_their_own():
    c, _ = cache(min_tokens=1)
    p = prefixes(("system", 100, True))
    c.explicit("sim-small", p)
    assert c.explicit("sim-large", p) == CacheUse(read=0, write=100)
    assert c.explicit("sim-small", p).read == 100
    assert c.entries("sim-small") == 1 and c.entries("sim-large") == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="ttl_s"):
        PromptCache(ttl_s=0)
    with pytest.raises(ValueError, match="min_tokens"):
        PromptCache(min_tokens=0)


def _request(clone: int, system: str, task: str = "") -> ModelRequest:
    tools = (ToolSpec(name="exit_tool", description="end", parameters={"type": "object"}),)
    return ModelRequest(
        model="sim-small",
        messages=(
            Message(role=Role.SYSTEM, content="You are a clone."),
            Message(role=Role.SYSTEM, content=system),
            Message(role=Role.USER, content=task or f"task of clone {clone}"),
        ),
        tools=tools,
        metadata={"batch_id": "b_1", "clone_index": clone},
    )


PAD = " ".join(f"w{i}" for i in range(1500))


async def test_in_process_model_reports_cache_reads_of_the_shared_prefix():
    model = SimulatedModel()
    first = await model.request(_request(0, PAD))
    second = await model.request(_request(1, PAD))
    total = 4 + 1500 + 4  # words of the two system messages and the task
    assert first.usage.input_tokens == second.usage.input_tokens == total
    assert (first.usage.cache_read_tokens, first.usage.cache_write_tokens) == (0, total)
    assert second.usage.cache_read_tokens == 4 + 1500  # all but its own task
    assert second.usage.cache_write_tokens == 4


async def test_in_process_model_without_a_cache_or_under_the_minimum_reports_none():
    off = SimulatedModel(cache_ttl_s=0)
    assert off.cache is None
    for i in range(2):
        usage = (await off.request(_request(i, PAD))).usage
        assert (usage.cache_read_tokens, usage.cache_write_tokens) == (0, 0)
    short = SimulatedModel()
    for i in range(2):
        usage = (await short.request(_request(i, "a short system prompt"))).usage
        assert (usage.cache_read_tokens, usage.cache_write_tokens) == (0, 0)


async def test_in_process_cache_follows_the_model_clock_and_different_tools_miss():
    clock = FakeClock()
    model = SimulatedModel(clock=clock, cache_ttl_s=60, cache_min_tokens=10)
    await model.request(_request(0, PAD))
    clock.now += 61
    assert (await model.request(_request(1, PAD))).usage.cache_read_tokens == 0
    other_tools = ModelRequest(
        model="sim-small",
        messages=_request(2, PAD).messages,
        tools=(ToolSpec(name="exit_tool", description="stop", parameters={"type": "object"}),),
        metadata={"batch_id": "b_1", "clone_index": 2},
    )
    assert (await model.request(other_tools)).usage.cache_read_tokens == 0
    assert (await model.request(_request(3, PAD))).usage.cache_read_tokens == 1504
