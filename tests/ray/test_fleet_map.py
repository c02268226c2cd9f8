"""Fleet.map on real Ray actors: a generator of rows streams into one growing batch and every
row's record comes back once, keyed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)


def test_every_row_comes_back_once_keyed(fleet):
    def rows() -> Iterator[Any]:
        for i in range(1, 31):
            yield {"id": f"r{i}", "x": i}
        yield {"id": "r5", "x": 99}  # a repeated key: fails alone
        yield ["not", "a", "row"]  # neither a mapping nor a string: fails alone

    batch = fleet.map("general-purpose", "Row {{ input.x }}", rows(), key="id", ahead=10)
    assert batch.batch_id is not None
    records = list(batch.as_completed())
    ran = [r for r in records if r["job_id"] is not None]
    assert sorted(r["key"] for r in ran) == sorted(f"r{i}" for i in range(1, 31))
    assert all(r["batch_id"] == batch.batch_id for r in ran)
    assert sorted(r["clone_index"] for r in ran) == list(range(30))  # numbered in the batch
    assert {r["status"] for r in ran} == {"completed"}
    failed = [r for r in records if r["job_id"] is None]
    assert len(failed) == 2 and {r["status"] for r in failed} == {"failed"}
    assert "line 31: the key 'r5' was seen before" in failed[0]["error"]
    assert "line 32: a list, not a mapping or a string" in failed[1]["error"]
    assert fleet.remaining([batch.batch_id]) == 0
    jobs = fleet.expand([batch.batch_id])
    assert len(jobs) == 30  # three parts of ten in one batch


def test_map_refuses_count_and_a_bad_agent_before_anything_starts(fleet):
    from clonefleet.errors import DefinitionError, UsageError

    with pytest.raises(UsageError, match="Fleet.map takes no 'count'"):
        fleet.map("general-purpose", "x", ["a"], count=3)
    with pytest.raises(DefinitionError):
        fleet.map("no-such-agent", "x", ["a", "b"])


def test_unique_keys_keeps_no_hashes_and_refuses_no_repeat(fleet):
    """unique_keys=True: the caller says the keys differ; a repeat in another slice (one row a
    slice here) is not looked for."""
    rows = [{"id": "a"}, {"id": "b"}, {"id": "a"}]
    batch = fleet.map(
        "general-purpose", "Row {{ input.id }}", rows, key="id", ahead=1, unique_keys=True
    )
    records = list(batch.as_completed())
    assert sorted(r["key"] for r in records) == ["a", "a", "b"]
    assert {r["status"] for r in records} == {"completed"}
