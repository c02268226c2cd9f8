"""The clone host ships its clones' checkpoints: the latest per job, at most once per interval
(each one with interval 0), never dropped by a full buffer, never after a job's final event; and
``start`` with checkpoints resumes those jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from clonefleet.clone import Candidate, FailoverModel, state_of
from clonefleet.config import Config, DurabilityConfig
from clonefleet.host import HostCore
from clonefleet.testing import FakeClock, FunctionModel, call, make_spec, reply

pytestmark = pytest.mark.timeout(20)

CHECKPOINT, FINAL = "_checkpoint", "_final"


class _Pool:
    """Gives every clone a failover model over the test's own model for its job."""

    web = None  # no web tools configured

    def __init__(self, models: dict[str, Any]) -> None:
        self.models = models

    def failover_for(self, spec, on_failover=None, on_rate_limited=None) -> FailoverModel:
        model = self.models[spec.job_id]
        return FailoverModel([Candidate(key="fake", wire_name="fake", model=model)])


class FakeHost(HostCore):
    """A host whose clones talk to the given models instead of the config's providers."""

    def __init__(self, models: dict[str, Any], **kw: Any) -> None:
        super().__init__(**kw)
        self._fake_pool = _Pool(models)

    def pool_for(self, config, sim_script):
        return self._fake_pool


class Gated:
    """A model that answers one turn per ``release``: progress updates, then ``exit_tool`` at
    turn ``last`` (a resumed clone's first call is turn ``done + 1``)."""

    def __init__(self, last: int, done: int = 0) -> None:
        self.gate = asyncio.Semaphore(0)
        self.last = last
        self.released, self.done = 0, done
        self.model = FunctionModel(self._answer)

    async def _answer(self, req):
        turn = self.done + len(self.model.calls)
        await self.gate.acquire()
        if turn == self.last:
            return reply("", call("exit_tool", f"c{turn}", success=True, summary="ok"))
        return reply("", call("progress_update", f"c{turn}", summary=f"step {turn}"))

    def release(self, n: int = 1) -> None:
        self.released += n
        for _ in range(n):
            self.gate.release()

    async def turns(self, n: int) -> None:
        """Let ``n`` more turns run and wait until the clone asks for the next one (so the
        last of them is checkpointed)."""
        self.release(n)
        await until(lambda: len(self.model.calls) > self.released)


async def until(done: Callable[[], bool]) -> None:
    for _ in range(2000):
        if done():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def config(interval_s: float) -> Config:
    return Config(durability=DurabilityConfig(checkpoint_interval_s=interval_s))


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e["event"] for e in events if e["event"]["type"] == kind]


async def drain_to_final(host: HostCore, *job_ids: str) -> list[dict]:
    """Drain until the final event of each job (default ``sa_1``) came."""
    events: list[dict] = []
    waiting = set(job_ids or ["sa_1"])
    while waiting:
        events += await host.drain(wait_s=0.05)
        waiting -= {e["job_id"] for e in events if e["event"]["type"] == FINAL}
    return events


async def test_only_the_latest_checkpoint_per_interval_and_none_after_the_final():
    clock, gated = FakeClock(), Gated(last=7)
    host = FakeHost({"sa_1": gated.model}, clock=clock)
    try:
        host.start([make_spec(job_id="sa_1")], config(1.0))
        await gated.turns(3)
        events = await host.drain(wait_s=0.01)
        # Pending for less than the interval: a run that ends soon never ships one.
        assert of_type(events, "usage") and not of_type(events, CHECKPOINT)
        clock.advance(1.0)
        events = await host.drain(wait_s=0.01)
        assert [state_of(e["event"]["state"])["turns"] for e in events] == [
            3
        ]  # the latest, once due

        await gated.turns(2)
        events = await host.drain(wait_s=0.01)
        assert of_type(events, "usage") and not of_type(events, CHECKPOINT)  # within the interval
        clock.advance(1.0)
        events = await host.drain(wait_s=0.01)
        assert [state_of(e["event"]["state"])["turns"] for e in events] == [
            5
        ]  # shipped without new events

        await gated.turns(1)  # turn 6 is checkpointed, then turn 7 ends the run
        gated.release()
        events = await drain_to_final(host)
        assert not of_type(events, CHECKPOINT)
        clock.advance(5.0)  # turn 6's checkpoint would be due now: the final dropped it
        assert await host.drain(wait_s=0.01) == []
    finally:
        await host.aclose()


async def test_each_job_ships_on_its_own_interval_when_batches_differ():
    # The host skips its scan until the earliest pending checkpoint is due: a job with a short
    # interval arriving after one with a long interval must still ship on time.
    clock, slow, quick = FakeClock(), Gated(last=9), Gated(last=9)
    host = FakeHost({"sa_1": slow.model, "sa_2": quick.model}, clock=clock)
    try:
        host.start([make_spec(job_id="sa_1")], config(10.0))
        await slow.turns(1)
        assert not of_type(await host.drain(wait_s=0.01), CHECKPOINT)
        clock.advance(1.0)
        host.start([make_spec(job_id="sa_2")], config(1.0))
        await quick.turns(1)
        assert not of_type(await host.drain(wait_s=0.01), CHECKPOINT)
        clock.advance(1.0)  # sa_2 is due (1 s pending); sa_1 has 8 s to go
        shipped = [e for e in await host.drain(wait_s=0.01) if e["event"]["type"] == CHECKPOINT]
        assert [e["job_id"] for e in shipped] == ["sa_2"]
        clock.advance(7.5)
        assert not of_type(await host.drain(wait_s=0.01), CHECKPOINT)
        clock.advance(0.5)  # now sa_1's 10 s have passed
        shipped = [e for e in await host.drain(wait_s=0.01) if e["event"]["type"] == CHECKPOINT]
        assert [e["job_id"] for e in shipped] == ["sa_1"]
    finally:
        await host.aclose()


async def test_interval_zero_ships_every_checkpoint_in_order():
    gated = Gated(last=4)
    host = FakeHost({"sa_1": gated.model}, clock=FakeClock())
    try:
        host.start([make_spec(job_id="sa_1")], config(0.0))
        gated.release(4)
        events = [e["event"] for e in await drain_to_final(host)]
    finally:
        await host.aclose()
    kinds = [
        (e["type"], e.get("turn") or (state_of(e.get("state")) or {}).get("turns")) for e in events
    ]
    marks = [k for k in kinds if k[0] in ("usage", CHECKPOINT, FINAL)]
    assert marks == [
        *[(kind, turn) for turn in (1, 2, 3) for kind in ("usage", CHECKPOINT)],
        ("usage", 4),
        (FINAL, None),
    ]


async def test_a_full_buffer_keeps_the_checkpoint_for_the_next_drain():
    gated = Gated(last=2)
    host = FakeHost({"sa_1": gated.model}, clock=FakeClock(), max_buffer=4)
    try:
        host.start([make_spec(job_id="sa_1")], config(0.0))
        await gated.turns(1)  # started, usage, tool_call_start, progress: the buffer is full
        first = await host.drain(wait_s=0.01)
        assert len(first) == 4 and not of_type(first, CHECKPOINT)
        second = await host.drain(wait_s=0.01)
        assert [state_of(c["state"])["turns"] for c in of_type(second, CHECKPOINT)] == [1]
        gated.release()
        await drain_to_final(host)
    finally:
        await host.aclose()


async def test_start_with_checkpoints_resumes_those_jobs_and_starts_the_others_afresh():
    gated = Gated(last=3)
    first = FakeHost({"sa_1": gated.model}, clock=FakeClock())
    try:
        first.start([make_spec(job_id="sa_1")], config(0.0))
        await gated.turns(2)
        shipped = of_type(await first.drain(wait_s=0.01), CHECKPOINT)
    finally:
        await first.aclose()
    state = shipped[-1]["state"]
    assert isinstance(state, bytes)  # packed once by the host; kept and journaled as it is
    journaled = msgpack.unpackb(msgpack.packb(state, use_bin_type=True), strict_map_key=True)

    again, fresh = Gated(last=3, done=2), Gated(last=1)
    second = FakeHost({"sa_1": again.model, "sa_2": fresh.model}, clock=FakeClock())
    try:
        specs = [make_spec(job_id="sa_1"), make_spec(job_id="sa_2", clone_index=1)]
        second.start(specs, config(1.0), None, {"sa_1": journaled, "sa_9": {"v": 1}})
        again.release()
        fresh.release()
        events = await drain_to_final(second, "sa_1", "sa_2")
    finally:
        await second.aclose()
    by_job = {j: [e["event"] for e in events if e["job_id"] == j] for j in ("sa_1", "sa_2")}
    assert by_job["sa_1"][0]["resumed"] is True and by_job["sa_1"][0]["turn"] == 2
    assert "resumed" not in by_job["sa_2"][0]
    assert len(again.model.calls) == 1  # only turn 3 was left, and it saw what turn 3 saw
    assert again.model.calls[0].messages == gated.model.calls[2].messages
    records = {j: evs[-1]["result"] for j, evs in by_job.items()}
    assert records["sa_1"]["turns"] == 3 and records["sa_1"]["usage"]["total_tokens"] == 60
    assert records["sa_2"]["turns"] == 1 and records["sa_2"]["status"] == "completed"


async def test_a_malformed_checkpoint_starts_the_job_afresh_with_a_warning():
    gated = Gated(last=1)
    host = FakeHost({"sa_1": gated.model}, clock=FakeClock())
    try:
        host.start([make_spec(job_id="sa_1")], config(1.0), None, {"sa_1": {"v": 1, "x": b"?"}})
        gated.release()
        record = of_type(await drain_to_final(host), FINAL)[0]["result"]
    finally:
        await host.aclose()
    assert record["status"] == "completed" and record["turns"] == 1
    assert any(w.startswith("checkpoint ignored") for w in record["warnings"])


async def test_drains_are_spaced_and_the_clones_own_result_event_stays_on_the_host():
    model = Gated(last=1)
    host = FakeHost({"sa_1": model.model}, drain_every_s=0.1)
    host.start([make_spec(job_id="sa_1")], config(0.0))
    first = await host.drain(wait_s=1.0)  # `started` at least
    assert first
    model.release()
    loop = asyncio.get_running_loop()
    began = loop.time()
    events = first + await drain_to_final(host)
    assert loop.time() - began >= 0.09  # the second drain waited out the rest of 0.1 s
    kinds = [e["event"]["type"] for e in events]
    assert kinds[-1] == FINAL and "result" not in kinds
    await host.aclose()
