"""The keys a feeder has seen, kept as 64-bit hashes: the same answers as a set of the keys,
in a table of 8-byte slots whatever the keys' length."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clonefleet.feed import SeenKeys, _seen_keys

pytestmark = pytest.mark.timeout(60)


@given(st.lists(st.text(max_size=12), max_size=300))
def test_answers_as_a_set_of_the_keys_would(keys: list[str]) -> None:
    seen, plain = SeenKeys(), set[str]()
    for key in keys:
        assert seen.add(key) is (key not in plain)
        plain.add(key)
    assert len(seen) == len(plain)


def test_keeps_every_key_through_its_growth_in_8_bytes_a_slot() -> None:
    seen = SeenKeys()
    keys = [f"files/a-rather-long-path/doc-{i:07d}.txt" for i in range(5000)]
    assert all(seen.add(k) for k in keys)
    assert not any(seen.add(k) for k in keys)  # every one found again after the growths
    assert len(seen) == 5000
    slots = seen._slots
    assert slots.itemsize == 8 and 2 * 5000 <= len(slots) <= 4 * 5000  # at most half full


def test_a_shared_hash_is_taken_as_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys are not kept: two keys with one hash cannot be told apart (negligible at 64
    bits, forced here)."""
    monkeypatch.setattr(_seen_keys, "key_hash", lambda key: 7)
    seen = SeenKeys()
    assert seen.add("a") and not seen.add("b")


def test_the_hash_is_64_bits_never_0_and_takes_any_text() -> None:
    values = {_seen_keys.key_hash(k) for k in ("", "a", "é", "\ud800", "x" * 10_000)}
    assert len(values) == 5
    assert all(0 < v < 2**64 for v in values)
