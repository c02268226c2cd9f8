"""The scheduler's event log stays bounded: older events leave memory for the journal and are
still read, in order and with the same sequence numbers, through a cursor."""

from __future__ import annotations

import pytest

from clonefleet.journal import Journal
from clonefleet.scheduler import JobRecord
from clonefleet.scheduler._durable import Durable, read_table
from clonefleet.scheduler._events import EventLog

pytestmark = pytest.mark.timeout(30)


def table(n: int = 3) -> dict[str, JobRecord]:
    return {
        f"sa_{i:08x}": JobRecord(
            job_id=f"sa_{i:08x}", batch_id="b_1", agent="a", clone_index=i, clone_count=n
        )
        for i in range(n)
    }


async def read_all(log: EventLog, target: set[str] | None = None) -> list[dict]:
    out, cursor = [], 0
    for _ in range(100):
        page = await log.read(target, cursor, "all", 0.0)
        if not page["events"]:
            return out
        out.extend(page["events"])
        cursor = page["cursor"]
    raise AssertionError("too many pages")


async def test_memory_holds_at_most_max_events_and_older_ones_are_read_back_in_order():
    jobs = table()
    kept: list = []

    def unspill(cursor):
        return [(first + i, e) for first, entries in kept for i, e in enumerate(entries)]

    log = EventLog(
        jobs, max_events=1000, spill=lambda first, e: kept.append((first, e)), unspill=unspill
    )
    ids = list(jobs)
    for n in range(5000):
        log.record(ids[n % 3], {"type": "progress", "n": n})
        assert len(log.entries) <= 1000
    events = await read_all(log)
    assert [e["seq"] for e in events] == list(range(5000))
    assert [e["event"]["n"] for e in events] == list(range(5000))
    mine = await read_all(log, {ids[1]})
    assert [e["event"]["n"] for e in mine] == list(range(1, 5000, 3))


async def test_spilled_events_go_to_the_journal_and_a_new_log_numbers_after_them(tmp_path):
    jobs = table()
    journal = Journal(tmp_path / "j")
    durable = Durable(journal)
    log = EventLog(jobs, max_events=1000, spill=durable.events, unspill=durable.read_events)
    ids = list(jobs)
    for n in range(3000):
        log.record(ids[n % 3], {"type": "usage", "n": n})
    journal.flush_sync()
    events = await read_all(log)
    assert [e["event"]["n"] for e in events] == list(range(3000))
    journal.close()
    _, replay = Journal.open(tmp_path / "j")
    restored = read_table(replay)
    assert restored.events_next == log.base
    again = EventLog(jobs, max_events=1000)
    again.continue_at(restored.events_next)
    again.record(ids[0], {"type": "usage", "n": -1})
    assert (await read_all(again))[-1]["seq"] == restored.events_next
    _.close()


async def test_a_jobs_events_share_its_ancestor_set_and_name_and_a_child_is_wrapped_twice():
    jobs = table(2)
    parent, other = list(jobs)
    child = "sa_0000beef"
    jobs[child] = JobRecord(
        job_id=child, batch_id="b_2", agent="kid", clone_index=4, clone_count=5, parent=parent
    )
    log = EventLog(jobs, max_events=1000)
    for job_id in (parent, parent, other, child, child):
        log.record(job_id, {"type": "progress"})
    sets = [entry[0] for entry in log.entries]
    assert sets[0] is sets[1] and sets[0] == {parent}  # made once, shared
    assert sets[2] == {other} and sets[3] is sets[4] and sets[3] == {child, parent}
    events = await read_all(log, {parent})
    assert [e["subagent_run_id"] for e in events] == [parent, parent, parent, parent]
    inner = events[2]["event"]
    assert inner["subagent_run_id"] == child and inner["display_name"] == "kid #4"
    assert events[0]["display_name"] == "a #0" and inner["event"] == {"type": "progress"}
