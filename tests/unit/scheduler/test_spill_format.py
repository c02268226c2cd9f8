"""Spilled events write each job's envelope fields once per record and read back exactly as they
were, nested envelopes and records in the older whole-envelope form included."""

from __future__ import annotations

import msgpack
import pytest

from clonefleet.scheduler import JobRecord
from clonefleet.scheduler._events import EVENT_CHUNK, EventLog, spill_records, spilled_entries

pytestmark = pytest.mark.timeout(30)


def job(job_id: str, parent: str | None = None, index: int = 0) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        batch_id="b_1",
        agent="general-purpose",
        clone_index=index,
        clone_count=2,
        parent=parent,
        depth=1 if parent else 0,
    )


def logged(count: int) -> list:
    """Entries as the event log makes them: two root jobs, and a child of the first."""
    jobs = {j.job_id: j for j in (job("sa_a"), job("sa_b", index=1), job("sa_c", parent="sa_a"))}
    log = EventLog(jobs, max_events=10**6)
    for i in range(count):
        who = ("sa_a", "sa_b", "sa_c")[i % 3]
        log.record(who, {"type": "progress", "ts": float(i), "progress": {"n": i}})
    return list(log.entries)  # the entries themselves are what is spilled


def through_journal(records: list[dict]) -> list[dict]:
    return [msgpack.unpackb(msgpack.packb(r)) for r in records]


def test_spilled_events_read_back_exactly_with_headers_written_once_per_job():
    entries = logged(300)
    records = list(spill_records(0, entries))
    assert len(records) == 1 and len(records[0]["hd"]) == 3  # three distinct chains
    assert all(isinstance(row[1], int) for row in records[0]["ev"])
    back = [e for r in through_journal(records) for e in spilled_entries(r, 0)]
    assert back == [(i, entries[i]) for i in range(300)]
    nested = back[2][1][2]
    assert nested["subagent_run_id"] == "sa_a" and nested["event"]["subagent_run_id"] == "sa_c"
    assert list(back[0][1][2]) == list(entries[0][2])  # the fields in their order


def test_records_are_chunked_and_read_from_a_cursor():
    entries = logged(EVENT_CHUNK + 10)
    records = through_journal(list(spill_records(100, entries)))
    assert [r["from"] for r in records] == [100, 100 + EVENT_CHUNK]
    back = [seq for r in records for seq, _ in spilled_entries(r, 100 + EVENT_CHUNK + 5)]
    assert back == list(range(100 + EVENT_CHUNK + 5, 100 + EVENT_CHUNK + 10))


def test_an_envelope_with_other_fields_and_the_older_form_read_back_whole():
    (chain, kind, env), *_ = logged(1)
    odd = {**env, "extra": 1}
    (record,) = spill_records(7, [(chain, kind, odd)])
    assert record["ev"][0][1] == ["sa_a"]  # written whole
    older = {"k": "events", "from": 7, "ev": [[7, ["sa_a"], kind, env]]}
    for rec in through_journal([record, older]):
        ((seq, entry),) = spilled_entries(rec, 0)
        assert seq == 7 and entry[0] == chain and entry[2]["event"] == env["event"]


@pytest.mark.parametrize(
    "bad",
    [
        {"k": "events", "from": 0, "hd": [], "ev": [[0, 0, "progress", {}]]},
        {"k": "events", "from": 0, "hd": [["x"]], "ev": [[0, 0, "progress", {}]]},
        {"k": "events", "from": 0, "hd": [[["sa_a"], {}]], "ev": [[0, True, "progress", {}]]},
        {"k": "events", "from": 0, "hd": "x", "ev": [[0, 0, "progress", {}]]},
        {"k": "events", "from": 0, "ev": [[0, [1], "progress", {}]]},
    ],
)
def test_rows_that_make_no_sense_are_skipped(bad):
    assert list(spilled_entries(bad, 0)) == []
