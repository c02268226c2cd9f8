"""Usage totals and budgets across a scheduler restart (no Ray): the journal keeps what batches
spent and what they may spend, without a record per model response."""

from __future__ import annotations

from functools import partial

import pytest

from clonefleet.journal import read_journal
from clonefleet.scheduler import JournalView
from clonefleet.scheduler._recovery import compact_if_due, restore
from clonefleet.testing import (
    LocalHosts,
    crash_core,
    make_submission,
    open_journaled_core,
    wait_until,
)
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(30)

STEP_THEN_HANG = {
    "default": [{"tool": "progress_update", "args": {"summary": "step"}}, {"hang": True}]
}
PRICED = {
    "sim-small": {
        "provider": "sim",
        "name": "sim-small",
        "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
    }
}


submission = partial(make_submission, models=PRICED, checkpoint_s=0.0)
"""A test batch (see ``make_submission``) of a priced model that checkpoints every turn."""


def usage(tokens: int) -> dict:
    return {
        "type": "usage",
        "ts": 0.0,
        "turn": 1,
        "model": "sim-small",
        "input_tokens": tokens,
        "output_tokens": 0,
        "total_tokens": tokens,
    }


async def test_totals_and_costs_come_back_after_a_restart_and_offline(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    out = await core.submit(submission(core, 3))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    before = await core.list_jobs(batch=out["batch_id"])
    assert before["totals"]["batches"][out["batch_id"]]["cost_usd"] > 0
    await journal.commit()
    crash_core(core, journal, hosts)

    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    restore(core2, table)
    after = await core2.list_jobs(batch=out["batch_id"])
    assert after["totals"] == before["totals"]
    assert [j["cost_usd"] for j in after["jobs"]] == [j["cost_usd"] for j in before["jobs"]]
    offline = JournalView(tmp_path / "j").list_jobs(batch=out["batch_id"])
    assert offline["totals"] == before["totals"]
    # A compacted journal keeps them too (in its batch records).
    core2.compact_bytes = 0
    assert await compact_if_due(core2)
    await journal2.aclose()
    assert (
        JournalView(tmp_path / "j").list_jobs()["totals"]["batches"] == before["totals"]["batches"]
    )
    await core2.aclose()


async def test_a_budget_keeps_counting_what_was_spent_before_a_restart(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    # Each clone's first response costs 56 tokens; 3 x 56 = 168 stays within 200.
    out = await core.submit(submission(core, 3, script=STEP_THEN_HANG, budget_tokens=200))
    await wait_until(lambda: all(j in core.table.checkpoints for j in out["job_ids"]))
    await journal.commit()
    crash_core(core, journal, hosts)

    hosts2 = LocalHosts()
    core2, journal2, table = open_journaled_core(tmp_path / "j", hosts2)
    assert dict(restore(core2, table)) == {"finished": 0, "resumed": 3, "lost": 0}
    assert sum(core2.capacity()[k] for k in ("running", "queued")) == 3
    view = (await core2.list_jobs(batch=out["batch_id"]))["totals"]["batches"][out["batch_id"]]
    assert view["total_tokens"] == 168 and view["budget"]["spent_tokens"] == 168
    assert not view["budget"]["passed"]
    await wait_until(lambda: all(core2.jobs[j].state is JobState.RUNNING for j in out["job_ids"]))
    # 40 more tokens pass the budget only because the 168 spent before the restart count.
    core2.apply_event(out["job_ids"][0], usage(40))
    assert (await core2.job_block(out["job_ids"], timeout_seconds=10))["done"]
    assert {core2.jobs[j].stop_reason for j in out["job_ids"]} == {"budget"}
    await core2.aclose()
    await journal2.aclose()


async def test_a_batch_past_its_budget_at_a_restart_starts_none_of_its_jobs(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    out = await core.submit(submission(core, 3, script=STEP_THEN_HANG, cap=1, budget_tokens=100))
    first = out["job_ids"][0]
    await wait_until(lambda: first in core.table.checkpoints)
    core.apply_event(first, usage(500))  # passes the budget: the queued two end now, on disk
    crash_core(core, journal, hosts)  # before the running clone's cancel could land

    hosts2 = LocalHosts()
    core2, journal2, table = open_journaled_core(tmp_path / "j", hosts2)
    restore(core2, table)
    assert (await core2.job_block(out["job_ids"], timeout_seconds=10))["done"]
    assert {(core2.jobs[j].state, core2.jobs[j].stop_reason) for j in out["job_ids"]} == {
        (JobState.CANCELLED, "budget")
    }
    assert sum(h.starts for h in hosts2.made) == 0
    assert core2.capacity()["queued"] == 0 and core2.capacity()["running"] == 0
    await core2.aclose()
    await journal2.aclose()
    assert read_journal(tmp_path / "j").damage == []
