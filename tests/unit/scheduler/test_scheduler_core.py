"""SchedulerCore with in-process hosts: job table, pool, events, control (no Ray)."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from clonefleet.errors import UnknownJobError, UsageError
from clonefleet.planning import BatchSubmission
from clonefleet.providers import SimScript
from clonefleet.scheduler import TRANSITIONS, JobRecord, SchedulerCore, choose_clones_per_actor
from clonefleet.testing import LocalHost, make_submission
from clonefleet.vocab import JobState

submission = partial(make_submission, restarts=2, latency_ms=0)
"""A test batch (see ``make_submission``)."""


async def test_batch_runs_to_completion_with_distinct_ids_and_one_result_event_each():
    core = SchedulerCore(LocalHost)
    out = await core.submit(submission(core, 6))
    ids = out["job_ids"]
    assert len(set(ids)) == 6 and all(j.startswith("sa_") and len(j) == 11 for j in ids)
    done = await core.job_block(ids, timeout_seconds=10)
    assert done["done"]
    assert [(await core.job_result(j))["status"] for j in ids] == ["completed"] * 6
    page = await core.events(target=out["batch_id"], level="all")
    results = [e for e in page["events"] if e["event"]["type"] == "result"]
    assert sorted(e["subagent_run_id"] for e in results) == sorted(ids)
    await core.aclose()


async def test_cap_queues_jobs_as_reserved_and_starts_them_as_slots_free():
    core = SchedulerCore(LocalHost)
    sub = submission(core, 10, cap=3, latency_ms=20)
    out = await core.submit(sub)
    listing = await core.list_jobs(batch=out["batch_id"])
    states = [j["status"] for j in listing["jobs"]]
    assert states.count("running") == 3 and states.count("reserved") == 7
    assert listing["capacity"]["queued"] == 7
    # Watch the clones really running (each is an asyncio task named by its job id), apart from
    # the scheduler's own count: the cap must be reached and never passed.
    ids = set(out["job_ids"])
    live_peak = counted_peak = 0
    blocked = asyncio.ensure_future(core.job_block(out["job_ids"], timeout_seconds=10))
    while not blocked.done():
        live = sum(t.get_name() in ids for t in asyncio.all_tasks())
        live_peak = max(live_peak, live)
        counted_peak = max(counted_peak, core.capacity()["running"])
        await asyncio.sleep(0.001)
    assert (await blocked)["done"]
    assert (live_peak, counted_peak) == (3, 3)
    assert all(core.jobs[j].state is JobState.COMPLETED for j in out["job_ids"])
    await core.aclose()


async def test_job_result_while_running_is_a_usage_error_and_cancel_is_idempotent():
    core = SchedulerCore(LocalHost)
    script = SimScript.from_data({"default": [{"hang": True}]})
    out = await core.submit(submission(core, 2, script=script))
    job = out["job_ids"][0]
    with pytest.raises(UsageError, match="still"):
        await core.job_result(job)
    first = await core.job_cancel(job)
    await core.job_block([job], timeout_seconds=5)
    second = await core.job_cancel(job)
    assert (await core.job_result(job))["status"] == "cancelled"
    assert (await core.job_result(job))["error"] == "Error: subagent run was cancelled"
    assert first["job_id"] == second["job_id"] == job
    await core.job_cancel(out["job_ids"][1])
    await core.aclose()


async def test_unknown_ids_are_refused_and_ids_in_use_collide():
    from dataclasses import replace

    from clonefleet.errors import IdCollision

    core = SchedulerCore(LocalHost)
    with pytest.raises(UnknownJobError):
        await core.job_status("sa_00000000")
    sub = submission(core, 2)
    await core.submit(sub)
    with pytest.raises(IdCollision):
        await core.submit(sub)  # same batch id again
    reused = replace(sub, batch_id="b_other", specs=(replace(sub.specs[0], batch_id="b_other"),))
    with pytest.raises(IdCollision) as info:
        await core.submit(reused)  # a job id already in the table
    assert info.value.ident == sub.specs[0].job_id
    doubled = replace(
        sub,
        batch_id="b_twice",
        specs=(replace(sub.specs[0], job_id="sa_99999999", batch_id="b_twice"),) * 2,
    )
    with pytest.raises(IdCollision):
        await core.submit(doubled)
    batch_id, ids = core.reserve_ids(1)
    foreign = replace(
        sub, batch_id="b_thief", specs=(replace(sub.specs[0], job_id=ids[0], batch_id="b_thief"),)
    )
    with pytest.raises(IdCollision):
        await core.submit(foreign)  # reserved for another batch
    await core.aclose()


def test_transition_table_is_exhaustive_and_terminal_states_are_final():
    for src in JobState:
        for dst in JobState:
            rec = JobRecord(
                job_id="sa_1", batch_id="b", agent="a", clone_index=0, clone_count=1, state=src
            )
            if dst in TRANSITIONS[src]:
                rec.move(dst)
                assert rec.state is dst
            else:
                with pytest.raises(UsageError):
                    rec.move(dst)


@pytest.mark.parametrize(
    ("count", "cpus", "nodes", "per"),
    [(8, 2, 1, 4), (1, 2, 1, 1), (10_000, 2, 1, 5000), (10, 4, 3, 3), (3, 16, 1, 1)],
)
def test_clones_per_actor_is_chosen_from_batch_and_cluster(count, cpus, nodes, per):
    assert choose_clones_per_actor(count, cpus, nodes) == per


async def test_fleet_wide_cap_holds_across_batches():
    core = SchedulerCore(LocalHost, max_concurrency=3)
    first = await core.submit(submission(core, 5, latency_ms=15))
    second = await core.submit(submission(core, 5, latency_ms=15))
    ids = first["job_ids"] + second["job_ids"]
    peak = 0
    while not (await core.job_block(ids, wait_seconds=0.02))["done"]:
        peak = max(peak, core.capacity()["running"])
        assert core.capacity()["running"] + core.capacity()["queued"] <= 10
    assert peak == 3
    assert {core.jobs[j].state for j in ids} == {JobState.COMPLETED}
    await core.aclose()


async def test_failed_run_keeps_exact_error_and_records_each_models_failure():
    core = SchedulerCore(LocalHost)
    script = SimScript.from_data({"default": [{"error": 401}, {"error": 403}]})
    sub = submission(core, 1, script=script)
    sub = BatchSubmission(
        batch_id=sub.batch_id,
        specs=tuple(
            s.__class__(
                **{
                    **{f: getattr(s, f) for f in s.__dataclass_fields__},
                    "candidates": ("sim-small", "sim-large"),
                }
            )
            for s in sub.specs
        ),
        config=sub.config,
        sim_script=script,
    )
    job = (await core.submit(sub))["job_ids"][0]
    await core.job_block([job], timeout_seconds=10)
    status = await core.job_status(job)
    assert status["error"] == "Error: subagent run failed"
    assert (
        "sim-small" in status["detail"]
        and "sim-large" in status["detail"]
        and "401" in status["detail"]
    )
    await core.aclose()


async def test_warm_hosts_are_reused_across_batches_and_dead_ones_replaced():
    from clonefleet.errors import ClusterError

    made: list[LocalHost] = []

    class DeadOnStart(LocalHost):
        async def start(self, specs, config, sim_script=None, resume=None):
            raise ClusterError("gone while idle")

    def factory(host_id, control):
        host = (DeadOnStart if not made else LocalHost)(host_id, control)
        made.append(host)
        return host

    core = SchedulerCore(factory, cpus=2)
    core.warm(2)
    assert len(made) == 2
    first = await core.submit(submission(core, 4))
    assert (await core.job_block(first["job_ids"], timeout_seconds=10))["done"]
    # Uncapped: the dead warm host's clones moved to one fresh host (the live one already holds
    # its share of the batch); nothing failed.
    assert len(made) == 3 and {core.jobs[j].state for j in first["job_ids"]} == {JobState.COMPLETED}
    for _ in range(100):
        if len(core.hosts.idle) == 2:
            break
        await core.job_block(first["job_ids"], wait_seconds=0.01)
    assert sorted(h.host_id for h in core.hosts.idle) == ["h2", "h3"], "the dead one never again"
    second = await core.submit(submission(core, 4))
    assert (await core.job_block(second["job_ids"], timeout_seconds=10))["done"]
    assert len(made) == 3, "the second batch ran on the warm hosts"
    assert {core.jobs[j].host_id for j in second["job_ids"]} == {"h2", "h3"}
    await core.aclose()


async def test_cancelling_a_batch_ends_queued_jobs_at_once_and_calls_each_host_once():
    calls: list[tuple[str, int]] = []

    class CountingHost(LocalHost):
        async def cancel(self, job_ids):
            calls.append((self.host_id, len(job_ids)))
            return await super().cancel(job_ids)

    core = SchedulerCore(CountingHost)
    script = SimScript.from_data({"default": [{"hang": True}]})
    out = await core.submit(submission(core, 10, script=script, cap=6, per=5))
    assert core.capacity() == {"running": 6, "max_concurrency": None, "queued": 4}
    running = await core.cancel_many([out["batch_id"]])
    assert running == 6
    assert sorted(calls) == [("h1", 5), ("h2", 1)]
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    assert {core.jobs[j].state for j in out["job_ids"]} == {JobState.CANCELLED}
    assert await core.cancel_many([out["batch_id"]]) == 0  # idempotent
    await core.aclose()


async def test_a_job_whose_host_dies_keeps_the_turns_and_usage_its_events_counted():
    from clonefleet.errors import ClusterError

    class DiesAfterUsage(LocalHost):
        """Delivers events until one of them is a usage event, then is gone."""

        counted = False

        async def drain(self, wait_s=1.0):
            if self.counted:
                raise ClusterError("host process died")
            batch = await super().drain(wait_s)
            self.counted = any(item["event"]["type"] == "usage" for item in batch)
            return batch

    core = SchedulerCore(DiesAfterUsage)
    script = SimScript.from_data(
        {"default": [{"tool": "progress_update", "args": {"summary": "working"}}, {"hang": True}]}
    )
    job = (await core.submit(submission(core, 1, script=script, restarts=0)))["job_ids"][0]
    assert (await core.job_block([job], timeout_seconds=10))["done"]
    record = await core.job_result(job)
    assert record["status"] == "failed" and record["stop_reason"] == "abnormal"
    assert record["error"].startswith("Error: subagent run ended abnormally (clone host h1 died")
    assert record["turns"] == 1
    assert record["usage"]["total_tokens"] > 0
    assert record["usage"] == core.jobs[job].usage == (await core.job_status(job))["usage"]
    await core.aclose()


async def test_a_capped_batch_runs_every_remaining_job_after_queued_ones_are_cancelled():
    # Cancelled queued jobs stay in the batch's queue; taking one must count as progress, or
    # the pool stops with free slots and the rest of the batch stays reserved forever.
    core = SchedulerCore(LocalHost)
    out = await core.submit(submission(core, 10, cap=2, latency_ms=30))
    ids = out["job_ids"]
    queued = [j for j in ids if core.jobs[j].state is JobState.RESERVED]
    assert len(queued) == 8
    for job_id in queued[:3]:
        await core.job_cancel(job_id)
    assert (await core.job_block(ids, timeout_seconds=20))["done"]
    states = [core.jobs[j].state for j in ids]
    assert states.count(JobState.CANCELLED) == 3
    assert states.count(JobState.COMPLETED) == 7
    assert core.capacity()["queued"] == 0 and core.capacity()["running"] == 0
    await core.aclose()


async def test_the_queued_count_leaves_out_queued_jobs_that_were_cancelled():
    core = SchedulerCore(LocalHost)
    script = SimScript.from_data({"default": [{"hang": True}]})
    out = await core.submit(submission(core, 6, script=script, cap=2))
    queued = [j for j in out["job_ids"] if core.jobs[j].state is JobState.RESERVED]
    await core.job_cancel(queued[0])
    assert core.capacity() == {"running": 2, "max_concurrency": None, "queued": 3}
    await core.cancel_many([out["batch_id"]])
    await core.aclose()


async def test_waits_count_jobs_that_end_out_of_order():
    # A wait skips the ended jobs at the front of its list and stops at the first running one:
    # a job behind it that ended meanwhile must still count as ended, and the front one must
    # still count as running.
    core = SchedulerCore(LocalHost)
    script = SimScript.from_data({"default": [{"hang": True}]})
    ids = (await core.submit(submission(core, 4, script=script)))["job_ids"]
    await core.job_cancel(ids[3])
    await core.job_cancel(ids[1])
    assert await core.remaining(ids, wait_seconds=0.02) == 2
    blocked = await core.job_block(ids, timeout_seconds=0.02)
    assert not blocked["done"]
    assert [j["status"] for j in blocked["jobs"]] == [
        "running",
        "cancelled",
        "running",
        "cancelled",
    ]
    waiting = asyncio.ensure_future(core.job_block(ids, timeout_seconds=10))
    await core.job_cancel(ids[0])
    await asyncio.sleep(0.01)
    assert not waiting.done()  # the third job still runs
    await core.job_cancel(ids[2])
    assert (await asyncio.wait_for(waiting, 5))["done"]
    assert await core.remaining(ids) == 0
    await core.aclose()
