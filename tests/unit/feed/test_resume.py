"""Resuming an ``--inputs`` run: the run ledger, reading a batch back into what a feeder adopts,
and a feeder that collects an earlier run's jobs instead of submitting their rows again."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clonefleet.feed import Adopted, Feeder, LedgerEntry, RunLedger, adopt, run_fingerprint
from clonefleet.inputs import Row

from .test_feeder import CoreClient

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client() -> Iterator[CoreClient]:
    c = CoreClient()
    yield c
    c.close()


# -- fingerprints and the ledger ----------------------------------------------------------
@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.text(), st.integers())))
def test_a_fingerprint_ignores_the_order_of_the_parts(parts: dict[str, Any]) -> None:
    shuffled = dict(reversed(list(parts.items())))
    assert run_fingerprint(parts) == run_fingerprint(shuffled)
    assert len(run_fingerprint(parts)) == 32


def test_a_fingerprint_changes_with_any_part() -> None:
    base = {"agent": "a", "prompt": "p {{ input }}", "inputs": "/d/rows.jsonl", "key": "id"}
    seen = {run_fingerprint(base)}
    for name in base:
        seen.add(run_fingerprint({**base, name: "other"}))
    seen.add(run_fingerprint({**base, "limit": 5}))
    assert len(seen) == len(base) + 2


def test_the_ledger_keeps_finds_and_forgets_an_entry(tmp_path) -> None:
    ledger = RunLedger(tmp_path / "inputs")
    assert ledger.find("f" * 32) is None  # no folder yet
    entry = LedgerEntry("b_1", None, journal=str(tmp_path / "j"), detached=False, at=5.0)
    ledger.record("f" * 32, entry)
    assert ledger.find("f" * 32) == entry
    assert oct((tmp_path / "inputs").stat().st_mode & 0o777) == "0o700"
    ledger.record("f" * 32, LedgerEntry("b_2", "auto", detached=True, at=6.0))
    assert ledger.find("f" * 32) == LedgerEntry("b_2", "auto", detached=True, at=6.0)
    assert not list((tmp_path / "inputs").glob("*.tmp"))
    ledger.forget("f" * 32)
    assert ledger.find("f" * 32) is None
    ledger.forget("f" * 32)  # twice: nothing to do


def test_an_unreadable_entry_reads_as_none(tmp_path) -> None:
    ledger = RunLedger(tmp_path)
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text(json.dumps({"batch_id": "b", "surprise": 1}))
    (tmp_path / "c.json").write_text(json.dumps(["b"]))
    assert ledger.find("a") is None and ledger.find("b") is None and ledger.find("c") is None


def test_the_ledger_keeps_only_the_newest_entries(tmp_path) -> None:
    ledger = RunLedger(tmp_path, keep=3)
    for i in range(5):
        ledger.record(f"f{i}", LedgerEntry(f"b{i}", None))
        os.utime(tmp_path / f"f{i}.json", (1000 + i, 1000 + i))
    ledger.record("f5", LedgerEntry("b5", None))
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == ["f3", "f4", "f5"]


# -- reading a batch back -------------------------------------------------------------------
def _page(jobs: list[dict[str, Any]], batches: dict[str, Any]) -> dict[str, Any]:
    return {"jobs": jobs, "totals": {"batches": batches, "fleet": {}}, "capacity": {}}


def test_adopt_keeps_the_jobs_of_rows_still_to_do() -> None:
    jobs = [
        {"job_id": "j1", "key": "a", "status": "completed", "parent": None},
        {"job_id": "j2", "key": "b", "status": "running", "parent": None},
        {"job_id": "j3", "key": "c", "status": "failed", "parent": None},
        {"job_id": "j4", "key": None, "status": "running", "parent": "j2"},  # a spawn
    ]
    pages = [
        _page(jobs[:2], {"B": {"jobs": 7, "open": True}}),
        _page(jobs[2:], {"B": {"jobs": 7, "open": True}}),
    ]
    got = adopt(iter(pages), "B", lambda key: key != "a")
    assert got == Adopted("B", {"b": "j2", "c": "j3"}, frozenset({"j3"}), 7, True)


def test_adopt_answers_none_for_a_batch_the_fleet_does_not_know() -> None:
    assert adopt(iter([_page([], {})]), "B", lambda key: True) is None


def test_a_closed_batch_whose_rows_are_all_done_is_adopted_empty() -> None:
    page = _page([{"job_id": "j1", "key": "a", "status": "completed"}], {"B": {"jobs": 1}})
    assert adopt(iter([page]), "B", lambda key: False) == Adopted("B", {}, frozenset(), 1, False)


# -- a feeder that adopts --------------------------------------------------------------------
def _rows(keys: range, skip: frozenset[int] = frozenset()) -> Iterator[Row]:
    for i in keys:
        if i not in skip:
            yield Row(line=i, key=str(i), data={"x": i})


def _first_run(client: CoreClient, n: int, slice_rows: int) -> str:
    """A run that submitted its first slice (an open batch) and died without closing it."""
    first = Feeder(
        _rows(range(1, n + 1)), client.plan, client, agent="a", ahead=slice_rows,
        slice_rows=slice_rows,
    )  # fmt: skip
    first.start()
    assert first.batch_id is not None
    return first.batch_id


def _listing(client: CoreClient, batch: str) -> list[Any]:
    return [client._run(client.core.list_jobs(batch=batch))]


def test_a_rerun_collects_the_earlier_batch_and_adds_only_the_rows_it_lacks(client) -> None:
    batch = _first_run(client, 20, 10)
    done = {"1", "2"}  # in the results file already
    adopted = adopt(_listing(client, batch), batch, lambda key: key not in done)
    assert adopted is not None and adopted.open and adopted.size == 10
    assert set(adopted.jobs) == {str(i) for i in range(3, 11)}
    client.calls.clear()
    client.firsts.clear()
    feeder = Feeder(
        _rows(range(1, 21), skip=frozenset({1, 2})), client.plan, client, agent="a",
        ahead=10, slice_rows=10, adopted=adopted, poll_s=0.02,
    )  # fmt: skip
    records = [e.record for e in feeder.run()]
    assert sorted(int(r["key"]) for r in records) == list(range(3, 21))  # each once
    assert {r["batch_id"] for r in records} == {batch}
    assert all(r["status"] == "completed" for r in records)
    assert feeder.adopted == 8 and feeder.submitted == 10
    assert client.calls == ["extend last=False", "extend last=True"] or client.calls == [
        "extend last=True"
    ]
    assert client.firsts[0] == 10  # new clones are numbered after the batch's first ten
    assert client._run(client.core.close_batch(batch)) is False  # closed by the last part


def test_adopted_jobs_not_seen_ended_are_collected_from_their_events(client) -> None:
    batch = _first_run(client, 12, 6)
    adopted = adopt(_listing(client, batch), batch, lambda key: True)
    assert adopted is not None
    # As if they were running when the rerun read the batch: their ends come as events.
    running = Adopted(batch, adopted.jobs, frozenset(), adopted.size, adopted.open)
    feeder = Feeder(
        _rows(range(1, 13)), client.plan, client, agent="a", ahead=6, slice_rows=6,
        adopted=running, poll_s=0.02,
    )  # fmt: skip
    records = [e.record for e in feeder.run()]
    assert sorted(int(r["key"]) for r in records) == list(range(1, 13))
    assert feeder.adopted == 6 and feeder.submitted == 6


def test_rows_a_closed_earlier_batch_lacks_fail_with_the_reason(client) -> None:
    batch = _first_run(client, 4, 2)
    client._run(client.core.close_batch(batch))
    adopted = adopt(_listing(client, batch), batch, lambda key: True)
    assert adopted is not None and not adopted.open
    feeder = Feeder(
        _rows(range(1, 5)), client.plan, client, agent="a", ahead=2, slice_rows=2,
        adopted=adopted, poll_s=0.02,
    )  # fmt: skip
    records = {r.record["key"]: r.record for r in feeder.run()}
    assert {k: r["status"] for k, r in records.items()} == {
        "1": "completed", "2": "completed", "3": "failed", "4": "failed",
    }  # fmt: skip
    assert "which an earlier run of this command closed" in records["3"]["error"]
    assert "line 3" in records["3"]["error"]


def test_a_detached_feeder_submits_everything_and_keeps_nothing(client) -> None:
    feeder = Feeder(
        _rows(range(1, 2501)), client.plan, client, agent="a", ahead=1, slice_rows=500,
        follow=False,
    )  # fmt: skip
    assert list(feeder.submit_all()) == []
    assert feeder.submitted == 2500 and feeder._pending == {}
    assert feeder.parts == 5  # a slice a part, however few rows it follows
    listing = client._run(client.core.list_jobs(batch=feeder.batch_id))
    assert listing["totals"]["batches"][feeder.batch_id]["open"] is False
    assert listing["totals"]["batches"][feeder.batch_id]["jobs"] == 2500


def test_a_detached_rerun_skips_the_rows_its_batch_has(client) -> None:
    batch = _first_run(client, 30, 10)
    adopted = adopt(_listing(client, batch), batch, lambda key: True)
    feeder = Feeder(
        _rows(range(1, 31)), client.plan, client, agent="a", ahead=1, slice_rows=10,
        adopted=adopted, follow=False,
    )  # fmt: skip
    assert list(feeder.submit_all()) == []
    assert feeder.adopted == 10 and feeder.submitted == 20
    listing = client._run(client.core.list_jobs(batch=batch))
    keys = sorted(int(j["key"]) for j in listing["jobs"])
    assert keys == list(range(1, 31))  # each row once in the batch
