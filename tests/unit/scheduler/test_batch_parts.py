"""A batch that grows: parts submitted into an open batch run under its caps and budget, the
batch is not done until it is closed, and a restarted scheduler rebuilds every part (no Ray)."""

from __future__ import annotations

import asyncio
import pickle
import time
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clonefleet.config import Config
from clonefleet.errors import IdCollision, UsageError
from clonefleet.planning import BatchSubmission
from clonefleet.scheduler import SchedulerCore, _durable
from clonefleet.scheduler._durable import fold
from clonefleet.scheduler._recovery import compact_if_due, evict_expired, restore
from clonefleet.testing import (
    InstantHost,
    LocalHosts,
    crash_core,
    make_submission,
    open_journaled_core,
    wait_until,
)
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(60)

HANG = {"default": [{"tool": "progress_update", "args": {"summary": "step"}}, {"hang": True}]}

submission = partial(make_submission, restarts=2, checkpoint_s=0.0)


def part_of(core: SchedulerCore, batch_id: str, count: int, **kw: Any) -> BatchSubmission:
    """``count`` more test clones for batch ``batch_id`` (fresh job ids, clone indices after
    the batch's: the simulated provider keeps a clone's script by batch and index)."""
    sub = make_submission(core, count, **kw)
    core.table.release_ids([s.job_id for s in sub.specs])
    batch = core.table.batch(batch_id)
    after = len(batch.job_ids) if batch is not None else 0
    specs = tuple(
        replace(s, batch_id=batch_id, clone_index=after + s.clone_index) for s in sub.specs
    )
    return replace(sub, batch_id=batch_id, specs=specs)


async def test_parts_run_in_one_batch_that_is_done_only_once_closed():
    core = SchedulerCore(InstantHost.factory(2))
    first = await core.submit(make_submission(core, 2), open=True)
    batch = first["batch_id"]
    blocked = await core.job_block([batch], timeout_seconds=0.3)
    assert not blocked["done"]  # every job so far ended, but more may come
    assert [j["status"] for j in blocked["jobs"]] == ["completed"] * 2
    assert await core.remaining([batch]) == 1  # the open batch counts one
    listing = await core.list_jobs(batch=batch)
    assert listing["totals"]["batches"][batch]["open"] is True

    waiter = asyncio.ensure_future(core.job_block([batch], timeout_seconds=20))
    second = await core.extend(part_of(core, batch, 3))
    assert second["batch_id"] == batch and len(second["job_ids"]) == 3
    third = await core.extend(part_of(core, batch, 2), last=True)
    done = await waiter
    assert done["done"]
    every = first["job_ids"] + second["job_ids"] + third["job_ids"]
    assert [j["job_id"] for j in done["jobs"]] == every
    assert {j["status"] for j in done["jobs"]} == {"completed"}
    assert await core.expand([batch]) == every
    assert await core.remaining([batch]) == 0
    listing = await core.list_jobs(batch=batch)
    assert listing["totals"]["batches"][batch]["open"] is False
    assert listing["totals"]["batches"][batch]["jobs"] == 7
    assert listing["totals"]["batches"][batch]["total_tokens"] == 7 * 216
    with pytest.raises(UsageError, match=f"batch {batch} is closed"):
        await core.extend(part_of(core, batch, 1))
    await core.aclose()


async def test_an_open_batch_is_not_evicted_until_closed():
    core = SchedulerCore(InstantHost.factory(1))
    kept_a_second = Config(durability={"retention_s": 1.0})
    out = await core.submit(make_submission(core, 1, config=kept_a_second), open=True)
    batch = out["batch_id"]
    await wait_until(lambda: core.jobs[out["job_ids"][0]].is_terminal)
    later = time.time() + 3600
    assert evict_expired(core, later) == []
    await core.close_batch(batch)
    assert evict_expired(core, later) == [batch]
    await core.aclose()


async def test_close_batch_ends_the_wait_and_is_idempotent():
    core = SchedulerCore(InstantHost.factory(1))
    out = await core.submit(make_submission(core, 1), open=True)
    batch = out["batch_id"]
    await wait_until(lambda: core.jobs[out["job_ids"][0]].is_terminal)
    waiter = asyncio.ensure_future(core.remaining([batch], wait_seconds=20))
    await asyncio.sleep(0.02)
    assert not waiter.done()
    assert await core.close_batch(batch) is True
    assert await waiter == 0
    assert await core.close_batch(batch) is False
    assert (await core.job_block([batch], timeout_seconds=1))["done"]
    with pytest.raises(UsageError, match="no batch b_nope to close"):
        await core.close_batch("b_nope")
    await core.aclose()


async def test_a_part_is_refused_for_no_batch_a_cancelled_one_or_taken_ids():
    core = SchedulerCore(LocalHosts())
    closed = await core.submit(submission(core, 1))
    with pytest.raises(UsageError, match=f"batch {closed['batch_id']} is closed"):
        await core.extend(part_of(core, closed["batch_id"], 1))
    with pytest.raises(UsageError, match="no batch b_missing to add jobs to"):
        await core.extend(part_of(core, "b_missing", 1))

    out = await core.submit(submission(core, 1, script=HANG), open=True)
    batch = out["batch_id"]
    taken = part_of(core, batch, 2)
    taken = replace(
        taken, specs=(taken.specs[0], replace(taken.specs[1], job_id=out["job_ids"][0]))
    )
    with pytest.raises(IdCollision):
        await core.extend(taken)
    twice = part_of(core, batch, 2)
    twice = replace(
        twice, specs=(twice.specs[0], replace(twice.specs[1], job_id=twice.specs[0].job_id))
    )
    with pytest.raises(IdCollision):
        await core.extend(twice)
    with pytest.raises(UsageError, match=f"a part of batch {batch} needs at least one clone"):
        await core.extend(replace(part_of(core, batch, 1), specs=()))
    assert list(core.table.batch_job_ids[batch]) == out["job_ids"]  # nothing half-added
    assert set(core.jobs) == {*closed["job_ids"], *out["job_ids"]}

    await core.cancel_many([batch])
    with pytest.raises(UsageError, match=f"batch {batch} was cancelled: it takes no more jobs"):
        await core.extend(part_of(core, batch, 1))
    assert await core.close_batch(batch) is False
    assert (await core.job_block([batch], timeout_seconds=10))["done"]
    await core.aclose()


async def test_the_batch_budget_covers_every_part():
    # Each instant clone uses 216 tokens: the second part's job passes a 300-token budget.
    core = SchedulerCore(InstantHost.factory(2))
    out = await core.submit(make_submission(core, 1, budget_tokens=300), open=True)
    batch = out["batch_id"]
    await wait_until(lambda: core.jobs[out["job_ids"][0]].is_terminal)
    assert not core.usage.budgets[batch].passed
    second = await core.extend(part_of(core, batch, 1))
    await wait_until(lambda: core.usage.budgets[batch].passed)
    await wait_until(lambda: core.jobs[second["job_ids"][0]].is_terminal)
    third = await core.extend(part_of(core, batch, 3), last=True)
    for job_id in third["job_ids"]:
        rec = core.jobs[job_id]
        assert rec.state is JobState.CANCELLED and rec.stop_reason == "budget"
    assert (await core.job_block([batch], timeout_seconds=5))["done"]
    view = (await core.list_jobs(batch=batch))["totals"]["batches"][batch]
    # The first part's 216, then the second part's response that passed 300 (none after).
    assert view["budget"]["spent_tokens"] == 324 and view["budget"]["passed"]
    await core.aclose()


async def test_a_restarted_scheduler_rebuilds_every_part_and_keeps_the_batch_open(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_durable, "BLOB_PART", 700)  # each part's submission in pieces
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    first = await core.submit(submission(core, 2, script=HANG), open=True)
    batch = first["batch_id"]
    second = await core.extend(part_of(core, batch, 2))
    hanging = first["job_ids"] + second["job_ids"]
    await wait_until(lambda: all(j in core.table.checkpoints for j in hanging))
    await core.cancel_many([first["job_ids"][0]])  # one job ends: it is not run again
    await wait_until(lambda: core.jobs[first["job_ids"][0]].is_terminal)
    await journal.commit()
    records = [r for r in _read(tmp_path / "j") if r.get("k") in ("part", "grow")]
    assert {r["b"] for r in records if r["k"] == "part"} == {batch, f"{batch}/1"}
    assert [r["n"] for r in records if r["k"] == "grow"] == [1]
    crash_core(core, journal, hosts)

    hosts2 = LocalHosts()
    core2, journal2, table = open_journaled_core(tmp_path / "j", hosts2)
    assert table.open == {batch} and table.grown[batch] == [(1, 2, 4)]
    assert dict(restore(core2, table)) == {"finished": 1, "resumed": 3, "lost": 0}
    assert await core2.expand([batch]) == hanging
    assert core2.table.batch(batch).open
    await wait_until(lambda: {j for h in hosts2.made for j in h.resumed} == set(hanging[1:]))
    third = await core2.extend(part_of(core2, batch, 1))  # still open after the restart
    await wait_until(lambda: core2.jobs[third["job_ids"][0]].state is JobState.RUNNING)
    assert await core2.close_batch(batch)
    await core2.cancel_many([batch])
    assert (await core2.job_block([batch], timeout_seconds=10))["done"]
    await core2.aclose()
    await journal2.aclose()

    core3, journal3, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core3, table)) == {"finished": 5, "resumed": 0, "lost": 0}
    restored = core3.table.batch(batch)
    assert not restored.open and restored.cancelled and restored.parts == 3
    with pytest.raises(UsageError, match="was cancelled"):
        await core3.extend(part_of(core3, batch, 1))
    await core3.aclose()
    await journal3.aclose()


async def test_usage_and_budget_restore_across_parts(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    out = await core.submit(submission(core, 1, budget_tokens=10**9), open=True)
    batch = out["batch_id"]
    more = await core.extend(part_of(core, batch, 2), last=True)
    assert (await core.job_block([batch], timeout_seconds=20))["done"]
    before = (await core.list_jobs(batch=batch))["totals"]["batches"][batch]
    assert before["total_tokens"] > 0
    await journal.commit()
    crash_core(core, journal, hosts)

    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core2, table)) == {"finished": 3, "resumed": 0, "lost": 0}
    after = (await core2.list_jobs(batch=batch))["totals"]["batches"][batch]
    assert after == before
    assert await core2.expand([batch]) == out["job_ids"] + more["job_ids"]
    await core2.aclose()
    await journal2.aclose()


async def test_a_compacted_journal_keeps_an_open_grown_batch_as_one(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    first = await core.submit(submission(core, 1, script=HANG), open=True)
    batch = first["batch_id"]
    second = await core.extend(part_of(core, batch, 2))
    await wait_until(lambda: all(j in core.table.checkpoints for j in second["job_ids"]))
    core.compact_bytes = 0
    assert await compact_if_due(core)
    await journal.commit()
    crash_core(core, journal, hosts)

    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert table.open == {batch} and not table.grown
    assert dict(restore(core2, table)) == {"finished": 0, "resumed": 3, "lost": 0}
    assert await core2.expand([batch]) == first["job_ids"] + second["job_ids"]
    assert core2.table.batch(batch).open
    await core2.cancel_many([batch])
    await core2.aclose()
    await journal2.aclose()


def test_an_old_journal_without_parts_loads_closed_and_stray_records_are_skipped():
    row = {"job_id": "sa_00000001", "batch_id": "b_1", "agent": "a", "clone_index": 0}
    row.update(clone_count=1, state="completed")
    table = fold(
        [
            {"k": "batch", "b": "b_1", "jobs": [row], "parts": 0},
            {"k": "grow", "b": "b_2", "n": 1, "jobs": [], "parts": 0},  # no such batch
            {"k": "grow", "b": "b_1", "n": 0, "jobs": [], "parts": 0},  # not a later part
            {"k": "close", "b": "b_9"},
        ]
    )
    assert table.batches == {"b_1": ["sa_00000001"]}
    assert not table.open and not table.grown and table.skipped == 3


def test_a_part_whose_row_names_another_batch_is_skipped():
    row = {"job_id": "sa_00000001", "batch_id": "b_1", "agent": "a", "clone_index": 0}
    row.update(clone_count=1, state="reserved")
    other = {**row, "job_id": "sa_00000002", "batch_id": "b_2"}
    table = fold(
        [
            {"k": "batch", "b": "b_1", "jobs": [row], "parts": 0, "open": True},
            {"k": "grow", "b": "b_1", "n": 1, "jobs": [other], "parts": 0},
            {"k": "close", "b": "b_1", "why": "closed"},
        ]
    )
    assert table.batches == {"b_1": ["sa_00000001"]} and table.skipped == 1
    assert not table.open and not table.cancelled


def _read(folder: Any) -> list[dict[str, Any]]:
    from clonefleet.journal import read_journal

    return list(read_journal(folder).records)


async def test_a_part_the_journal_cannot_keep_is_not_added(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    out = await core.submit(submission(core, 1, script=HANG), open=True)
    batch = out["batch_id"]
    journal.close()  # a journal that takes no more records
    refused = part_of(core, batch, 2)
    with pytest.raises(UsageError, match="is closed; open a new one"):
        await core.extend(refused)
    assert list(core.table.batch_job_ids[batch]) == out["job_ids"]
    assert set(core.jobs) == set(out["job_ids"]) and core.table.batch(batch).open
    assert core.table.batch(batch).parts == 2  # the refused part's number is not given again
    crash_core(core, journal, hosts)


class _Records:
    """Where a :class:`Durable` writes its records, kept in a list (a journal without disk)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    ending=st.sampled_from(["open", "last", "close", "cancel"]),
    piece=st.sampled_from([200, _durable.BLOB_PART]),
)
def test_folding_a_batch_and_its_parts_gives_every_job_each_from_its_own_part(sizes, ending, piece):
    core = SchedulerCore(InstantHost.factory(1))
    sink = _Records()
    durable = _durable.Durable(sink)  # type: ignore[arg-type]
    first = make_submission(core, sizes[0])
    batch = first.batch_id
    durable.batch(batch, core.table.add_batch(first, open=True), first, open=True)
    parts = [first]
    saved = _durable.BLOB_PART
    _durable.BLOB_PART = piece
    try:
        for number, size in enumerate(sizes[1:], start=1):
            part = part_of(core, batch, size)
            last = ending == "last" and number == len(sizes) - 1
            durable.part(batch, number, core.table.extend_batch(part), part, last=last)
            parts.append(part)
    finally:
        _durable.BLOB_PART = saved
    if ending in ("close", "cancel") or (ending == "last" and len(sizes) == 1):
        durable.closed(batch, cancelled=ending == "cancel")
    table = fold(sink.records)
    assert table.skipped == 0
    assert table.batches[batch] == [s.job_id for p in parts for s in p.specs]
    assert (batch in table.open) is (ending == "open")
    assert (batch in table.cancelled) is (ending == "cancel")
    assert [n for n, _, _ in table.grown.get(batch, [])] == list(range(1, len(sizes)))
    for number, part in enumerate(parts):
        kept = pickle.loads(table.blobs[_durable.part_key(batch, number)])
        assert [s.job_id for s in kept.specs] == [s.job_id for s in part.specs]
    for number, start, end in table.grown.get(batch, []):
        assert table.batches[batch][start:end] == [s.job_id for s in parts[number].specs]


async def test_parts_fill_the_batch_s_hosts_instead_of_starting_new_ones():
    hosts = LocalHosts()
    core = SchedulerCore(hosts, cpus=2)
    first = await core.submit(make_submission(core, 3, script=HANG), open=True)
    batch = first["batch_id"]
    ids = list(first["job_ids"])
    for n in (4, 1, 5):  # each part lands on the two hosts of the first, the least busy first
        ids += (await core.extend(part_of(core, batch, n, script=HANG)))["job_ids"]
    assert len(hosts.made) == 2
    per_host = [sum(core.jobs[j].host_id == h.host_id for j in ids) for h in hosts.made]
    assert sorted(per_host) == [6, 7]
    await wait_until(lambda: all(core.jobs[j].state is JobState.RUNNING for j in ids))
    await core.cancel_many([batch])
    assert (await core.job_block([batch], timeout_seconds=10))["done"]
    await core.aclose()


async def test_parts_with_clones_per_host_fill_each_host_to_it_then_start_new_ones():
    hosts = LocalHosts()
    core = SchedulerCore(hosts, cpus=2)
    first = await core.submit(make_submission(core, 2, script=HANG, per=3), open=True)
    batch = first["batch_id"]
    ids = list(first["job_ids"])
    ids += (await core.extend(part_of(core, batch, 5, script=HANG, per=3)))["job_ids"]
    per_host = [sum(core.jobs[j].host_id == h.host_id for j in ids) for h in hosts.made]
    assert per_host == [3, 3, 1]
    await core.cancel_many([batch])
    assert (await core.job_block([batch], timeout_seconds=10))["done"]
    await core.aclose()


async def test_a_part_after_the_batch_s_hosts_went_idle_gets_new_hosts():
    hosts = LocalHosts()
    core = SchedulerCore(hosts, cpus=2)
    first = await core.submit(make_submission(core, 2), open=True)
    batch = first["batch_id"]
    await wait_until(lambda: all(core.jobs[j].is_terminal for j in first["job_ids"]))
    await wait_until(lambda: not core.hosts.live())
    second = await core.extend(part_of(core, batch, 2), last=True)
    assert (await core.job_block([batch], timeout_seconds=10))["done"]
    assert {core.jobs[j].state for j in second["job_ids"]} == {JobState.COMPLETED}
    assert len(hosts.made) == 4
    await core.aclose()


async def test_reading_a_growing_batch_s_events_sees_each_new_part_s_jobs():
    core = SchedulerCore(InstantHost.factory(2))
    first = await core.submit(make_submission(core, 2), open=True)
    batch = first["batch_id"]
    await wait_until(lambda: all(core.jobs[j].is_terminal for j in first["job_ids"]))
    page = await core.events(batch, cursor=0, level="lifecycle")
    assert {e["subagent_run_id"] for e in page["events"]} == set(first["job_ids"])
    other = await core.submit(make_submission(core, 1))  # another batch's events stay out
    second = await core.extend(part_of(core, batch, 3), last=True)
    assert (await core.job_block([batch], timeout_seconds=10))["done"]
    page = await core.events(batch, cursor=page["cursor"], level="lifecycle")
    seen = {e["subagent_run_id"] for e in page["events"]}
    assert seen == set(second["job_ids"])
    assert not seen & set(other["job_ids"])
    await core.aclose()
