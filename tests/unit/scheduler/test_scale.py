"""The scheduler core past one batch (no Ray): 100,000 jobs to terminal in bounded time, with no
per-job quadratic cost, and a big drain folded without holding the scheduler's loop."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import pytest

from clonefleet.cluster import GC_THRESHOLDS
from clonefleet.config import Config
from clonefleet.errors import ClusterError
from clonefleet.journal import Journal
from clonefleet.scheduler import Durable, SchedulerCore, evict_expired
from clonefleet.scheduler._hosts import DRAIN_CALLS_PER_S
from clonefleet.testing import InstantHost, make_submission, wait_until

CONFIG = Config(limits={"max_count": 200_000})


@pytest.fixture
def actor_gc():
    """The collector thresholds the scheduler actor runs with (``cluster.tune_collector``)."""
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    yield
    gc.set_threshold(*before)


async def _run(count: int, turns: int, per: int) -> tuple[float, SchedulerCore]:
    """CPU seconds (of this process: other work on the machine does not count) from submit
    until every job of a ``count`` batch is terminal."""
    core = SchedulerCore(InstantHost.factory(turns))
    sub = make_submission(core, count, config=CONFIG, per=per)
    begun = time.process_time()
    await core.submit(sub)
    await wait_until(lambda: not (core.capacity()["running"] or core.capacity()["queued"]), 100)
    took = time.process_time() - begun
    await core.aclose()
    return took, core


@pytest.mark.timeout(120)
async def test_a_batch_of_100000_jobs_ends_in_bounded_time_without_quadratic_cost(actor_gc):
    # The smaller batch's CPU is the best of two: on a shared machine a single one varied
    # 0.62-1.04 s, enough to make a linear cost look 16 times bigger. A per-job cost that grows
    # with the table (quadratic) would make the ten times bigger batch cost about 100 times more.
    small = min([(await _run(10_000, turns=1, per=500))[0] for _ in range(2)])
    big, core = await _run(100_000, turns=1, per=500)
    assert len(core.jobs) == 100_000
    assert all(rec.state == "completed" for rec in core.jobs.values())
    assert big < 20.0, f"100,000 jobs took {big:.1f} s of CPU"
    assert big < 20 * small, f"100,000 jobs took {big:.2f} s of CPU, 10,000 took {small:.2f} s"


@pytest.mark.timeout(30)
async def test_a_big_drain_is_folded_in_chunks_so_other_calls_are_answered_meanwhile():
    hosts: list[InstantHost] = []

    def factory(host_id: str, control: object) -> InstantHost:
        hosts.append(InstantHost(host_id, control, turns=2))
        return hosts[-1]

    count = 5000
    core = SchedulerCore(factory)
    await core.submit(make_submission(core, count, config=CONFIG, per=count))
    seen: set[int] = set()
    while core.capacity()["running"]:
        seen.add(core.capacity()["running"])  # what a status call would see meanwhile
        await asyncio.sleep(0)
    assert len(hosts) == 1 and hosts[0].drains[0] == count * 10  # one drain of 50,000 events
    partly = {n for n in seen if 0 < n < count}
    assert len(partly) >= 3, f"calls saw only {sorted(seen)} running while the drain was folded"
    await core.aclose()


class _RefusingFleet:
    """A ``Fleet`` whose submission fails: the run stops there, with the fleet kept to look at."""

    made: list[_RefusingFleet] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.wait_margin_s = 2.0
        _RefusingFleet.made.append(self)

    def submit(self, plan: object) -> None:
        raise ClusterError("no cluster in this test")

    def close(self) -> None:
        pass


@pytest.mark.timeout(30)
def test_run_follows_a_busy_scheduler_instead_of_giving_up_after_two_seconds(
    tmp_path, monkeypatch, capsys
):
    import clonefleet.fleet as fleet_module
    from clonefleet.cli import program as cli
    from clonefleet.cli.run import FOLLOW_MARGIN_S

    _RefusingFleet.made = []
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CLONEFLEET_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fleet_module, "Fleet", _RefusingFleet)
    code = cli.main(["run", "general-purpose", "--prompt", "hi", "--count", "2"])
    assert code != 0 and "no cluster in this test" in capsys.readouterr().err
    assert [f.wait_margin_s for f in _RefusingFleet.made] == [FOLLOW_MARGIN_S]
    assert FOLLOW_MARGIN_S >= 30.0


@pytest.mark.timeout(60)
async def test_a_follower_behind_memory_reads_every_spilled_event_even_before_its_flush(
    tmp_path,
):
    journal, _ = Journal.open(tmp_path / "journal")  # no background flush: only commits write
    config = Config(limits={"max_count": 200_000}, durability={"max_events": 1000})
    core = SchedulerCore(
        InstantHost.factory(1), durable=Durable(journal), durability=config.durability
    )
    count = 2000
    out = await core.submit(make_submission(core, count, config=config, per=500))
    await wait_until(lambda: not core.capacity()["running"], 30)
    results, cursor = [], 0
    for _ in range(100):
        page = await core.events(out["batch_id"], cursor=cursor, level="lifecycle")
        results += [e for e in page["events"] if e["event"]["type"] == "result"]
        cursor = page["cursor"]
        if cursor >= core.event_log.next_seq:
            break
    assert len({e["subagent_run_id"] for e in results}) == len(results) == count
    await core.aclose()
    await journal.aclose()


@pytest.mark.timeout(30)
async def test_an_evicted_batch_leaves_nothing_per_job_in_the_host_pool():
    config = Config(durability={"retention_s": 0})
    core = SchedulerCore(InstantHost.factory(1))
    out = await core.submit(make_submission(core, 300, config=config, per=100))
    await wait_until(lambda: not core.capacity()["running"], 20)
    assert core.hosts.host_of(out["job_ids"][0]) is not None
    assert evict_expired(core, time.time() + 1.0) == [out["batch_id"]]
    assert not core.jobs
    assert all(core.hosts.host_of(j) is None for j in out["job_ids"])
    await core.aclose()


class ChattyHost(InstantHost):
    """A host that always has one more event (for no job of the table): every drain answers at
    once, as a host of many busy clones would."""

    calls = 0

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        ChattyHost.calls += 1
        await asyncio.sleep(0)
        return [{"job_id": "sa_elsewhere", "event": {"type": "progress", "ts": 0.0}}]


@pytest.mark.timeout(30)
async def test_drains_of_many_busy_hosts_are_spaced_to_a_bounded_call_rate():
    ChattyHost.calls = 0
    core = SchedulerCore(ChattyHost.factory(1))
    hosts = 200  # each drain answers at once: unpaced, thousands of calls in the window
    sub = make_submission(core, hosts, config=CONFIG, per=1)
    for host_id in range(hosts):  # bound, never started: their drain loops run until closed
        core.hosts.bind(core.hosts.new_host(), [sub.specs[host_id].job_id])
    await asyncio.sleep(0.05)
    before, begun = ChattyHost.calls, time.monotonic()
    for _ in range(6):  # a window of 0.3 s
        await asyncio.sleep(0.05)
    took = time.monotonic() - begun
    rate = (ChattyHost.calls - before) / took
    assert rate <= 1.5 * DRAIN_CALLS_PER_S, f"{rate:.0f} drain calls/s from {hosts} hosts"
    await core.aclose()
