"""Listing jobs and reading events a page at a time (no Ray): every job exactly once, each reply
bounded, whatever the size of the table."""

from __future__ import annotations

import pickle
import time
from dataclasses import replace

import pytest

from clonefleet.config import Config
from clonefleet.errors import UsageError
from clonefleet.journal import Journal
from clonefleet.scheduler import JournalView, SchedulerCore
from clonefleet.scheduler._durable import Durable
from clonefleet.testing import LocalHost, LocalHosts, make_submission, wait_until
from clonefleet.vocab import JobState

HANG = {"default": [{"hang": True}]}
BIG = 100_000
PAGE = 1000


def hanging(core, count, cap=1):
    config = Config(limits={"max_count": BIG})
    return make_submission(core, count, config=config, script=HANG, cap=cap)


@pytest.mark.timeout(120)
async def test_a_listing_of_100000_jobs_comes_page_by_page_each_job_once(capsys):
    core = SchedulerCore(LocalHost)
    out = await core.submit(hanging(core, BIG))
    ids = out["job_ids"]
    seen: list[str] = []
    cursor, pages, slowest, biggest = None, 0, 0.0, 0
    begun = time.perf_counter()
    while True:
        started = time.perf_counter()
        page = await core.list_jobs(cursor=cursor, limit=PAGE)
        slowest = max(slowest, time.perf_counter() - started)
        biggest = max(biggest, len(pickle.dumps(page)))
        assert len(page["jobs"]) <= PAGE
        seen.extend(j["job_id"] for j in page["jobs"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    total_s = time.perf_counter() - begun
    assert len(seen) == BIG and set(seen) == set(ids)  # every job exactly once
    assert seen == ids  # in the order they were submitted
    assert pages == BIG // PAGE
    assert biggest < 2_000_000, f"a page of {PAGE} jobs took {biggest:,} bytes"
    assert page["totals"]["batches"][out["batch_id"]]["jobs"] == BIG
    assert page["capacity"] == {"running": 1, "max_concurrency": None, "queued": BIG - 1}
    # The same through a batch filter, a status filter (sparse: one running job) and events.
    by_batch = await _walk(core, batch=out["batch_id"])
    assert by_batch == ids
    assert await _walk(core, status=str(JobState.RUNNING)) == [ids[0]]
    events, event_pages = [], 0
    cursor_n = 0
    while True:
        chunk = await core.events(out["batch_id"], cursor=cursor_n)
        assert len(chunk["events"]) <= 5000
        if not chunk["events"]:
            break
        events.extend(chunk["events"])
        event_pages += 1
        cursor_n = chunk["cursor"]
    assert sum(e["event"]["type"] == "queued" for e in events) == BIG and event_pages >= 20
    with capsys.disabled():
        print(
            f"\n{BIG:,} jobs, {pages} pages of {PAGE}: {total_s / pages * 1000:.1f} ms a page "
            f"on average, slowest {slowest * 1000:.1f} ms, largest {biggest:,} bytes pickled"
        )
    await core.aclose()


async def _walk(core, **filters) -> list[str]:
    seen, cursor = [], None
    while True:
        page = await core.list_jobs(**filters, cursor=cursor, limit=PAGE)
        seen.extend(j["job_id"] for j in page["jobs"])
        cursor = page["next_cursor"]
        if cursor is None:
            return seen


@pytest.mark.timeout(30)
async def test_without_a_limit_the_listing_is_whole_as_before_and_cursors_are_checked():
    core = SchedulerCore(LocalHost)
    first = await core.submit(hanging(core, 30, cap=2))
    second = await core.submit(hanging(core, 20, cap=2))
    whole = await core.list_jobs()
    assert [j["job_id"] for j in whole["jobs"]] == first["job_ids"] + second["job_ids"]
    assert whole["next_cursor"] is None and set(whole["totals"]["batches"]) == {
        first["batch_id"],
        second["batch_id"],
    }
    page = await core.list_jobs(limit=25)
    assert len(page["jobs"]) == 25 and page["next_cursor"]
    assert set(page["totals"]["batches"]) == {first["batch_id"]}  # the batches on the page
    with pytest.raises(UsageError, match="not given by this listing"):
        await core.list_jobs(batch=first["batch_id"], cursor=page["next_cursor"])
    with pytest.raises(UsageError, match="not given by this listing"):
        await core.list_jobs(cursor="j:oops")
    for bad in (0, -1, True, "5"):
        with pytest.raises(UsageError, match="1 or more"):
            await core.list_jobs(limit=bad)
    rest = await core.list_jobs(cursor=page["next_cursor"], limit=1000)
    assert [j["job_id"] for j in page["jobs"] + rest["jobs"]] == [
        j["job_id"] for j in whole["jobs"]
    ]
    assert len((await core.list_jobs(limit=50_000))["jobs"]) == 50  # capped, never refused
    await core.cancel_many([first["batch_id"], second["batch_id"]])
    await core.aclose()


@pytest.mark.timeout(30)
async def test_a_cursor_stays_good_while_jobs_are_added_and_batches_evicted():
    from clonefleet.scheduler._recovery import evict_expired

    core = SchedulerCore(LocalHost)
    config = Config(durability={"retention_s": 0.0})
    done = await core.submit(make_submission(core, 10, config=config))
    assert (await core.job_block(done["job_ids"], timeout_seconds=10))["done"]
    live = await core.submit(hanging(core, 10))
    page = await core.list_jobs(limit=12)
    assert [j["job_id"] for j in page["jobs"]] == done["job_ids"] + live["job_ids"][:2]
    assert evict_expired(core, time.time() + 1) == [done["batch_id"]]
    more = await core.submit(hanging(core, 5))
    rest = await core.list_jobs(cursor=page["next_cursor"], limit=100)
    assert [j["job_id"] for j in rest["jobs"]] == live["job_ids"][2:] + more["job_ids"]
    assert done["batch_id"] not in (await core.list_jobs())["totals"]["batches"]
    await core.cancel_many([live["batch_id"], more["batch_id"]])
    await core.aclose()


@pytest.mark.timeout(30)
async def test_events_come_at_most_limit_a_page():
    core = SchedulerCore(LocalHost)
    out = await core.submit(make_submission(core, 5, config=Config()))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    whole = (await core.events(out["batch_id"]))["events"]
    paged, cursor = [], 0
    while True:
        page = await core.events(out["batch_id"], cursor=cursor, limit=3)
        assert len(page["events"]) <= 3
        if not page["events"]:
            break
        paged.extend(page["events"])
        cursor = page["cursor"]
    assert paged == whole
    with pytest.raises(UsageError, match="1 or more"):
        await core.events(out["batch_id"], limit=0)
    await core.aclose()


@pytest.mark.timeout(60)
async def test_the_journal_read_offline_pages_the_same_way(tmp_path):
    journal, _ = Journal.open(tmp_path / "j")
    journal.start_background(0.01)
    hosts = LocalHosts()
    core = SchedulerCore(hosts, durable=Durable(journal))
    config = Config(limits={"max_count": BIG}, durability={"checkpoint_interval_s": 0.0})
    sub = make_submission(core, 2500, config=config, script=HANG, cap=1)
    out = await core.submit(replace(sub, budget_tokens=10**9))
    await wait_until(lambda: core.jobs[out["job_ids"][0]].state is JobState.RUNNING)
    await journal.commit()
    for host in hosts.made:
        host.kill()
    await core.aclose()
    await journal.aclose()

    view = JournalView(tmp_path / "j")
    seen, cursor = [], None
    while True:
        page = view.list_jobs(cursor=cursor, limit=PAGE)
        assert len(page["jobs"]) <= PAGE
        seen.extend(j["job_id"] for j in page["jobs"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == out["job_ids"]
    budget = page["totals"]["batches"][out["batch_id"]]["budget"]
    assert budget["budget_tokens"] == 10**9 and not budget["passed"]
    assert len(view.list_jobs()["jobs"]) == 2500
