"""Clone hosts of the scheduler: which job runs on which host, warm idle hosts, drain loops.

The core reaches hosts only through :class:`~clonefleet.host.HostCalls`, so tests use in-process
hosts and the Ray shell actor-backed ones. A host is bound to the jobs it runs; its drain loop
pulls their events until they have all ended, and then the host idles (kept warm for the next
batch) or closes.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from clonefleet.control import JobControl
from clonefleet.errors import ClusterError
from clonefleet.host import AskingHostFactory, HostCalls, HostFactory, PlacedHost, WatchedHost
from clonefleet.planning import Placement

__all__ = ["HostPool", "Move", "choose_clones_per_actor", "node_of"]


async def node_of(host: HostCalls) -> str | None:
    """The node a host runs on; ``None`` for hosts without one (in-process hosts).

    Raises:
        ClusterError: the host is gone.
    """
    return await host.node_id() if isinstance(host, PlacedHost) else None


FOLD_CHUNK = 2000
"""Events a drain loop applies before it yields to the scheduler's other calls."""

DRAIN_CALLS_PER_S = 2000
"""Drain calls per second of all busy hosts together, at most: each host drains at most every
20 ms by itself, so past about 40 hosts their drains are spaced out, each carrying more events
(1,000 hosts: one drain each per 0.5 s; docs/scaling.md)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """Jobs bound to a host together by :meth:`HostPool.spread` (moved off a dead host by
    :meth:`HostPool.move`)."""

    host: HostCalls
    """Where they went."""
    job_ids: list[str]
    new: bool
    """Whether ``host`` is a host that ran nothing yet (warm idle or just made), not a busy one."""


def choose_clones_per_actor(count: int, cpus: int, nodes: int = 1, cap: int | None = None) -> int:
    """Clones per host: enough hosts to use every CPU (and every node), few enough that a
    batch of thousands does not pay a Python process per clone; at most ``cap`` (hosts that
    ask the cluster for resources: ``cluster.max_clones_per_host``), so a big batch wants more
    hosts than the cluster holds and an autoscaler adds nodes."""
    hosts = max(min(count, max(cpus, nodes, 1)), 1)
    per = max(math.ceil(count / hosts), 1)
    return per if cap is None else max(min(per, cap), 1)


class HostPool:
    """The clone hosts of one scheduler and the jobs bound to each.

    Args:
        factory: makes a host for ``(host_id, control)``.
        control: the job control handed to new hosts.
        apply: called with ``(job_id, event)`` for every event a host yields.
        lost: called with ``(host, job_ids, detail)`` when a host's drain loop finds it dead;
            ``job_ids`` are the jobs it had started (the caller also moves the jobs bound to it
            that never started there, :meth:`move`).
        spawn: runs a coroutine as a background task of the scheduler.
        placement: what new busy hosts ask the cluster for (default: nothing).
        asking: makes a host that asks for resources; without it no host asks.
    """

    def __init__(
        self,
        factory: HostFactory,
        control: JobControl,
        *,
        apply: Callable[[str, dict[str, Any]], None],
        lost: Callable[[HostCalls, list[str], str], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        placement: Placement | None = None,
        asking: AskingHostFactory | None = None,
    ) -> None:
        self._factory, self._control = factory, control
        self.placement = placement or Placement()
        self._asking = asking
        self._asks: dict[str, dict[str, float]] = {}
        """What each host that asked the cluster for resources asked for, by id."""
        self._placed: set[str] = set()
        """Hosts that asked for resources and have started (Ray placed them)."""
        self._apply, self._lost, self._spawn = apply, lost, spawn
        self._seq = 0
        self.idle: list[HostCalls] = []
        self.warm_hosts = 0
        """Idle hosts kept for the next batches (``warm`` sets it)."""
        self._job_host: dict[str, HostCalls] = {}
        self._host_jobs: dict[str, set[str]] = {}
        self._open: dict[str, int] = {}
        """Unfinished jobs per host: its drain loop runs while this is above zero."""
        self._draining: dict[str, HostCalls] = {}
        """Hosts whose drain loops run, by id."""
        self._dead: set[str] = set()
        self._started: dict[str, set[str]] = {}
        """Jobs whose start call a host answered: only these die with it."""
        self._watched: set[str] = set()
        self.replaced = 0
        """Idle warm hosts found dead and replaced (for status and tests)."""

    def new_host(self, *, busy: bool = False) -> HostCalls:
        """A new host; a ``busy`` one (taking jobs now, not kept warm) asks the cluster for
        what :attr:`placement` says, an idle warm one never does (a warm host holding a CPU
        would keep its node from ever going idle)."""
        self._seq += 1
        host_id = f"h{self._seq}"
        resources = self.placement.ask() if busy and self._asking is not None else {}
        if self._asking is None or not resources:
            return self._factory(host_id, self._control)
        self._asks[host_id] = resources
        return self._asking(host_id, self._control, resources)

    def acquire(self) -> HostCalls:
        """A warm idle host when there is one (no process start, imports done), else a new one.

        A warm host found dead (see :meth:`_watch`) has already left :attr:`idle`.
        """
        return self.idle.pop() if self.idle else self.new_host(busy=True)

    def asks(self, host: HostCalls) -> dict[str, float]:
        """What the host asked the cluster for (empty: nothing)."""
        return self._asks.get(host.host_id, {})

    def is_placed(self, host: HostCalls) -> bool:
        """Whether the host needs no wait for a node: it asked for nothing, or it started."""
        return host.host_id not in self._asks or host.host_id in self._placed

    def drop_if_unused(self, host: HostCalls) -> None:
        """Close a host still waiting for a node once none of its jobs is unfinished (they were
        all stopped), so its demand on the cluster ends."""
        if not self.is_placed(host) and self._open.get(host.host_id, 0) <= 0:
            self._dead.add(host.host_id)
            self._spawn(host.close())

    def placed(self, host: HostCalls) -> None:
        """The host that asked for resources has started on a node."""
        if host.host_id in self._asks:
            self._placed.add(host.host_id)

    def started(self, host: HostCalls, job_ids: Sequence[str]) -> None:
        """The host accepted these jobs: from now on they run (and die) with it."""
        self._started.setdefault(host.host_id, set()).update(job_ids)

    def has_started(self, host: HostCalls, job_id: str) -> bool:
        """Whether the host accepted the job (its clone runs there)."""
        return job_id in self._started.get(host.host_id, ())

    def _add_idle(self, host: HostCalls) -> None:
        self.idle.append(host)
        if isinstance(host, WatchedHost) and host.host_id not in self._watched:
            self._watched.add(host.host_id)  # one watch per host for its whole life
            self._spawn(self._watch(host))

    async def _watch(self, host: HostCalls) -> None:
        """Replace a warm host that dies while idle, so no batch is placed on a dead host."""
        assert isinstance(host, WatchedHost)
        try:
            await host.watch()
        except ClusterError:
            pass
        finally:
            self._watched.discard(host.host_id)
        if host in self.idle:
            self.idle.remove(host)
            self._dead.add(host.host_id)
            self.replaced += 1
            if len(self.idle) < self.warm_hosts:
                self._add_idle(self.new_host())

    def host_of(self, job_id: str) -> HostCalls | None:
        """The host a job is bound to, if any."""
        return self._job_host.get(job_id)

    def bind(self, host: HostCalls, job_ids: Sequence[str]) -> None:
        """Bind unfinished jobs to a host and drain it until they have ended."""
        self._host_jobs.setdefault(host.host_id, set()).update(job_ids)
        self._open[host.host_id] = self._open.get(host.host_id, 0) + len(job_ids)
        for job_id in job_ids:
            self._job_host[job_id] = host
        if host.host_id not in self._draining:
            self._draining[host.host_id] = host
            self._spawn(self._drain_loop(host))

    def spread(
        self,
        hosts: Sequence[HostCalls],
        job_ids: Sequence[str],
        *,
        per_new: int,
        fill_to: int | None = None,
        at_least: int = 1,
    ) -> list[Move]:
        """Bind jobs to ``hosts`` (a growing batch's hosts; those not live are passed over) and
        to new ones: first enough new hosts (idle warm ones first) that ``at_least`` hosts (no
        more than the jobs) take part; then each job to the host with the fewest unfinished
        jobs while it holds fewer than ``fill_to`` (``None``: no limit); the rest to new hosts,
        ``per_new`` jobs each. Returns where each went (``new``: a host not in ``hosts``)."""
        targets = [h for h in hosts if self.is_live(h)]
        fresh = max(0, min(at_least, len(targets) + len(job_ids)) - len(targets))
        new_ids: set[str] = set()
        for _ in range(fresh):
            host = self.acquire()
            new_ids.add(host.host_id)
            targets.append(host)
        limit = math.inf if fill_to is None else fill_to
        load = [(self._open.get(h.host_id, 0), n) for n, h in enumerate(targets)]
        load = [(count, n) for count, n in load if count < limit]
        heapq.heapify(load)
        picked: dict[int, list[str]] = {}
        taken = 0
        while taken < len(job_ids) and load:
            count, n = heapq.heappop(load)
            picked.setdefault(n, []).append(job_ids[taken])
            taken += 1
            if count + 1 < limit:
                heapq.heappush(load, (count + 1, n))
        moves = [
            Move(host=targets[n], job_ids=ids, new=targets[n].host_id in new_ids)
            for n, ids in sorted(picked.items())
        ]
        left, step = job_ids[taken:], max(per_new, 1)
        moves.extend(
            Move(host=self.acquire(), job_ids=list(left[i : i + step]), new=True)
            for i in range(0, len(left), step)
        )
        for m in moves:
            self.bind(m.host, m.job_ids)
        return moves

    def bound_to(self, host: HostCalls) -> list[str]:
        """The jobs bound to a host (ended ones included)."""
        return list(self._host_jobs.get(host.host_id, ()))

    def is_live(self, host: HostCalls) -> bool:
        """Whether the host is busy (its drain loop runs) and not known to be dead."""
        return host.host_id in self._draining and host.host_id not in self._dead

    def live(self) -> list[HostCalls]:
        """Busy hosts not known to be dead (their drain loops run), in the order they began."""
        return [h for h in self._draining.values() if h.host_id not in self._dead]

    def move(
        self, dead: HostCalls, job_ids: Sequence[str], per_new: int, fill_to: int | None = None
    ) -> list[Move]:
        """Move unfinished jobs off a host that is gone, all in one step: to the live busy hosts
        (each job to the one with the fewest unfinished jobs, while it holds fewer than
        ``fill_to``; ``None``: no limit), then to idle warm hosts and new ones, ``per_new`` jobs
        each. Returns where each went."""
        self._dead.add(dead.host_id)
        self._host_jobs[dead.host_id].difference_update(job_ids)
        self._open[dead.host_id] -= len(job_ids)
        return self.spread(self.live(), job_ids, per_new=per_new, fill_to=fill_to, at_least=0)

    def pack(self, unplaced: HostCalls, job_ids: Sequence[str], per_new: int) -> list[Move]:
        """Move unfinished jobs off a host Ray did not place in time (the caller gives it up)
        onto the busy hosts that run, however many each then holds (each job to the one with
        the fewest unfinished jobs); only with none running, to new hosts, ``per_new`` each
        (they ask for nothing while :attr:`placement` is short). Returns where each went."""
        self._dead.add(unplaced.host_id)
        self._host_jobs[unplaced.host_id].difference_update(job_ids)
        self._open[unplaced.host_id] -= len(job_ids)
        running = [h for h in self.live() if self.is_placed(h)]
        return self.spread(running, job_ids, per_new=per_new, fill_to=None, at_least=0)

    def mark_dead(self, host: HostCalls) -> None:
        """Never keep this host warm again."""
        self._dead.add(host.host_id)

    def is_dead(self, host: HostCalls) -> bool:
        """Whether the host is known to be gone (never to be used again)."""
        return host.host_id in self._dead

    def ended(self, job_id: str) -> None:
        """A job bound to a host has reached its terminal state."""
        host = self._job_host.get(job_id)
        if host is not None and job_id in self._host_jobs.get(host.host_id, ()):
            self._open[host.host_id] -= 1

    def forget(self, job_ids: Sequence[str]) -> None:
        """Drop ended jobs that left the table (evicted) from the job-to-host map."""
        for job_id in job_ids:
            self._job_host.pop(job_id, None)

    def warm(self, count: int) -> None:
        """Start ``count`` idle hosts now, so the next batches skip process start-up."""
        self.warm_hosts = count
        while len(self.idle) < count:
            self._add_idle(self.new_host())

    async def warm_ready(self) -> int:
        """Wait until every idle host has started; returns how many did."""
        ready = 0
        for host in list(self.idle):
            try:
                await node_of(host)
            except ClusterError:
                continue
            ready += 1
        return ready

    async def _drain_loop(self, host: HostCalls) -> None:
        """Pull the host's events until its jobs have all ended; then it idles or goes."""
        jobs = self._host_jobs[host.host_id]
        healthy = True
        try:
            while self._open.get(host.host_id, 0) > 0:
                began = time.monotonic()
                try:
                    batch = await host.drain(1.0)
                except ClusterError as exc:
                    healthy = False
                    self._dead.add(host.host_id)
                    started = self._started.get(host.host_id, set())
                    lost = [j for j in jobs if j in started]
                    self._lost(host, lost, f"clone host {host.host_id} died: {exc}")
                    return
                await self._fold(batch)
                if batch:
                    await self._pace(began)
        finally:
            self._draining.pop(host.host_id, None)
            if healthy:
                jobs.clear()
                self._open[host.host_id] = 0
            self._started.pop(host.host_id, None)
            # A host that asked for resources goes once its jobs end, so its node can go idle
            # and an autoscaler can remove it.
            asked = self._asks.pop(host.host_id, None) is not None
            self._placed.discard(host.host_id)
            keep = healthy and not asked and host.host_id not in self._dead
            if keep and len(self.idle) < self.warm_hosts:
                self._add_idle(host)
            else:
                self._spawn(host.close())

    async def _pace(self, began: float) -> None:
        """Space this host's drains so that all busy hosts together make about
        :data:`DRAIN_CALLS_PER_S` calls (no wait with fewer than 40 or so hosts)."""
        gap = len(self._draining) / DRAIN_CALLS_PER_S
        left = gap - (time.monotonic() - began)
        if gap >= 0.02 and left > 0:
            await asyncio.sleep(left)

    async def _fold(self, batch: list[dict[str, Any]]) -> None:
        """Apply a drained batch, letting the scheduler's other calls run every
        :data:`FOLD_CHUNK` events (a drain of 200,000 events would hold its loop for seconds)."""
        for at in range(0, len(batch), FOLD_CHUNK):
            if at:
                await asyncio.sleep(0)
            for item in batch[at : at + FOLD_CHUNK]:
                self._apply(item["job_id"], item["event"])

    async def aclose(self) -> None:
        """Close the idle hosts (busy ones close when their drain loops end)."""
        idle, self.idle = self.idle, []
        for host in idle:
            await host.close()
