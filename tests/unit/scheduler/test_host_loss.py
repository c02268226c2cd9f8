"""A clone host that dies: its started clones restart elsewhere from their checkpoints, jobs it
never started move on, and dead warm hosts are replaced before a batch lands on them (no Ray)."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import LocalHost, LocalHosts, make_submission, wait_until
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(30)

SLOW = {"default": [{"tool": "progress_update", "args": {"summary": "step"}}, {"hang": True}]}


submission = partial(make_submission, restarts=2, checkpoint_s=0.0)
"""A test batch (see ``make_submission``) that checkpoints every turn."""


async def event_types(core, target=None):
    """The type of each lifecycle event of ``target`` (every job: ``None``), with its job id."""
    page = await core.events(target, limit=5000)
    return [(env["subagent_run_id"], env["event"]["type"]) for env in page["events"]]


async def results_per_job(core, ids):
    counts = dict.fromkeys(ids, 0)
    for job_id, kind in await event_types(core):
        if kind == "result":
            counts[job_id] += 1
    return counts


async def test_a_killed_hosts_clones_restart_on_a_fresh_host_from_their_checkpoint():
    pool = LocalHosts()
    core = SchedulerCore(pool)
    out = await core.submit(submission(core, 2, script=SLOW, per=2))
    ids = out["job_ids"]
    await wait_until(lambda: all(j in core.table.checkpoints for j in ids))
    first = core.jobs[ids[0]].host_id
    pool.host(first).kill()
    await wait_until(lambda: all(core.jobs[j].restarts == 1 for j in ids))
    await wait_until(lambda: all(core.jobs[j].host_id != first for j in ids))
    fresh = pool.host(core.jobs[ids[0]].host_id)
    await wait_until(lambda: fresh.starts == 1)
    assert set(fresh.resumed) == set(ids), "each clone resumed from its checkpoint"
    assert all(fresh.resumed[j]["turns"] == 1 for j in ids)
    assert all(core.jobs[j].state is JobState.RUNNING for j in ids)
    kinds = [kind for _, kind in await event_types(core, ids[0])]
    assert kinds.count("restarted") == 1
    await core.cancel_many([out["batch_id"]])
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    assert await results_per_job(core, ids) == dict.fromkeys(ids, 1)
    await core.aclose()


async def test_a_clone_whose_hosts_keep_dying_fails_after_max_restarts_saying_so():
    pool = LocalHosts()
    core = SchedulerCore(pool)
    job = (await core.submit(submission(core, 1, script=SLOW, restarts=2)))["job_ids"][0]
    for attempt in range(3):
        await wait_until(
            lambda n=attempt: core.jobs[job].restarts == n and job in core.table.checkpoints
        )
        host = pool.host(core.jobs[job].host_id)
        await wait_until(lambda h=host: h.starts == 1)
        core.table.drop_checkpoint(job)
        host.kill()
    assert (await core.job_block([job], timeout_seconds=10))["done"]
    record = await core.job_result(job)
    assert record["status"] == "failed" and record["stop_reason"] == "abnormal"
    assert "restarted 2 time(s), limits.max_restarts is 2" in record["error"]
    assert await results_per_job(core, [job]) == {job: 1}
    await core.aclose()


async def test_dead_idle_warm_hosts_are_replaced_and_the_next_batch_runs_no_ghosts():
    pool = LocalHosts()
    core = SchedulerCore(pool, cpus=2)
    core.warm(2)
    await asyncio.sleep(0)  # the watches start
    for host in list(pool.made):
        host.kill()
    await wait_until(lambda: core.hosts.replaced == 2)
    assert {h.host_id for h in core.hosts.idle} == {"h3", "h4"}
    out = await core.submit(submission(core, 4))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    assert {core.jobs[j].state for j in out["job_ids"]} == {JobState.COMPLETED}
    assert pool.host("h1").starts == pool.host("h2").starts == 0
    await core.aclose()


async def test_a_warm_host_dead_at_start_moves_its_jobs_without_failing_or_ghosting_them():
    # Died too recently for its watch to tell: the start fails, nothing ran there, and the
    # jobs start on a fresh host; none is reported failed while a clone of it runs.
    class Unwatched(LocalHost):
        watch = None  # type: ignore[assignment]

    made: list[LocalHost] = []

    def factory(host_id, control):
        made.append(Unwatched(host_id, control))
        return made[-1]

    core = SchedulerCore(factory, cpus=2)
    core.warm(2)
    for host in made:
        host.kill()
    out = await core.submit(submission(core, 6))
    ids = out["job_ids"]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    assert {core.jobs[j].state for j in ids} == {JobState.COMPLETED}
    assert {core.jobs[j].restarts for j in ids} == {0}, "a job never started is not restarted"
    assert await results_per_job(core, ids) == dict.fromkeys(ids, 1)
    await core.aclose()


async def test_a_capped_batch_whose_host_dies_still_runs_every_remaining_job():
    pool = LocalHosts()
    core = SchedulerCore(pool)
    slow = {"default": [{"tool": "progress_update", "args": {"summary": "s"}, "latency_ms": 30}]}
    sub = submission(core, 8, script=slow, per=4)
    sub = type(sub)(
        **{**{f: getattr(sub, f) for f in sub.__dataclass_fields__}, "max_concurrency": 2}
    )
    ids = (await core.submit(sub))["job_ids"]
    await wait_until(lambda: any(core.jobs[j].state is JobState.RUNNING for j in ids))
    running = next(j for j in ids if core.jobs[j].state is JobState.RUNNING)
    await wait_until(lambda: core.hosts.has_started(core.hosts.host_of(running), running))
    pool.host(core.jobs[running].host_id).kill()
    assert (await core.job_block(ids, timeout_seconds=20))["done"]
    assert {core.jobs[j].state for j in ids} == {JobState.COMPLETED}
    assert core.capacity()["queued"] == 0 and core.capacity()["running"] == 0
    await core.aclose()


async def test_a_dead_hosts_queue_moves_at_once_to_the_live_host_and_no_host_is_made():
    # A capped batch on two hosts: one dies with 4 clones running and 21 queued. All 25 move
    # to the surviving host in one step (none waits for a slot to find its host dead and then
    # move alone to a new host), and the batch finishes without a third host.
    pool = LocalHosts()
    core = SchedulerCore(pool)
    slow = {"default": [{"tool": "progress_update", "args": {"summary": "s"}, "latency_ms": 20}]}
    sub = submission(core, 50, script=slow, per=25)
    sub = type(sub)(
        **{**{f: getattr(sub, f) for f in sub.__dataclass_fields__}, "max_concurrency": 4}
    )
    ids = (await core.submit(sub))["job_ids"]
    assert len(pool.made) == 2
    running = [j for j in ids if core.jobs[j].state is JobState.RUNNING]
    dead = core.jobs[running[0]].host_id
    survivor = next(h.host_id for h in pool.made if h.host_id != dead)
    await wait_until(lambda: all(core.hosts.has_started(pool.host(dead), j) for j in running))
    queued = [
        j for j in ids if core.jobs[j].host_id == dead and core.jobs[j].state is JobState.RESERVED
    ]
    assert len(queued) >= 15
    pool.host(dead).kill()
    await wait_until(lambda: all(core.jobs[j].host_id != dead for j in queued))
    assert {core.jobs[j].host_id for j in queued} == {survivor}
    assert all(core.jobs[j].restarts == 0 for j in queued), "a queued job is not restarted"
    assert (await core.job_block(ids, timeout_seconds=20))["done"]
    assert {core.jobs[j].state for j in ids} == {JobState.COMPLETED}
    assert len(pool.made) == 2, "no new host: the live one took the dead one's jobs"
    assert pool.host(dead).starts == 1, "nothing tried to start on the dead host again"
    assert await results_per_job(core, ids) == dict.fromkeys(ids, 1)
    await core.aclose()


async def test_an_uncapped_batch_keeps_its_spread_a_dead_hosts_clones_go_to_one_new_host():
    # Uncapped, every bound clone runs at once: piling a dead host's clones onto the survivors
    # would double their load (and put more clones in the way of the next death). They go,
    # together, to one new host of the batch's planned size; the survivors keep theirs.
    pool = LocalHosts()
    core = SchedulerCore(pool)
    ids = (await core.submit(submission(core, 9, script=SLOW, per=3)))["job_ids"]
    assert len(pool.made) == 3
    await wait_until(lambda: all(j in core.table.checkpoints for j in ids))
    dead = core.jobs[ids[0]].host_id
    victims = [j for j in ids if core.jobs[j].host_id == dead]
    others = {j: core.jobs[j].host_id for j in ids if j not in victims}
    pool.host(dead).kill()
    await wait_until(lambda: all(core.jobs[j].restarts == 1 for j in victims))
    assert len(pool.made) == 4, "one new host for the dead one's clones"
    assert {core.jobs[j].host_id for j in victims} == {pool.made[-1].host_id}
    assert {j: core.jobs[j].host_id for j in others} == others, "the survivors keep their share"
    await core.cancel_many([core.jobs[ids[0]].batch_id])
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    assert await results_per_job(core, ids) == dict.fromkeys(ids, 1)
    await core.aclose()


class RecordingLink:
    """An inbox link that records what the scheduler asks of it."""

    def __init__(self) -> None:
        self.resent: list[tuple[str, list[str]]] = []

    async def acked(self, delivery_ids):
        return None

    async def ended(self, job_ids):
        return []

    async def resend(self, jobs):
        self.resent.extend(jobs)


async def test_a_clone_resumed_on_another_host_asks_the_inbox_for_what_its_checkpoint_lacks():
    pool = LocalHosts()
    core = SchedulerCore(pool)
    link = RecordingLink()
    core.mail.link = link
    out = await core.submit(submission(core, 2, script=SLOW, per=2))
    ids = out["job_ids"]
    await wait_until(lambda: all(j in core.table.checkpoints for j in ids))
    assert all(isinstance(core.table.checkpoints[j], bytes) for j in ids), "checkpoints come packed"
    pool.host(core.jobs[ids[0]].host_id).kill()
    await wait_until(lambda: len(link.resent) == 2)
    assert sorted(link.resent) == sorted((j, []) for j in ids)
    await core.cancel_many([out["batch_id"]])
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    await core.aclose()


async def test_a_clone_restarted_before_its_first_checkpoint_asks_the_inbox_for_everything():
    """Its dead clone may have taken deliveries no checkpoint recorded: the new one asks for
    every delivery of its job (the clone skips none it has, since it has none)."""
    pool = LocalHosts()
    core = SchedulerCore(pool)
    link = RecordingLink()
    core.mail.link = link
    never = partial(make_submission, restarts=2, checkpoint_s=3600.0)  # none ships in time
    out = await core.submit(never(core, 2, script=SLOW, per=2))
    ids = out["job_ids"]
    await wait_until(lambda: all(core.jobs[j].progress for j in ids))  # a turn taken
    first = core.jobs[ids[0]].host_id
    assert not any(j in core.table.checkpoints for j in ids)
    pool.host(first).kill()
    await wait_until(lambda: len(link.resent) == 2)
    assert sorted(link.resent) == sorted((j, []) for j in ids)
    assert all(core.jobs[j].restarts == 1 for j in ids)
    await core.cancel_many([out["batch_id"]])
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    await core.aclose()
