"""A batch that grows on real Ray actors: parts submitted into one open batch id all run, and
the batch is done only once closed."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_an_open_batch_takes_two_parts_and_is_done_once_closed(fleet):
    from clonefleet.fleet import plan_batch

    def plan(count, batch_id=None):
        return plan_batch(
            "general-purpose",
            "summarise the repository",
            count,
            config=fleet.config,
            caller_cwd=fleet.cwd,
            batch_id=batch_id,
        )

    first = fleet.submit(plan(2), open=True)
    second = fleet.extend(plan(3, first.batch_id))
    third = fleet.extend(plan(1, first.batch_id))
    assert second.batch_id == third.batch_id == first.batch_id
    every = [*first.job_ids, *second.job_ids, *third.job_ids]
    assert len(set(every)) == 6
    assert fleet.job_block(every, timeout_seconds=90)["done"]
    # Every job so far has ended, but the batch is open: not done, one more "remaining".
    assert not fleet.job_block([first.batch_id], timeout_seconds=0.2)["done"]
    assert fleet.remaining([first.batch_id]) == 1
    assert fleet.close_batch(first.batch_id) is True
    done = fleet.job_block([first.batch_id], timeout_seconds=30)
    assert done["done"] and [j["job_id"] for j in done["jobs"]] == every
    assert {j["status"] for j in done["jobs"]} == {"completed"}
    assert fleet.close_batch(first.batch_id) is False
