"""A batch's journal record writes the values its rows share once (``base``); replay gives back
every job as it was, each with its own counters, and reads records written without ``base``."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from clonefleet.scheduler import JobRecord
from clonefleet.scheduler._durable import batch_records, fold, job_row, split_rows
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(30)


def jobs(n: int, **extra) -> list[JobRecord]:
    return [
        JobRecord(
            job_id=f"sa_{i:08x}",
            batch_id="b_1",
            agent="general-purpose",
            clone_index=i,
            clone_count=n,
            created_at=100.0 + i,
            **extra,
        )
        for i in range(n)
    ]


def replay(rows: list[JobRecord]) -> dict[str, JobRecord]:
    """Through the journal's encoding (msgpack) and back, as a restart reads it."""
    records = [msgpack.unpackb(msgpack.packb(r)) for r in batch_records("b_1", rows, None)]
    return fold(records).jobs


def test_a_new_batch_writes_its_shared_values_once_and_replays_every_job_as_it_was():
    rows = jobs(50)
    (record,) = batch_records("b_1", rows, None)
    assert sorted(record["jobs"][0]) == ["clone_index", "created_at", "job_id"]
    assert record["base"]["state"] == "reserved" and record["base"]["agent"] == "general-purpose"
    back = replay(rows)
    assert list(back) == [r.job_id for r in rows]
    assert all(job_row(back[r.job_id]) == job_row(r) for r in rows)


def test_replayed_jobs_never_share_a_map_or_list():
    back = list(replay(jobs(3)).values())
    back[0].usage["input_tokens"] += 7
    back[0].messages["queued"] += 1
    back[0].concerns.append("x")
    assert back[1].usage["input_tokens"] == 0 and back[2].messages["queued"] == 0
    assert back[1].concerns == []


def test_values_equal_but_of_another_type_are_not_shared():
    rows = [dataclasses.replace(r, usage={**r.usage, "turns": 1}) for r in jobs(3)]
    rows[1] = dataclasses.replace(rows[1], restarts=True)
    rows[2] = dataclasses.replace(rows[2], usage={**rows[2].usage, "turns": 1.0})
    shared, per_job = split_rows(rows)
    assert "restarts" not in shared and "usage" not in shared
    back = replay(rows)
    assert back[rows[1].job_id].restarts is True and back[rows[0].job_id].restarts == 0
    assert type(back[rows[2].job_id].usage["turns"]) is float
    assert type(back[rows[1].job_id].usage["turns"]) is int


def test_finished_rows_with_results_replay_whole():
    rows = [
        dataclasses.replace(r, state=JobState.COMPLETED, result={"summary": f"s{i}"}, turns=i)
        for i, r in enumerate(jobs(4))
    ]
    back = replay(rows)
    assert [back[r.job_id].result for r in rows] == [{"summary": f"s{i}"} for i in range(4)]
    assert all(back[r.job_id].state is JobState.COMPLETED for r in rows)


def test_a_record_written_without_base_still_replays():
    rows = jobs(3)
    record = {"k": "batch", "b": "b_1", "jobs": [job_row(r) for r in rows], "parts": 0}
    back = fold([msgpack.unpackb(msgpack.packb(record))]).jobs
    assert all(job_row(back[r.job_id]) == job_row(r) for r in rows)


def test_a_malformed_base_is_skipped_not_trusted():
    record = {"k": "batch", "b": "b_1", "jobs": [{"job_id": "sa_1"}], "base": ["x"]}
    table = fold([record])
    assert table.skipped == 1 and not table.jobs
