"""The job table alone: a batch enters, queues, runs under its cap and leaves in one step."""

from __future__ import annotations

import pytest

from clonefleet.errors import IdCollision, UnknownJobError
from clonefleet.scheduler._table import JobTable
from clonefleet.testing import make_submission
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(30)


def test_a_batch_enters_waiting_and_its_ids_are_taken():
    table = JobTable()
    sub = make_submission(table, 3)
    assert set(table.reserved) == {s.job_id for s in sub.specs}
    rows = table.add_batch(sub)
    assert [r.state for r in rows] == [JobState.RESERVED] * 3
    assert not table.reserved and table.queued == 3 and table.running == 0
    assert table.expand([sub.batch_id]) == [s.job_id for s in sub.specs]
    assert all(table.is_waiting(s.job_id) for s in sub.specs)
    with pytest.raises(IdCollision):
        table.check_ids(sub)
    with pytest.raises(UnknownJobError):
        table.get("sa_nope")


def test_the_queue_starts_jobs_round_robin_within_the_caps():
    table = JobTable()
    capped = make_submission(table, 4, cap=1)
    free = make_submission(table, 4)
    for sub in (capped, free):
        table.add_batch(sub)
        table.enqueue(sub.batch_id, table.waiting_in(sub.batch_id))
    taken = table.take_queued(3)
    assert [b for b, _ in taken] == [capped.batch_id, free.batch_id, free.batch_id]
    assert table.running == 3 and table.queued == 5
    batch = table.batch(capped.batch_id)
    assert batch is not None and batch.running == 1 and batch.cap == 1
    first = table.get(taken[0][1])
    table.ending(first)
    first.finish(first.run_record(status=JobState.CANCELLED))
    assert table.running == 2 and table.spec_of(first.job_id) is None
    assert [b for b, _ in table.take_queued(3)] == [capped.batch_id]


def test_forgetting_a_batch_drops_every_trace_of_it_in_one_step():
    table = JobTable()
    parent_sub = make_submission(table, 1)
    table.add_batch(parent_sub)
    parent = parent_sub.specs[0].job_id
    child_sub = make_submission(table, 2, parent=parent)
    table.add_batch(child_sub)
    kids = [s.job_id for s in child_sub.specs]
    table.set_checkpoint(kids[0], b"state")
    assert list(table.children_of(parent)) == kids and table.queued == 3
    assert table.forget_batch(child_sub.batch_id) == kids
    assert table.batch(child_sub.batch_id) is None
    assert not any(k in table.jobs for k in kids)
    assert list(table.children_of(parent)) == [] and table.queued == 1
    assert table.checkpoint_of(kids[0]) is None and table.spec_of(kids[0]) is None
    assert table.forget_batch(child_sub.batch_id) == []
