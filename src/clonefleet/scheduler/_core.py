"""The scheduler core: the pool of slots and job control over the job table.

:class:`SchedulerCore` is plain async Python and implements :class:`~clonefleet.control.JobControl`.
It owns the :class:`~clonefleet.scheduler._table.JobTable`, reaches clone hosts only through
:class:`~clonefleet.host.HostCalls` (in-process hosts in tests, actor-backed ones under Ray) and
decides which job runs where and when. It never renders a template: the client renders a user's
batch, and the parent's clone host a nested spawn. See docs/architecture.md, "Actors and what
each owns".
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Unpack

from clonefleet import control as api
from clonefleet.clone import CloneSpec, state_of
from clonefleet.config import DurabilityConfig
from clonefleet.control import Seconds
from clonefleet.errors import ClusterError, UsageError
from clonefleet.host import AskingHostFactory, HostCalls, HostFactory
from clonefleet.planning import PENDING_NOTICE_S, BatchSubmission, Placement
from clonefleet.scheduler._durable import Durable
from clonefleet.scheduler._events import EventLog, Pulse
from clonefleet.scheduler._hosts import HostPool, Move, choose_clones_per_actor, node_of
from clonefleet.scheduler._mail import Mailroom
from clonefleet.scheduler._nested import spawn_nested
from clonefleet.scheduler._queries import JobQueries
from clonefleet.scheduler._state import JobRecord, known_cost
from clonefleet.scheduler._stops import JobStops
from clonefleet.scheduler._table import JobTable
from clonefleet.scheduler._usage import UsageBook, budget_record
from clonefleet.vocab import EventType, JobState, Outcome, StopReason, stop_error

__all__ = ["BatchSubmission", "SchedulerCore"]


class _NotPlaced(Exception):
    """A host that asked for resources was not placed within ``cluster.host_wait_s``."""


class SchedulerCore:
    """Runs the batches of its job table on clone hosts; a :class:`JobControl`.

    Args:
        host_factory: makes a host for ``(host_id, control)``; ``control`` is this core.
        max_concurrency: fleet-wide cap on running jobs (``None`` = none).
        cpus: CPUs of the cluster, for the automatic clones-per-actor choice.
        nodes: nodes of the cluster.
        placement: what new busy hosts ask the cluster for (``cluster.*``; default nothing).
        asking_factory: makes a host that asks for resources (``(host_id, control,
            resources)``); without it no host asks.
    """

    def __init__(
        self,
        host_factory: HostFactory,
        *,
        max_concurrency: int | None = None,
        cpus: int = 2,
        nodes: int = 1,
        durable: Durable | None = None,
        durability: DurabilityConfig | None = None,
        placement: Placement | None = None,
        asking_factory: AskingHostFactory | None = None,
    ) -> None:
        self.max_concurrency, self.cpus, self.nodes = max_concurrency, cpus, nodes
        self.durable = durable or Durable(None)
        settings = durability or DurabilityConfig()
        self.retention_s = settings.retention_s if settings.retention_s is not None else math.inf
        """How long finished batches restored without their config stay in the table."""
        self.compact_bytes = settings.compact_bytes
        self.journal_damage: list[str] = []
        """Damaged spots the journal had when this scheduler started (each a sentence)."""
        self.table = JobTable()
        """Every job and batch (read it freely; it changes only through its methods)."""
        self.hosts = HostPool(
            host_factory,
            self,
            apply=self.apply_event,
            lost=self._host_died,
            spawn=self._spawn,
            placement=placement,
            asking=asking_factory,
        )
        self._placing: dict[str, asyncio.Task[tuple[bool, str | None]]] = {}
        """The wait for each host that asks for resources to start (:meth:`_placed_node`)."""
        self.usage = UsageBook(self.table.jobs)
        self._part_hosts: dict[str, list[HostCalls]] = {}
        """A growing batch's hosts, which its next parts fill (:meth:`_bind_part`)."""
        self.event_log = EventLog(
            self.table.jobs,
            max_events=settings.max_events,
            spill=self.durable.events,
            unspill=self.durable.read_events,
        )
        self._ended = Pulse()
        """Fired once per batch of job endings (not per event)."""
        self._pump_held = False
        """While set, ending jobs starts no queued ones (see :meth:`paused`)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self.mail = Mailroom(self.table, self.hosts, self.event_log.record, self._spawn)
        self.stops = JobStops(
            self.table,
            self.hosts,
            self.usage,
            end=self._end,
            crash=self.crash_job,
            paused=self.paused,
            spawn=self._spawn,
            record=self.event_log.record,
        )
        self._queries = JobQueries(
            self.table, self.usage, self.event_log, self._ended, self.durable, self.capacity
        )

    @property
    def jobs(self) -> Mapping[str, JobRecord]:
        """Every job's record, by id (the table's, read-only)."""
        return self.table.jobs

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        """The background tasks running now (host starts, drain loops, cancels)."""
        return frozenset(self._tasks)

    # -- ids and submission --------------------------------------------------------------
    def reserve_ids(self, count: int) -> tuple[str, list[str]]:
        """Allocate a batch id and ``count`` unique job ids for rendering."""
        return self.table.reserve_ids(count)

    async def submit(
        self, sub: BatchSubmission, blob: bytes | None = None, *, open: bool = False
    ) -> api.Submitted:
        """Record every job of the batch as ``reserved``, assign hosts and start what the caps allow.

        Ids may come from :meth:`reserve_ids` or be drawn by the client (which renders before it
        reaches the cluster); either way none may be in use already. The ids are returned only
        once the batch's journal record is on disk; ``blob`` is the submission already pickled
        (by the client, so the scheduler need not pickle it again for the journal). An ``open``
        batch takes more parts (:meth:`extend`) and is not done until it is closed
        (:meth:`close_batch`, or the ``last`` part).

        Raises:
            UsageError: an empty batch.
            IdCollision: the batch id or a job id is already in use.
            JournalError: the journal could not be written (nothing starts).
        """
        self.table.check_ids(sub)
        rows = self.table.add_batch(sub, open=open)
        self.usage.add_batch(sub.batch_id, sub.config, sub.budget_tokens, sub.budget_usd)
        for rec in rows:
            self.event_log.record(rec.job_id, {"type": str(EventType.QUEUED), "ts": time.time()})
        try:
            self.durable.batch(sub.batch_id, rows, sub, blob, budget=budget_record(sub), open=open)
            await self.durable.commit()
        except BaseException:
            self.forget_batch(sub.batch_id)  # never accepted
            raise
        if self.usage.stopped_above(sub.specs[0].parent):  # spawned as its budget was passed
            self.stops.mark([s.job_id for s in sub.specs], StopReason.BUDGET)
        self.queue_batch(sub.batch_id)
        self._pump()
        return {"batch_id": sub.batch_id, "job_ids": [s.job_id for s in sub.specs]}

    async def extend(
        self, sub: BatchSubmission, blob: bytes | None = None, *, last: bool = False
    ) -> api.Submitted:
        """Add one more part to an open batch (``sub.batch_id``): its jobs join the batch as
        ``reserved`` and start as the caps allow, under the batch's first part's clones per
        host, cap and budget (``sub``'s own are not used). ``last`` closes the batch with this
        part. The ids are returned once the part's journal record is on disk. A batch whose
        budget was passed takes the part, whose jobs then end ``cancelled``/``budget`` at once.

        Raises:
            UsageError: an empty part; no such batch; the batch was cancelled or is closed.
            IdCollision: a job id is already in use.
            JournalError: the journal could not be written (the part is not added).
        """
        batch = self.table.check_part(sub)
        part = batch.parts
        rows = self.table.extend_batch(sub)
        try:
            self.durable.part(sub.batch_id, part, rows, sub, blob, last=last)
            await self.durable.commit()
        except BaseException:
            self.table.unextend(sub.batch_id, rows)  # never accepted
            raise
        ids = [s.job_id for s in sub.specs]
        for job_id in ids:
            self.event_log.record(job_id, {"type": str(EventType.QUEUED), "ts": time.time()})
        if last:
            batch.open = False
        budget = self.usage.budgets.get(sub.batch_id)
        if (budget is not None and budget.passed) or self.usage.stopped_above(sub.specs[0].parent):
            self.stops.mark(ids, StopReason.BUDGET)
        self.queue_batch(sub.batch_id, ids)
        self._pump()
        self._ended.fire()  # waiters on the batch see its new jobs (and whether it closed)
        return {"batch_id": sub.batch_id, "job_ids": ids}

    async def close_batch(self, batch_id: str) -> bool:
        """Say an open batch takes no more parts: once its jobs have ended it is done.
        Idempotent; returns whether the batch was open.

        Raises:
            UsageError: no such batch.
            JournalError: the journal could not be written (the batch stays open).
        """
        batch = self.table.batch(batch_id)
        if batch is None:
            raise UsageError(f"no batch {batch_id} to close")
        if not batch.open:
            return False
        self.durable.closed(batch_id)
        await self.durable.commit()
        batch.open = False
        self._ended.fire()
        return True

    def queue_batch(self, batch_id: str, job_ids: Sequence[str] | None = None) -> None:
        """Bind the batch's waiting jobs (of ``job_ids``, default: all) to hosts, then queue
        them for the pump.

        A batch's jobs join the pump's queues only here, with their hosts: between adding its
        jobs and this, a submit awaits its journal record, and other batches' pumps run.
        """
        if job_ids is None:
            ids = self.table.waiting_in(batch_id)
        else:
            ids = [j for j in job_ids if self.table.is_waiting(j)]
        if not ids:
            return
        meta = self._meta(batch_id)
        batch = self.table.batch(batch_id)
        if batch is not None and (batch.open or batch.parts > 1):
            self._bind_part(batch_id, ids, meta.clones_per_actor)
        else:
            per = meta.clones_per_actor or self._per_host(len(ids))
            for start in range(0, len(ids), per):
                self._bind(self.hosts.acquire(), ids[start : start + per])
        self.table.enqueue(batch_id, ids)

    def _bind_part(self, batch_id: str, ids: Sequence[str], per: int | None) -> None:
        """Bind a part of a growing batch to the batch's hosts still running its earlier parts,
        starting new ones only to reach the spread a counted batch gets (a host per CPU and
        node; with clones per host set, a new host once each holds that many unfinished jobs).
        A part never pays for process starts the batch's hosts already paid (docs/inputs.md)."""
        spread = max(self.cpus, self.nodes, 1)
        moves = self.hosts.spread(
            self._part_hosts.get(batch_id, ()),
            ids,
            per_new=per or self._per_host(len(ids)),
            fill_to=per or self.hosts.placement.cap(),
            at_least=1 if per else spread,
        )
        hosts = {h.host_id: h for h in self._part_hosts.get(batch_id, ()) if self.hosts.is_live(h)}
        for move in moves:
            hosts[move.host.host_id] = move.host
            for job_id in move.job_ids:
                self.table.jobs[job_id].host_id = move.host.host_id
        self._part_hosts[batch_id] = list(hosts.values())

    def _per_host(self, count: int) -> int:
        """Clones per new host for ``count`` jobs when the batch does not say: from the
        cluster's CPUs and nodes, at most ``cluster.max_clones_per_host`` while hosts ask for
        resources (:class:`~clonefleet.planning.Placement`)."""
        cap = self.hosts.placement.cap()
        return choose_clones_per_actor(count, self.cpus, self.nodes, cap)

    def forget_batch(self, batch_id: str) -> list[str]:
        """Drop a batch from the table, the host map and the usage ledger (never accepted, or
        evicted); returns its job ids."""
        ids = self.table.forget_batch(batch_id)
        self._part_hosts.pop(batch_id, None)
        self.hosts.forget(ids)
        self.usage.drop_batch(batch_id)
        return ids

    def _meta(self, batch_id: str) -> BatchSubmission:
        batch = self.table.batch(batch_id)
        if batch is None or batch.meta is None:
            raise KeyError(f"batch {batch_id} has no submission to run")
        return batch.meta

    def _bind(self, host: HostCalls, job_ids: Sequence[str]) -> None:
        self.hosts.bind(host, job_ids)
        for job_id in job_ids:
            self.table.jobs[job_id].host_id = host.host_id

    def warm(self, count: int) -> None:
        """Start ``count`` idle hosts now, so the next batches skip process start-up."""
        self.hosts.warm(count)

    async def warm_ready(self) -> int:
        """Wait until every idle host has started (its process is up, imports done)."""
        return await self.hosts.warm_ready()

    # -- the pool ------------------------------------------------------------------------
    @contextmanager
    def paused(self) -> Iterator[None]:
        """While inside, no queued job starts (a slot an ending job frees stays free); on
        leaving, the pump runs once (unless an outer pause still holds it)."""
        held, self._pump_held = self._pump_held, True
        try:
            yield
        finally:
            self._pump_held = held
        if not held:
            self._pump()

    def _pump(self) -> None:
        """Start queued jobs while slots are free (round-robin over batches)."""
        if self._pump_held:
            return
        starts: dict[tuple[str, str], tuple[HostCalls, str, list[CloneSpec]]] = {}
        for batch_id, job_id in self.table.take_queued(self.max_concurrency):
            self.durable.running(self.table.jobs[job_id])
            host, spec = self.hosts.host_of(job_id), self.table.spec_of(job_id)
            assert host is not None, f"job {job_id} has no host"
            assert spec is not None, f"job {job_id} has no spec"
            start = starts.setdefault((host.host_id, batch_id), (host, batch_id, []))
            start[2].append(spec)
        for host, batch_id, specs in starts.values():
            self._spawn(self._start_on(host, specs, self._meta(batch_id)))

    async def _start_on(
        self, host: HostCalls, specs: list[CloneSpec], meta: BatchSubmission, tries: int = 3
    ) -> None:
        """Start clones on a host; a host that is gone is replaced (``tries`` new hosts in all;
        moving to a busy live host costs no try).

        Only jobs the host accepted count as started there: should it die, those are restarted
        from their checkpoints (:meth:`_host_lost`), and jobs it never accepted simply move on.
        """
        specs = [s for s in specs if not self.table.jobs[s.job_id].is_terminal]
        if not specs:
            return
        checkpoints = self.table.checkpoints
        resume = {s.job_id: checkpoints[s.job_id] for s in specs if s.job_id in checkpoints}
        try:
            # Placement first: once started, a quick host may finish and be gone.
            node = await self._placed_node(host)
            specs = [s for s in specs if not self.table.jobs[s.job_id].is_terminal]
            if not specs:  # stopped while the host waited for a node
                return
            await host.start(specs, meta.config, meta.sim_script, resume or None)
        except _NotPlaced:  # Ray did not place it within cluster.host_wait_s
            self._unplaced(host, specs, meta)
            return
        except ClusterError as exc:
            self._start_failed(host, specs, meta, tries, exc)
            return
        ids = [s.job_id for s in specs]
        self.hosts.started(host, ids)
        if self.hosts.is_dead(host):  # its drain loop found it dead while it answered us
            self._host_lost(host, ids, f"clone host {host.host_id} died as its clones started")
            return
        for spec in specs:
            self.table.jobs[spec.job_id].node = node
        self.mail.started(host, ids, resume)

    async def _placed_node(self, host: HostCalls) -> str | None:
        """The host's node once it has started (``None``: an in-process host). Every start on
        one host that asked for resources shares one wait.

        Raises:
            ClusterError: the host is gone.
            _NotPlaced: it asked for resources and Ray did not place it within
                ``cluster.host_wait_s``.
        """
        if self.hosts.is_placed(host):
            return await node_of(host)
        task = self._placing.get(host.host_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._wait_placed(host))
            self._placing[host.host_id] = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        placed, node = await asyncio.shield(task)
        if not placed:
            raise _NotPlaced(host.host_id)
        return node

    async def _wait_placed(self, host: HostCalls) -> tuple[bool, str | None]:
        """Wait for a host asking for resources to start; its jobs get a ``host_pending``
        event after :data:`PENDING_NOTICE_S`. Returns whether it started in time, and its
        node."""
        wait_s = self.hosts.placement.wait_s
        began = time.monotonic()
        ask = asyncio.ensure_future(node_of(host))
        try:
            done, _ = await asyncio.wait({ask}, timeout=min(PENDING_NOTICE_S, wait_s))
            if not done:
                self._note_pending(host, wait_s)
                left = wait_s - (time.monotonic() - began)
                done, _ = await asyncio.wait({ask}, timeout=max(left, 0.0))
            if not done:
                return False, None
            node = ask.result()
            self.hosts.placed(host)
            return True, node
        finally:
            ask.cancel()
            self._placing.pop(host.host_id, None)

    def _note_pending(self, host: HostCalls, wait_s: float) -> None:
        """Say on each job bound to a host that has not started why it waits."""
        asked = ", ".join(f"{k}: {v:g}" for k, v in sorted(self.hosts.asks(host).items()))
        detail = (
            f"clone host {host.host_id} asks the cluster for {{{asked}}} "
            "(cluster.host_resources) and no node has that free yet; an autoscaler may be "
            f"adding one. Its clones start when it does, or on the hosts that run after "
            f"{wait_s:g}s (cluster.host_wait_s)"
        )
        event = {"type": str(EventType.HOST_PENDING), "ts": time.time()}
        event.update(host=host.host_id, resources=self.hosts.asks(host), detail=detail)
        for job_id in self.hosts.bound_to(host):
            rec = self.table.jobs.get(job_id)
            if rec is not None and not rec.is_terminal:
                self.event_log.record(job_id, dict(event))

    def _unplaced(self, host: HostCalls, specs: list[CloneSpec], meta: BatchSubmission) -> None:
        """Ray did not place a host asking for resources in time: the jobs ``specs`` name (the
        pump started them on it) go to the hosts that run, and start there. The first caller
        also gives the host up: its queued jobs move too, it is killed (its demand on the
        cluster ends) and new hosts ask for nothing for a while (:meth:`Placement.unplaced`)."""
        ids = [
            s.job_id
            for s in specs
            if not self.table.jobs[s.job_id].is_terminal and self.hosts.host_of(s.job_id) is host
        ]
        if not self.hosts.is_dead(host):
            self.hosts.mark_dead(host)
            self.hosts.placement.unplaced()
            waiting: dict[str, list[str]] = {}
            for job_id in self.hosts.bound_to(host):
                rec = self.table.jobs[job_id]
                if self.table.is_waiting(job_id):
                    waiting.setdefault(rec.batch_id, []).append(job_id)
            for batch_id, queued in waiting.items():
                self._pack(host, batch_id, queued)
            self._spawn(host.close())
        if not ids:
            return
        by_id = {s.job_id: s for s in specs}
        for move in self._pack(host, meta.batch_id, ids):
            self._spawn(self._start_on(move.host, [by_id[j] for j in move.job_ids], meta))

    def _pack(self, host: HostCalls, batch_id: str, ids: list[str]) -> list[Move]:
        """Bind jobs of one batch off a host given up on (:meth:`HostPool.pack`)."""
        planned = len(self.table.batch_job_ids.get(batch_id, ())) or len(ids)
        per = self._meta(batch_id).clones_per_actor or self._per_host(planned)
        moves = self.hosts.pack(host, ids, per)
        for move in moves:
            for job_id in move.job_ids:
                self.table.jobs[job_id].host_id = move.host.host_id
        return moves

    def _start_failed(
        self,
        host: HostCalls,
        specs: list[CloneSpec],
        meta: BatchSubmission,
        tries: int,
        exc: ClusterError,
    ) -> None:
        """A host could not start clones: it is gone, and everything bound to it moves now."""
        self.hosts.mark_dead(host)
        self._move_waiting(host)
        ids = [s.job_id for s in specs if not self.table.jobs[s.job_id].is_terminal]
        if tries > 1 and ids:
            # E.g. a warm host that died while idle: its new clones go to another host.
            by_id = {s.job_id: s for s in specs}
            for move in self._move(host, meta.batch_id, ids):
                again = [by_id[j] for j in move.job_ids]
                self._spawn(self._start_on(move.host, again, meta, tries - int(move.new)))
            return
        if ids:
            # Hosts keep dying under these jobs: each counts a restart, up to its limit.
            self._host_lost(host, ids, f"clone host {host.host_id} unavailable: {exc}")

    def _move(self, dead: HostCalls, batch_id: str, ids: list[str]) -> list[Move]:
        """Bind unfinished jobs of one batch off a dead host (:meth:`HostPool.move`), in one
        step; new hosts, if any are needed, take as many jobs as the batch's first hosts did.

        Under a cap (the batch's or the fleet's) the live hosts take them all: the cap, not the
        hosts, sets how many run at once, so the survivors run no more clones than before and
        nothing waits for a new host to start. Uncapped, every bound job runs at once: a live
        host takes them only while it holds fewer than the batch's clones per host, and the rest
        go to new hosts, so the batch keeps its planned spread (piling a dead host's clones onto
        the survivors would double their load and put more clones in the way of the next death).
        """
        meta = self._meta(batch_id)
        planned = len(self.table.batch_job_ids.get(batch_id, ())) or len(ids)
        per = meta.clones_per_actor or self._per_host(planned)
        capped = meta.max_concurrency is not None or self.max_concurrency is not None
        moves = self.hosts.move(dead, ids, per, None if capped else per)
        for move in moves:
            for job_id in move.job_ids:
                self.table.jobs[job_id].host_id = move.host.host_id
        return moves

    def _move_waiting(self, dead: HostCalls) -> None:
        """Move the queued jobs bound to a dead host, all at once, to live hosts: each would
        otherwise find the host dead only when it got a slot, and move alone."""
        by_batch: dict[str, list[str]] = {}
        for job_id in self.hosts.bound_to(dead):
            if self.table.is_waiting(job_id):
                by_batch.setdefault(self.table.jobs[job_id].batch_id, []).append(job_id)
        for batch_id, ids in by_batch.items():
            self._move(dead, batch_id, ids)

    def _host_died(self, host: HostCalls, started: list[str], detail: str) -> None:
        """A host's drain loop found it dead: its queued jobs move to live hosts, its started
        ones start again from their checkpoints (:meth:`_host_lost`)."""
        self._move_waiting(host)
        if started:
            self._host_lost(host, started, detail)

    def _host_lost(self, host: HostCalls, job_ids: list[str], detail: str) -> None:
        """A host died with clones it had started: each starts again on a live host (or a fresh
        one) from its last checkpoint, until it was restarted ``limits.max_restarts`` times;
        then it fails."""
        by_batch: dict[str, list[str]] = {}
        for job_id in job_ids:
            rec = self.table.jobs[job_id]
            if rec.is_terminal or self.hosts.host_of(job_id) is not host:
                continue  # ended, or already moved (its start and the drain loop both saw it)
            reason = self.stops.reason_of(job_id)
            if reason is not None:  # asked to stop: it does not start again
                self._end(rec, JobState.CANCELLED, reason)
                continue
            limit = self._meta(rec.batch_id).config.limits.max_restarts
            if rec.restarts >= limit or self.table.spec_of(job_id) is None:
                tried = f"; restarted {rec.restarts} time(s), limits.max_restarts is {limit}"
                self.crash_job(job_id, detail + tried)
            else:
                by_batch.setdefault(rec.batch_id, []).append(job_id)
        for batch_id, ids in by_batch.items():
            for move in self._move(host, batch_id, ids):
                for job_id in move.job_ids:
                    self._restarted(self.table.jobs[job_id], host, detail)
                specs = [self.table.spec_of(j) for j in move.job_ids]
                ready = [s for s in specs if s is not None]
                self._spawn(self._start_on(move.host, ready, self._meta(batch_id)))

    def _restarted(self, rec: JobRecord, dead: HostCalls, detail: str) -> None:
        rec.restarts += 1
        rec.node = None
        self.durable.restarted(rec)
        turn = int((state_of(self.table.checkpoint_of(rec.job_id)) or {}).get("turns", 0) or 0)
        event = {"type": str(EventType.RESTARTED), "ts": time.time(), "attempt": rec.restarts}
        event.update(from_host=dead.host_id, resumed_turn=turn, detail=detail[:500])
        self.event_log.record(rec.job_id, event)

    # -- events from hosts ---------------------------------------------------------------
    def apply_event(self, job_id: str, event: dict[str, Any]) -> None:
        """Count one event of a host's clone into its job and log it."""
        rec = self.table.jobs.get(job_id)
        if rec is None or rec.is_terminal:
            return
        kind = event["type"]
        if kind == EventType.FINAL:
            self._finish(rec, event["result"])
            return
        if kind == EventType.MESSAGE_DELIVERED:
            self.mail.delivered(job_id, str(event.get("delivery_id")))
        elif kind == EventType.CHECKPOINT:
            state = event.get("state")
            if isinstance(state, dict | bytes):
                self.table.set_checkpoint(job_id, state)
                self.durable.checkpoint(job_id, state)
            return
        if kind == EventType.RESULT:
            return  # the scheduler writes the one terminal event itself (see _finish)
        if kind == EventType.USAGE:
            rec.turns = event.get("turn", rec.turns)
            rec.model = event.get("model") or rec.model
            passed = self.usage.count(rec, event)  # job, batch and fleet totals; budgets
            self.event_log.record(job_id, event)
            if passed:
                self.stops.budget_passed(rec, passed)
            return
        if kind == EventType.PROGRESS:
            rec.progress = event.get("progress")
        elif kind == EventType.TODO:
            rec.todos = event.get("todos")
        elif kind == EventType.MODEL_FAILOVER:
            rec.model = event.get("to") or rec.model
        elif kind == EventType.ERROR:
            rec.detail = event.get("detail")
        elif kind == EventType.STARTED:
            rec.model = event.get("model") or rec.model
        self.event_log.record(job_id, event)

    def _finish(self, rec: JobRecord, result: dict[str, Any]) -> None:
        self.table.ending(rec)  # its slot or queue place, spec and checkpoint
        passed = self.usage.settle(rec, result.get("usage"))
        reason = self.stops.take_reason(rec.job_id)
        if reason is not None and result.get("status") == JobState.CANCELLED:
            # Cancelled by the scheduler (a budget stop): the run ends with that reason.
            result = {**result, "stop_reason": str(reason), "error": stop_error(reason)}
        rec.finish(result)
        self.durable.ended(rec, self.usage.recorded(rec.batch_id))
        self.mail.ended(rec.job_id)
        self.hosts.ended(rec.job_id)
        self._ended.fire()
        event = {
            "type": str(EventType.RESULT),
            "ts": time.time(),
            "status": str(rec.state),
            "stop_reason": rec.stop_reason,
            "outcome": rec.outcome,
            "error": rec.error,
            "cause": rec.cause,
            "cost_usd": known_cost(
                rec.cost_usd, rec.unpriced_tokens, rec.usage.get("total_tokens", 0)
            ),
            "record": rec.run_record(),
        }
        self.event_log.record(rec.job_id, event)
        self._pump()
        if passed:
            self.stops.budget_passed(rec, passed)

    def _end(self, rec: JobRecord, state: JobState, reason: StopReason, detail: str = "") -> None:
        """End a job whose clone cannot report its own end (cancelled while queued, or its host
        is gone), keeping what its events had counted: turns, usage and model."""
        outcome = Outcome.CANCELLED if state is JobState.CANCELLED else Outcome.FAILURE
        record = rec.run_record(
            status=state,
            stop_reason=reason,
            outcome=str(outcome),
            result=None,
            error=stop_error(reason, detail),
        )
        self._finish(rec, record)

    def crash_job(self, job_id: str, detail: str) -> None:
        """End a job whose host died or could not start it (or that cannot run again)."""
        rec = self.table.jobs[job_id]
        if rec.is_terminal:
            return
        rec.detail = detail
        event = {
            "type": str(EventType.ERROR),
            "ts": time.time(),
            "stop_reason": str(StopReason.ABNORMAL),
            "detail": detail,
        }
        self.event_log.record(job_id, event)
        self._end(rec, JobState.FAILED, StopReason.ABNORMAL, detail)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- job control ---------------------------------------------------------------------
    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> api.Submitted:
        """Start a batch on behalf of a running clone (the ``subagent`` tool); see
        :func:`~clonefleet.scheduler._nested.spawn_nested`."""
        return await spawn_nested(self.table, self.hosts, self.submit, request, parent_job_id)

    async def job_status(self, job_id: str) -> api.JobStatus:
        return await self._queries.job_status(job_id)

    async def job_result(self, job_id: str) -> api.RunRecord:
        return await self._queries.job_result(job_id)

    async def job_cancel(self, job_id: str) -> api.JobStatus:
        rec = self.table.get(job_id)
        await self.stops.cancel_many([job_id])
        return rec.status()

    async def cancel_many(self, ids: Sequence[str]) -> int:
        """Cancel jobs and batches (see :class:`JobControl`); a batch cancelled as a whole is
        closed and refuses more parts (:meth:`extend`)."""
        for ident in ids:
            batch = self.table.batch(ident)
            if batch is not None and not batch.cancelled:
                batch.cancelled, batch.open = True, False
                self.durable.closed(ident, cancelled=True)
                self._ended.fire()
        return await self.stops.cancel_many(ids)

    async def job_block(
        self, job_ids: Sequence[str], wait_seconds: Seconds = None, timeout_seconds: Seconds = None
    ) -> api.BlockResult:
        return await self._queries.job_block(job_ids, wait_seconds, timeout_seconds)

    async def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        return await self._queries.remaining(ids, wait_seconds)

    async def list_jobs(self, **filters: Unpack[api.JobFilter]) -> api.JobListing:
        return await self._queries.list_jobs(**filters)

    async def expand(self, ids: Sequence[str]) -> list[str]:
        return await self._queries.expand(ids)

    async def events(
        self, target: api.Target = None, **query: Unpack[api.EventQuery]
    ) -> api.EventPage:
        return await self._queries.events(target, **query)

    def capacity(self) -> api.Capacity:
        return {
            "running": self.table.running,
            "max_concurrency": self.max_concurrency,
            "queued": self.table.queued,
        }

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hosts.aclose()
