"""Planning one more part of an open batch: the clones carry the given batch id, and drawing
new ids keeps it."""

from __future__ import annotations

import pytest

from clonefleet.config import Config
from clonefleet.planning import plan_batch

pytestmark = pytest.mark.timeout(60)


def test_a_part_planned_with_a_batch_id_keeps_it_when_redrawn(tmp_path):
    plan = plan_batch(
        "general-purpose", "go", 3, config=Config(), caller_cwd=tmp_path, batch_id="b_0a1b2c3d"
    )
    assert plan.submission.batch_id == "b_0a1b2c3d"
    assert {s.batch_id for s in plan.submission.specs} == {"b_0a1b2c3d"}
    again = plan.redraw()
    assert again.submission.batch_id == "b_0a1b2c3d"
    assert {s.batch_id for s in again.submission.specs} == {"b_0a1b2c3d"}
    assert set(again.job_ids).isdisjoint(plan.job_ids)
    fresh = plan_batch("general-purpose", "go", 1, config=Config(), caller_cwd=tmp_path)
    assert fresh.submission.batch_id != "b_0a1b2c3d"
