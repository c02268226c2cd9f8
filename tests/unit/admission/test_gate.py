"""HostGates: the queue of a host's requests in front of the limiter, its sync task, open scopes,
cancellations, and the host's own limiter when the fleet's cannot be reached."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from clonefleet.admission import (
    AdmissionCore,
    Announced,
    Demand,
    Grant,
    HostGates,
    HostScope,
    Limits,
    Ticket,
)
from clonefleet.errors import ClusterError
from clonefleet.testing import FakeClock

pytestmark = pytest.mark.timeout(30)


class Limiter:
    """A fleet's limiter as a host reaches it: a real core on the fake clock, calls counted."""

    def __init__(self, clock: FakeClock) -> None:
        self.core = AdmissionCore()
        self.clock = clock
        self.calls = 0
        self.down = False

    async def __call__(self, who: str, demands: list[Demand]) -> list[Grant]:
        self.calls += 1
        await asyncio.sleep(0)  # a remote call yields
        if self.down:
            raise ClusterError("the limiter is gone")
        return self.core.sync(who, demands, self.clock())


async def until(check: Callable[[], bool], within_s: float = 3.0) -> None:
    """Poll ``check`` every few milliseconds until it holds (fails after ``within_s``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not check():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


def slots(gates: HostGates, n: int) -> HostScope:
    """A provider-wide scope of ``n`` slots (nothing learned)."""
    return gates.scope("p@x", "p", None, Limits(max_in_flight=n), False, 16)


async def admit_all(gates: HostGates, scopes: Sequence[HostScope], count: int) -> list[Ticket]:
    return [await gates.admit(scopes, 1) for _ in range(count)]


async def test_waiting_requests_are_admitted_first_come_first_served() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    gates = HostGates("h", limiter, clock=clock)
    scope = slots(gates, 1)
    order: list[int] = []
    tickets: dict[int, Ticket] = {}

    async def one(i: int) -> None:
        tickets[i] = await gates.admit((scope,), 1)
        order.append(i)

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(0)  # each joins the queue in turn
    for k in range(4):
        await until(lambda k=k: len(order) == k + 1)  # type: ignore[misc]
        assert order == list(range(k + 1))
        assert scope.in_flight == 1 and len(scope.queue) == 3 - k
        gates.answered(tickets[k], 20, None)
    await asyncio.gather(*tasks)
    await gates.aclose()


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_gets_the_slot() -> None:
    clock = FakeClock()
    gates = HostGates("h", Limiter(clock), clock=clock)
    scope = slots(gates, 1)
    (first,) = await admit_all(gates, (scope,), 1)
    stops = asyncio.create_task(gates.admit((scope,), 1))
    stays = asyncio.create_task(gates.admit((scope,), 1))
    await until(lambda: len(scope.queue) == 2)
    stops.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stops
    assert len(scope.queue) == 1 and scope.in_flight == 1
    gates.abandoned(first)
    ticket = await asyncio.wait_for(stays, 3.0)
    assert ticket.held == (True,) and scope.in_flight == 1
    await gates.aclose()


async def test_a_waiter_cancelled_just_after_its_admission_gives_its_slot_back() -> None:
    clock = FakeClock()
    gates = HostGates("h", None, clock=clock)  # the host's own limiter: a sync does not yield
    scope = slots(gates, 1)
    (first,) = await admit_all(gates, (scope,), 1)
    late = asyncio.create_task(gates.admit((scope,), 1))
    await until(lambda: len(scope.queue) == 1)
    gates.abandoned(first)
    await gates.sync_now()  # admits `late` ...
    assert not scope.queue
    late.cancel()  # ... whose clone stops before it runs again
    with pytest.raises(asyncio.CancelledError):
        await late
    assert scope.release == 1 and scope.in_flight == 0  # the slot is given back
    (again,) = await asyncio.wait_for(admit_all(gates, (scope,), 1), 3.0)
    assert again.held == (True,)
    assert gates.snapshot()[0]["max_in_flight"] == 1
    await gates.aclose()


async def test_an_open_scope_admits_at_once_without_a_sync_and_reports_what_it_sent() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    gates = HostGates("h", limiter, clock=clock)
    scope = gates.scope("p@x", "p", None, Limits(), False, 16)
    (first,) = await admit_all(gates, (scope,), 1)  # the first asks: is anything limiting?
    assert scope.open and limiter.calls == 1
    tickets = await admit_all(gates, (scope,), 5)
    assert limiter.calls == 1 and all(t.held == (False,) for t in tickets)
    assert scope.in_flight == 6
    for ticket in (first, *tickets):
        gates.answered(ticket, 30, None)
    await gates.sync_now()
    (seen,) = limiter.core.snapshot(clock())
    assert seen["rpm_now"] >= 5 and seen["tpm_now"] == 180 and seen["source"] == "none"
    await gates.aclose()


async def test_a_refusal_closes_an_open_scope_until_the_limiter_answers() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    gates = HostGates("h", limiter, clock=clock)
    scope = gates.scope("p@x", "p", None, Limits(), False, 16)
    (ticket,) = await admit_all(gates, (scope,), 1)
    gates.refused(ticket, 0.0, None)
    assert not scope.open and scope.in_flight == 0
    calls = limiter.calls
    await until(lambda: limiter.calls > calls)  # the limiter hears of it at once
    await asyncio.wait_for(admit_all(gates, (scope,), 1), 3.0)
    assert limiter.core.snapshot(clock())[0]["rate_limited"] == 1
    await gates.aclose()


async def test_an_unreachable_limiter_leaves_the_host_s_own_to_answer() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    limiter.down = True
    gates = HostGates("h", limiter, clock=clock)
    scope = slots(gates, 2)
    tickets = await asyncio.wait_for(admit_all(gates, (scope,), 2), 3.0)
    assert gates.degraded and limiter.calls >= 1
    assert all(t.held == (True,) for t in tickets)
    (own,) = gates.snapshot()
    assert own["max_in_flight"] == 2 and own["source"] == "config"
    blocked = asyncio.create_task(gates.admit((scope,), 1))  # the own limiter's 2 slots hold
    await asyncio.sleep(0.03)
    assert not blocked.done()
    limiter.down = False
    clock.advance(1.0)  # a failed sync is followed by a second of the host's own answers
    for ticket in tickets:
        gates.answered(ticket, 5, None)
    await asyncio.wait_for(blocked, 3.0)
    assert not gates.degraded  # the fleet's limiter answers again
    await gates.aclose()


async def test_two_hosts_on_one_limiter_share_its_slots() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    hosts = [HostGates(name, limiter, clock=clock) for name in ("h1", "h2")]
    scopes = [slots(gates, 3) for gates in hosts]
    flying = [0, 0]
    most = 0

    async def request(k: int) -> None:
        nonlocal most
        ticket = await hosts[k].admit((scopes[k],), 1)
        flying[k] += 1
        most = max(most, sum(flying))
        await asyncio.sleep(0.01)
        flying[k] -= 1
        hosts[k].answered(ticket, 5, None)

    await asyncio.wait_for(asyncio.gather(*(request(i % 2) for i in range(16))), 20.0)
    assert most == 3  # used, and never more than the fleet's limit
    for gates in hosts:
        await gates.aclose()


async def test_a_request_passes_every_scope_of_its_candidate() -> None:
    clock = FakeClock()
    gates = HostGates("h", Limiter(clock), clock=clock)
    provider = slots(gates, 1)
    model = gates.scope("p@x/m", "p", "m", Limits(max_in_flight=5), False, 16)
    (ticket,) = await admit_all(gates, (provider, model), 1)
    assert ticket.held == (True, True) and ticket.scopes == (provider, model)
    waits = asyncio.create_task(gates.admit((provider, model), 1))
    await asyncio.sleep(0.03)
    assert not waits.done() and model.in_flight == 1  # the provider's one slot is held
    gates.answered(ticket, 5, None)
    await asyncio.wait_for(waits, 3.0)
    await gates.aclose()


async def test_a_limit_heard_in_an_answer_reaches_the_limiter_at_once_least_left_first() -> None:
    clock = FakeClock()  # frozen: the limiter's buckets refill only when it is moved
    limiter = Limiter(clock)
    gates = HostGates("h", limiter, clock=clock)
    model = gates.scope("p@x/m", "p", "m", Limits(), True, 4)
    (probe,) = await admit_all(gates, (model,), 1)  # one request asks first
    gates.answered(probe, 10, None)  # no headers: the window opens to the probe of 4
    (asks,) = await admit_all(gates, (model,), 1)
    gates.answered(asks, 10, None)  # no limit headers: the probe's window opens
    first, second, third = await asyncio.wait_for(admit_all(gates, (model,), 3), 3.0)
    assert limiter.core.snapshot(clock())[0]["source"] == "probing"
    calls = limiter.calls
    # Two answers before the next sync: the one that saw less left is what the limiter hears.
    gates.answered(first, 10, Announced(rpm=6000, requests_left=2))
    gates.answered(second, 10, Announced(rpm=6000, requests_left=9))
    await until(lambda: limiter.calls > calls)
    (seen,) = limiter.core.snapshot(clock())
    assert seen["source"] == "headers" and seen["rpm_limit"] == 5700.0
    waiting = [asyncio.create_task(gates.admit((model,), 1)) for _ in range(5)]
    await until(lambda: sum(t.done() for t in waiting) == 1)  # 2 left, 1 still in flight
    await asyncio.sleep(0.03)
    assert sum(t.done() for t in waiting) == 1
    clock.advance(1.0)  # the bucket refills: the rest go
    await asyncio.wait_for(asyncio.gather(*waiting), 3.0)
    gates.abandoned(third)
    await gates.aclose()


@pytest.mark.parametrize("remote", [False, True])
async def test_aclose_ends_the_sync_task_even_just_after_an_answer_kicked_it(remote: bool) -> None:
    clock = FakeClock()
    gates = HostGates("h", Limiter(clock) if remote else None, clock=clock)
    scope = slots(gates, 3)
    first, _ = await admit_all(gates, (scope,), 2)
    gates.answered(first, 5, None)  # wakes the sync task ...
    closing = asyncio.create_task(gates.aclose())  # ... as the host closes
    await until(closing.done, within_s=2.0)


async def test_a_scope_added_while_the_limiter_answers_stops_nothing() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    answering = asyncio.Event()
    answering.set()

    async def slow(who: str, demands: list[Demand]) -> list[Grant]:
        await answering.wait()
        return await limiter(who, demands)

    gates = HostGates("h", slow, clock=clock)
    scope = slots(gates, 1)
    (first,) = await admit_all(gates, (scope,), 1)
    answering.clear()  # the next sync's answer is on its way ...
    waits = asyncio.create_task(gates.admit((scope,), 1))
    await asyncio.sleep(0.01)
    gates.scope("p@x/new", "p", "new", Limits(max_in_flight=2), False, 16)  # ... a clone starts
    answering.set()
    await asyncio.sleep(0.01)
    gates.answered(first, 5, None)  # its slot comes free: the waiting request must get it
    await asyncio.wait_for(waits, 3.0)
    await gates.aclose()


async def test_a_request_cancelled_at_its_second_scope_gives_the_first_one_s_slot_back() -> None:
    clock = FakeClock()
    gates = HostGates("h", Limiter(clock), clock=clock)
    provider = slots(gates, 1)
    model = gates.scope("p@x/m", "p", "m", Limits(max_in_flight=1), False, 16)
    (holder,) = await admit_all(gates, (model,), 1)  # the model's one slot is taken
    stuck = asyncio.create_task(gates.admit((provider, model), 1))
    await until(lambda: provider.in_flight == 1 and len(model.queue) == 1)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert provider.in_flight == 0 and not model.queue
    (alone,) = await asyncio.wait_for(admit_all(gates, (provider,), 1), 3.0)  # its slot is back
    gates.abandoned(alone)
    gates.abandoned(holder)
    await gates.aclose()


async def test_releases_the_fleet_s_limiter_missed_reach_it_once_it_answers_again() -> None:
    clock = FakeClock()
    limiter = Limiter(clock)
    gates = HostGates("h", limiter, clock=clock)
    scope = slots(gates, 2)
    tickets = await admit_all(gates, (scope,), 2)
    limiter.down = True
    for ticket in tickets:
        gates.answered(ticket, 5, None)
    await until(lambda: gates.degraded)  # that sync, with both releases, failed
    limiter.down = False
    clock.advance(1.0)
    try:
        again = await asyncio.wait_for(admit_all(gates, (scope,), 1), 0.5)
        assert again[0].held == (True,)
    finally:
        await gates.aclose()
