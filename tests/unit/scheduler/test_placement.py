"""Clone hosts that ask the cluster for resources (``cluster.*``): what a new host asks for,
how many clones it holds, and what happens when Ray places it late or never (no Ray: hosts that
wait for a "node" until the test places them)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from clonefleet.config import ClusterConfig, Config
from clonefleet.errors import ClusterError
from clonefleet.planning import Placement, autoscaled
from clonefleet.scheduler import SchedulerCore
from clonefleet.scheduler._hosts import choose_clones_per_actor
from clonefleet.testing import InstantHost, make_submission, wait_until
from clonefleet.vocab import EventType, JobState

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the pure rules ------------------------------------------------------------------------


def test_auto_asks_only_on_a_cluster_an_autoscaler_started_nodes_of():
    placement = Placement(ClusterConfig())
    assert not placement.asking and placement.ask() == {} and placement.cap() is None
    placement.autoscaled = True
    assert placement.ask() == {"CPU": 1.0} and placement.cap() == 500
    assert Placement(ClusterConfig(autoscale="on")).ask() == {"CPU": 1.0}
    off = Placement(ClusterConfig(autoscale="off"))
    off.autoscaled = True
    assert off.ask() == {} and off.cap() is None
    nothing = Placement(ClusterConfig(autoscale="on", host_resources={}))
    assert nothing.ask() == {} and nothing.cap() is None


def test_a_host_given_up_on_makes_new_hosts_ask_for_nothing_for_host_wait_s():
    clock = Clock()
    placement = Placement(ClusterConfig(autoscale="on", host_wait_s=60), clock=clock)
    placement.unplaced()
    assert placement.short and placement.ask() == {} and placement.cap() is None
    assert placement.asking  # the setting stands; only the shortage holds it back
    clock.now += 59.9
    assert placement.ask() == {}
    clock.now += 0.2
    assert placement.ask() == {"CPU": 1.0} and placement.given_up == 1


def test_ask_is_a_copy_of_the_setting():
    placement = Placement(ClusterConfig(autoscale="on", host_resources={"clonefleet_host": 1}))
    placement.ask()["clonefleet_host"] = 99
    assert placement.ask() == {"clonefleet_host": 1.0}


def test_autoscaled_reads_the_node_group_label_of_alive_nodes():
    head = {"Alive": True, "Labels": {"ray.io/node-id": "a"}}
    assert not autoscaled([head, {"Alive": True}])
    gone = {"Alive": False, "Labels": {"ray.io/node-group": "workers"}}
    assert not autoscaled([head, gone])
    assert autoscaled([head, {**gone, "Alive": True}])


def test_the_cap_makes_a_big_batch_want_more_hosts_than_cpus():
    assert choose_clones_per_actor(10_000, 2) == 5000  # today's: a host per CPU
    assert choose_clones_per_actor(10_000, 2, cap=500) == 500  # 20 hosts
    assert choose_clones_per_actor(6, 2, cap=500) == 3  # small batches as before
    assert choose_clones_per_actor(3, 8, cap=1) == 1


@pytest.mark.parametrize(
    "bad", [{"CPU": 0}, {"CPU": -1}, {"CPU": float("inf")}, {"": 1}, {"CPU": float("nan")}]
)
def test_host_resources_must_be_named_positive_numbers(bad):
    with pytest.raises(ValueError, match=r"cluster\.host_resources"):
        ClusterConfig(host_resources=bad)


def test_the_setting_is_strict():
    with pytest.raises(ValueError):
        Config.model_validate({"cluster": {"host_resource": {"CPU": 1}}})
    with pytest.raises(ValueError):
        ClusterConfig(host_wait_s=0)
    assert Config().cluster == ClusterConfig()


# -- the scheduler core with hosts that wait for a node ----------------------------------------


class WaitingHost(InstantHost):
    """A host that asked for resources: it answers nothing (as a Ray actor Ray has not placed)
    until :meth:`place`; closing it first (the scheduler gives it up) fails its calls."""

    def __init__(self, host_id: str, resources: Mapping[str, float]) -> None:
        super().__init__(host_id)
        self.resources = dict(resources)
        self._placed = asyncio.Event()
        self.closed = False
        self.started: list[str] = []

    def place(self) -> None:
        self._placed.set()

    async def _wait(self) -> None:
        await self._placed.wait()
        if self.closed:
            raise ClusterError(f"clone host {self.host_id} is gone")

    async def node_id(self) -> str:
        await self._wait()
        return "node-new"

    async def start(self, specs: Sequence[Any], *args: Any, **kwargs: Any) -> int:
        await self._wait()
        self.started += [s.job_id for s in specs]
        return await super().start(specs, *args, **kwargs)

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        await self._wait()
        return await super().drain(wait_s)

    async def close(self) -> None:
        self.closed = True
        self._placed.set()


class PlainHosts:
    """Hosts that ask for nothing: in-process, ending their clones at once."""

    def __init__(self) -> None:
        self.made: list[InstantHost] = []

    def __call__(self, host_id: str, control: Any) -> InstantHost:
        self.made.append(InstantHost(host_id, control))
        return self.made[-1]


class AskingHosts:
    def __init__(self) -> None:
        self.made: list[WaitingHost] = []

    def __call__(self, host_id: str, control: Any, resources: Mapping[str, float]) -> WaitingHost:
        self.made.append(WaitingHost(host_id, resources))
        return self.made[-1]


def _core(settings: ClusterConfig, *, cpus: int = 2, autoscaled: bool = True):
    plain, asking = PlainHosts(), AskingHosts()
    placement = Placement(settings)
    placement.autoscaled = autoscaled
    core = SchedulerCore(plain, cpus=cpus, placement=placement, asking_factory=asking)
    return core, plain, asking


def _states(core: SchedulerCore, ids: Sequence[str]) -> list[JobState]:
    return [core.jobs[j].state for j in ids]


def _events(core: SchedulerCore, job_id: str) -> list[dict[str, Any]]:
    return [env["event"] for jobs, _, env in core.event_log.entries if job_id in jobs]


def _types(core: SchedulerCore, job_id: str) -> list[str]:
    return [e["type"] for e in _events(core, job_id)]


async def test_without_an_autoscaler_no_host_asks_and_batches_run_as_before():
    core, plain, asking = _core(ClusterConfig(), autoscaled=False)
    sub = await core.submit(make_submission(core, 10))
    await wait_until(lambda: all(s is JobState.COMPLETED for s in _states(core, sub["job_ids"])))
    assert asking.made == [] and len(plain.made) == 2  # a host per CPU, 5 clones each
    await core.aclose()


async def test_a_big_batch_waits_for_hosts_the_cluster_adds_and_they_go_when_done():
    core, plain, asking = _core(ClusterConfig(max_clones_per_host=2))
    core.warm(1)
    sub = await core.submit(make_submission(core, 8))
    core.hosts.warm_hosts = 8  # room to keep every host warm
    ids = sub["job_ids"]
    # 4 hosts of 2: the warm one (asks for nothing) and 3 that ask for a CPU each.
    assert len(asking.made) == 3 and all(h.resources == {"CPU": 1.0} for h in asking.made)
    await wait_until(lambda: sum(s is JobState.COMPLETED for s in _states(core, ids)) == 2)
    assert _states(core, ids).count(JobState.RUNNING) == 6  # waiting for their hosts
    for host in asking.made:
        host.place()
    await wait_until(lambda: all(s is JobState.COMPLETED for s in _states(core, ids)))
    assert sorted(j for h in asking.made for j in h.started) == sorted(
        j for j in ids if core.jobs[j].host_id in {h.host_id for h in asking.made}
    )
    assert {core.jobs[j].node for j in ids if core.jobs[j].host_id != "h1"} == {"node-new"}
    await wait_until(lambda: all(h.closed for h in asking.made))  # never kept warm...
    assert [h.host_id for h in core.hosts.idle] == ["h1"]  # ...though the pool had room
    await core.aclose()


async def test_a_host_that_waits_tells_its_jobs_why(monkeypatch):
    monkeypatch.setattr("clonefleet.scheduler._core.PENDING_NOTICE_S", 0.05)
    core, _, asking = _core(ClusterConfig(autoscale="on", max_clones_per_host=1))
    sub = await core.submit(make_submission(core, 3))
    ids = sub["job_ids"]
    await wait_until(lambda: all(EventType.HOST_PENDING in _types(core, j) for j in ids))
    event = next(e for e in _events(core, ids[0]) if e["type"] == EventType.HOST_PENDING)
    assert event["resources"] == {"CPU": 1.0} and "cluster.host_wait_s" in event["detail"]
    for host in asking.made:
        host.place()
    await wait_until(lambda: all(s is JobState.COMPLETED for s in _states(core, ids)))
    await core.aclose()


async def test_hosts_never_placed_are_given_up_and_their_clones_packed_onto_running_hosts():
    settings = ClusterConfig(autoscale="on", max_clones_per_host=2, host_wait_s=0.3)
    core, plain, asking = _core(settings)
    core.warm(2)
    sub = await core.submit(make_submission(core, 12))
    ids = sub["job_ids"]
    assert len(asking.made) == 4  # 2 warm hosts + 4 asking, 2 clones each
    await wait_until(lambda: all(s is JobState.COMPLETED for s in _states(core, ids)), limit_s=10)
    assert all(h.closed and not h.started for h in asking.made)  # their demand withdrawn
    assert core.hosts.placement.given_up == 4 and core.hosts.placement.short
    assert {core.jobs[j].host_id for j in ids} <= {h.host_id for h in plain.made}
    # While the cluster is short, a new batch's hosts ask for nothing.
    more = await core.submit(make_submission(core, 6))
    await wait_until(lambda: all(s is JobState.COMPLETED for s in _states(core, more["job_ids"])))
    assert len(asking.made) == 4
    await core.aclose()


async def test_a_capped_batch_moves_its_queued_jobs_off_a_host_given_up_on():
    settings = ClusterConfig(autoscale="on", max_clones_per_host=3, host_wait_s=0.2)
    core, plain, asking = _core(settings, cpus=1)
    core.warm(1)
    sub = await core.submit(make_submission(core, 9, cap=2))
    ids = sub["job_ids"]
    await wait_until(lambda: all(s is JobState.COMPLETED for s in _states(core, ids)), limit_s=10)
    assert all(not h.started for h in asking.made) and len(asking.made) == 2
    assert {core.jobs[j].host_id for j in ids} == {"h1"}  # all packed onto the warm host
    await core.aclose()


async def test_a_host_placed_late_still_runs_its_clones_and_nothing_is_given_up():
    settings = ClusterConfig(autoscale="on", max_clones_per_host=1, host_wait_s=30)
    core, _, asking = _core(settings)
    sub = await core.submit(make_submission(core, 2))
    await asyncio.sleep(0.05)
    assert _states(core, sub["job_ids"]) == [JobState.RUNNING] * 2
    for host in asking.made:
        host.place()
    await wait_until(lambda: all(s is JobState.COMPLETED for s in _states(core, sub["job_ids"])))
    assert core.hosts.placement.given_up == 0 and all(h.started for h in asking.made)
    await core.aclose()


async def test_jobs_waiting_for_a_host_are_cancelled_at_once_and_the_host_withdrawn():
    settings = ClusterConfig(autoscale="on", max_clones_per_host=2, host_wait_s=30)
    core, _, asking = _core(settings)
    sub = await core.submit(make_submission(core, 4))
    ids = sub["job_ids"]
    await asyncio.sleep(0.05)
    status = await asyncio.wait_for(core.job_cancel(ids[0]), 2)
    assert status["status"] == "cancelled"
    assert not asking.made[0].closed  # its other job still waits for it
    await asyncio.wait_for(core.cancel_many([sub["batch_id"]]), 2)
    assert _states(core, ids) == [JobState.CANCELLED] * 4
    await wait_until(lambda: all(h.closed for h in asking.made))  # no demand left behind
    assert all(not h.started for h in asking.made) and core.hosts.placement.given_up == 0
    await core.aclose()
