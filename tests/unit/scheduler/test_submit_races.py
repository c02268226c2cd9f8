"""Batches submitted at the same time: one submit's pump never takes another's jobs before they
have their hosts (no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from clonefleet.config import Config
from clonefleet.scheduler import Durable, SchedulerCore
from clonefleet.testing import LocalHosts, make_submission
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(30)


class GatedDurable(Durable):
    """A journal whose first commit waits for :attr:`gate` (a slow disk under one submit)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self._first = True

    async def commit(self) -> None:
        if self._first:
            self._first = False
            self.waiting.set()
            await self.gate.wait()


async def test_a_submit_whose_journal_record_is_slow_keeps_its_jobs_from_another_submits_pump():
    durable = GatedDurable()
    core = SchedulerCore(LocalHosts(), durable=durable)
    config = Config()
    first = asyncio.ensure_future(core.submit(make_submission(core, 20, config=config)))
    await durable.waiting.wait()  # the first batch's jobs are in the table, not yet placed
    second = await core.submit(make_submission(core, 20, config=config))
    durable.gate.set()
    out = await first
    ids = [*out["job_ids"], *second["job_ids"]]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    assert {core.jobs[j].state for j in ids} == {JobState.COMPLETED}
    assert core.capacity() == {"running": 0, "max_concurrency": None, "queued": 0}
    await core.aclose()


async def test_a_capped_fleet_shares_slots_between_two_concurrent_submits():
    durable = GatedDurable()
    core = SchedulerCore(LocalHosts(), max_concurrency=3, durable=durable)
    slow = {"default": [{"tool": "progress_update", "args": {"summary": "s"}, "latency_ms": 5}]}
    config = Config()
    first = asyncio.ensure_future(
        core.submit(make_submission(core, 12, config=config, script=slow))
    )
    await durable.waiting.wait()
    second = await core.submit(make_submission(core, 12, config=config, script=slow))
    durable.gate.set()
    out = await first
    ids = [*out["job_ids"], *second["job_ids"]]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    assert {core.jobs[j].state for j in ids} == {JobState.COMPLETED}
    assert all(core.jobs[j].host_id for j in ids)
    await core.aclose()
