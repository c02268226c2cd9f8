"""A scheduler that starts over its journal (no Ray): finished results come back, unfinished
jobs resume from their checkpoints once, and what cannot be resumed ends "cluster lost"."""

from __future__ import annotations

from functools import partial

import pytest

from clonefleet.journal import Journal, read_journal
from clonefleet.scheduler import SchedulerCore
from clonefleet.scheduler._durable import Durable
from clonefleet.scheduler._recovery import evict_expired, restore
from clonefleet.testing import (
    LocalHosts,
    crash_core,
    make_submission,
    open_journaled_core,
    wait_until,
)
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(30)

HANG = {"default": [{"tool": "progress_update", "args": {"summary": "step"}}, {"hang": True}]}


submission = partial(make_submission, restarts=2, checkpoint_s=0.0)
"""A test batch (see ``make_submission``) that checkpoints every turn."""


async def test_a_restarted_scheduler_keeps_results_and_resumes_unfinished_jobs(tmp_path):
    hosts = LocalHosts()
    core, journal, table = open_journaled_core(tmp_path / "j", hosts)
    assert not table.jobs
    done = await core.submit(submission(core, 3))
    assert (await core.job_block(done["job_ids"], timeout_seconds=10))["done"]
    results = {j: await core.job_result(j) for j in done["job_ids"]}
    hang = await core.submit(submission(core, 2, script=HANG))
    await wait_until(lambda: all(j in core.table.checkpoints for j in hang["job_ids"]))
    await journal.commit()
    crash_core(core, journal, hosts)

    hosts2 = LocalHosts()
    core2, journal2, table = open_journaled_core(tmp_path / "j", hosts2)
    report = restore(core2, table)
    assert dict(report) == {"finished": 3, "resumed": 2, "lost": 0}
    assert {j: await core2.job_result(j) for j in done["job_ids"]} == results
    assert set(await core2.expand([hang["batch_id"]])) == set(hang["job_ids"])
    await wait_until(lambda: any(h.resumed for h in hosts2.made))
    resumed = {j: c for h in hosts2.made for j, c in h.resumed.items()}
    assert set(resumed) == set(hang["job_ids"])
    for job_id in hang["job_ids"]:
        status = await core2.job_status(job_id)
        assert status["status"] == "running" and status["restarts"] == 1
        assert status["detail"].startswith("resumed after the scheduler restarted")
    await core2.cancel_many([hang["batch_id"]])
    assert (await core2.job_block(hang["job_ids"], timeout_seconds=10))["done"]
    await core2.aclose()
    await journal2.aclose()

    # A third start sees every job ended exactly once.
    core3, journal3, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core3, table)) == {"finished": 5, "resumed": 0, "lost": 0}
    states = {j: core3.jobs[j].state for j in hang["job_ids"]}
    assert set(states.values()) == {JobState.CANCELLED}
    await core3.aclose()
    await journal3.aclose()


async def test_a_job_past_max_restarts_or_without_its_batch_ends_cluster_lost(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    out = await core.submit(submission(core, 1, script=HANG, restarts=0))
    await wait_until(lambda: core.jobs[out["job_ids"][0]].turns == 1)
    await journal.commit()
    crash_core(core, journal, hosts)
    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core2, table)) == {"finished": 0, "resumed": 0, "lost": 1}
    record = await core2.job_result(out["job_ids"][0])
    assert record["status"] == "failed" and "cluster lost" in record["error"]
    await core2.aclose()
    await journal2.aclose()


async def test_the_ids_come_back_only_once_the_batch_is_on_disk(tmp_path):
    class Watching(Journal):
        async def commit(self) -> None:
            self.committed_before_return = True
            await super().commit()

    journal = Watching(tmp_path / "j")
    core = SchedulerCore(LocalHosts(), durable=Durable(journal))
    out = await core.submit(submission(core, 2))
    assert journal.committed_before_return

    kinds = [r["k"] for r in read_journal(tmp_path / "j").records]
    assert kinds[:2] == ["part", "batch"]  # the pickled submission, then the batch
    await core.job_block(out["job_ids"], timeout_seconds=10)
    await core.aclose()
    await journal.aclose()


async def test_retention_evicts_finished_batches_and_the_journal_forgets_them(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    out = await core.submit(submission(core, 2))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    assert evict_expired(core, now=1e12) == [out["batch_id"]]
    assert not core.jobs
    await core.aclose()
    await journal.aclose()
    _, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert not table.jobs and not table.batches
    await journal2.aclose()


async def test_two_unfinished_batches_are_both_placed_before_either_starts(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    first = await core.submit(submission(core, 2, script=HANG))
    second = await core.submit(submission(core, 3, script=HANG))
    await journal.commit()
    crash_core(core, journal, hosts)
    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core2, table)) == {"finished": 0, "resumed": 5, "lost": 0}
    ids = [*first["job_ids"], *second["job_ids"]]
    assert all(core2.jobs[j].state is JobState.RUNNING for j in ids)
    await core2.cancel_many(ids)
    assert (await core2.job_block(ids, timeout_seconds=10))["done"]
    await core2.aclose()
    await journal2.aclose()


async def test_a_large_submission_is_kept_in_parts_and_read_back_whole(tmp_path, monkeypatch):
    from clonefleet.scheduler import _durable

    monkeypatch.setattr(_durable, "BLOB_PART", 512)  # a few hundred bytes a part
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    out = await core.submit(submission(core, 3, script=HANG))
    await journal.commit()
    kinds = [
        r["k"]
        for r in __import__("clonefleet.journal").journal.read_journal(tmp_path / "j").records
    ]
    assert kinds.count("part") > 2
    crash_core(core, journal, hosts)
    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core2, table)) == {"finished": 0, "resumed": 3, "lost": 0}
    await core2.cancel_many(out["job_ids"])
    await core2.aclose()
    await journal2.aclose()
