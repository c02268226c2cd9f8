"""The scheduler core: the job table, the pool of slots and job control.

:class:`SchedulerCore` is plain async Python and implements :class:`~clonefleet.control.JobControl`
itself. It reaches clone hosts only through :class:`~clonefleet.host.HostCalls` (see
``_hosts.py``), so tests drive it with in-process hosts and the Ray shell gives it actor-backed
ones; events go to the log of ``_events.py``. It owns which job runs where and when; it never
renders a template: the client renders a user's batch before submitting (so nothing starts on
a render error), and the parent's clone host renders a nested spawn (``_nested.py``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import Any

from clonefleet import control as api
from clonefleet.clone import CloneSpec, state_of
from clonefleet.config import DurabilityConfig
from clonefleet.errors import ClusterError, IdCollision, UsageError
from clonefleet.host import HostCalls, HostFactory
from clonefleet.planning import BatchSubmission, new_batch_id, new_job_id
from clonefleet.scheduler._durable import Durable
from clonefleet.scheduler._events import EventLog, Pulse
from clonefleet.scheduler._hosts import (
    HostPool,
    Move,
    choose_clones_per_actor,
    node_of,
)
from clonefleet.scheduler._listing import JobOrder
from clonefleet.scheduler._mail import Mailroom
from clonefleet.scheduler._nested import spawn_nested
from clonefleet.scheduler._state import JobRecord, known_cost
from clonefleet.scheduler._stops import JobStops
from clonefleet.scheduler._usage import UsageBook, budget_record
from clonefleet.vocab import EventType, JobState, Outcome, StopReason, stop_error

__all__ = ["BatchSubmission", "SchedulerCore"]


class SchedulerCore(JobStops):
    """Owns the job table and runs batches on clone hosts; a :class:`JobControl`.

    Args:
        host_factory: makes a host for ``(host_id, control)``; ``control`` is this core.
        max_concurrency: fleet-wide cap on running jobs (``None`` = none).
        cpus: CPUs of the cluster, for the automatic clones-per-actor choice.
        nodes: nodes of the cluster.
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
    ) -> None:
        self.max_concurrency, self.cpus, self.nodes = max_concurrency, cpus, nodes
        self.durable = durable or Durable(None)
        settings = durability or DurabilityConfig()
        self.retention_s = settings.retention_s if settings.retention_s is not None else math.inf
        """How long finished batches restored without their config stay in the table."""
        self.compact_bytes = settings.compact_bytes
        self.journal_damage: list[str] = []
        """Damaged spots the journal had when this scheduler started (each a sentence)."""
        self.jobs: dict[str, JobRecord] = {}
        self.hosts = HostPool(
            host_factory, self, apply=self._apply, lost=self._host_died, spawn=self._spawn_task
        )
        self._reserved_ids: dict[str, str] = {}
        """Job ids handed out by :meth:`reserve_ids` but not yet submitted, to their batch id."""
        self._specs: dict[str, CloneSpec] = {}
        self._queues: dict[str, deque[str]] = {}
        self._batch_cap: dict[str, int | None] = {}
        self._batch_running: dict[str, int] = {}
        self._batches: dict[str, list[str]] = {}
        self._batch_meta: dict[str, BatchSubmission] = {}
        self._children: dict[str, list[str]] = {}
        self._checkpoints: dict[str, Any] = {}
        """Each running job's latest checkpoint as its host shipped it, packed (``state_of``
        unpacks it); a restarted clone resumes from it."""
        self._running = 0
        self._queued = 0
        """Jobs waiting in the queues (``reserved``, with a spec): kept, not counted per call."""
        self.usage = UsageBook(self.jobs)
        self._order = JobOrder()
        self._stop_reasons: dict[str, StopReason] = {}
        self._pump_held = False
        self._log = EventLog(
            self.jobs,
            max_events=settings.max_events,
            spill=self.durable.events,
            unspill=self.durable.read_events,
        )
        self._ended = Pulse()
        """Fired once per batch of job endings (not per event)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.mail = Mailroom(self, self._spawn_task)

    # -- ids and submission --------------------------------------------------------------
    def reserve_ids(self, count: int) -> tuple[str, list[str]]:
        """Allocate a batch id and ``count`` unique job ids for rendering."""
        batch_id = new_batch_id()
        while batch_id in self._batches:
            batch_id = new_batch_id()
        ids: list[str] = []
        while len(ids) < count:
            job_id = new_job_id()
            if job_id not in self.jobs and job_id not in self._reserved_ids:
                self._reserved_ids[job_id] = batch_id
                ids.append(job_id)
        return batch_id, ids

    async def submit(self, sub: BatchSubmission, blob: bytes | None = None) -> api.Submitted:
        """Record every job of the batch as ``reserved``, assign hosts and start what the caps allow.

        Ids may come from :meth:`reserve_ids` or be drawn by the client (which renders before it
        reaches the cluster); either way none may be in use already. The ids are returned only
        once the batch's journal record is on disk; ``blob`` is the submission already pickled
        (by the client, so the scheduler need not pickle it again for the journal).

        Raises:
            UsageError: an empty batch.
            IdCollision: the batch id or a job id is already in use.
            JournalError: the journal could not be written (nothing starts).
        """
        self._check_ids(sub)
        self._add_batch(sub)
        for spec in sub.specs:
            self._add_job(spec)
        try:
            rows = [self.jobs[s.job_id] for s in sub.specs]
            self.durable.batch(sub.batch_id, rows, sub, blob, budget=budget_record(sub))
            await self.durable.commit()
        except BaseException:
            self._drop_batch(sub.batch_id)
            raise
        if self.usage.stopped_above(sub.specs[0].parent):  # spawned as its budget was passed
            self._mark([s.job_id for s in sub.specs], StopReason.BUDGET)
        self._queue_batch(sub.batch_id, sub.clones_per_actor)
        self._pump()
        return {"batch_id": sub.batch_id, "job_ids": [s.job_id for s in sub.specs]}

    def _add_batch(self, sub: BatchSubmission) -> None:
        self._batches[sub.batch_id] = [s.job_id for s in sub.specs]
        self._batch_meta[sub.batch_id] = replace(sub, specs=())
        self._batch_cap[sub.batch_id] = sub.max_concurrency
        self._batch_running[sub.batch_id] = 0
        self.usage.add_batch(sub.batch_id, sub.config, sub.budget_tokens, sub.budget_usd)

    def _drop_batch(self, batch_id: str) -> None:
        """Forget a batch that was never accepted (its record could not be written)."""
        ids = self._batches.pop(batch_id, [])
        for job_id in ids:
            rec = self.jobs.pop(job_id, None)
            self._specs.pop(job_id, None)
            if rec is not None and rec.parent in self._children:
                self._children[rec.parent].remove(job_id)
        for table in (self._batch_meta, self._batch_cap, self._batch_running, self._queues):
            table.pop(batch_id, None)
        self.usage.drop_batch(batch_id)
        self._order.forget(len(ids), self.jobs)
        self._queued -= len(ids)  # none of them had started

    def _queue_batch(self, batch_id: str, clones_per_actor: int | None) -> None:
        """Bind the batch's waiting jobs to hosts, then queue them for the pump.

        A batch's jobs join the pump's queues only here, with their hosts: between adding its
        jobs and this, a submit awaits its journal record, and other batches' pumps run.
        """
        ids = [
            j
            for j in self._batches.get(batch_id, ())
            if self.jobs[j].state is JobState.RESERVED and j in self._specs
        ]
        if not ids:
            return
        per = clones_per_actor or choose_clones_per_actor(len(ids), self.cpus, self.nodes)
        for start in range(0, len(ids), per):
            self._bind(self.hosts.acquire(), ids[start : start + per])
        self._queues[batch_id] = deque(ids)

    def _check_ids(self, sub: BatchSubmission) -> None:
        if not sub.specs:
            raise UsageError("a batch needs at least one clone")
        if sub.batch_id in self._batches:
            raise IdCollision(sub.batch_id)
        seen: set[str] = set()
        for spec in sub.specs:
            taken = spec.job_id in self.jobs or spec.job_id in seen
            if taken or self._reserved_ids.get(spec.job_id, sub.batch_id) != sub.batch_id:
                raise IdCollision(spec.job_id)
            seen.add(spec.job_id)

    def _add_job(self, spec: CloneSpec) -> None:
        self._reserved_ids.pop(spec.job_id, None)
        self.jobs[spec.job_id] = JobRecord(
            job_id=spec.job_id,
            batch_id=spec.batch_id,
            agent=spec.agent,
            clone_index=spec.clone_index,
            clone_count=spec.clone_count,
            parent=spec.parent,
            depth=spec.depth,
            model=spec.candidates[spec.start % len(spec.candidates)] if spec.candidates else None,
            warnings=list(spec.warnings),
        )
        self._specs[spec.job_id] = spec
        self._queued += 1
        self._order.add(spec.job_id)
        if spec.parent:
            self._children.setdefault(spec.parent, []).append(spec.job_id)
        self._log.record(spec.job_id, {"type": str(EventType.QUEUED), "ts": time.time()})

    def _bind(self, host: HostCalls, job_ids: Sequence[str]) -> None:
        self.hosts.bind(host, job_ids)
        for job_id in job_ids:
            self.jobs[job_id].host_id = host.host_id

    def warm(self, count: int) -> None:
        """Start ``count`` idle hosts now, so the next batches skip process start-up."""
        self.hosts.warm(count)

    async def warm_ready(self) -> int:
        """Wait until every idle host has started (its process is up, imports done)."""
        return await self.hosts.warm_ready()

    # -- the pool ------------------------------------------------------------------------
    def _slots_free(self) -> bool:
        return self.max_concurrency is None or self._running < self.max_concurrency

    def _next_queued(self, batch_id: str, queue: deque[str]) -> str | None:
        """Take the batch's next queued job if a slot and the batch's cap allow (or ``None``)."""
        cap = self._batch_cap[batch_id]
        if not queue or not self._slots_free():
            return None
        if cap is not None and self._batch_running[batch_id] >= cap:
            return None
        return queue.popleft()

    def _pump(self) -> None:
        """Start queued jobs while slots are free (round-robin over batches)."""
        if self._pump_held:
            return
        starts: dict[tuple[str, str], tuple[HostCalls, str, list[CloneSpec]]] = {}
        progressed = True
        while progressed and self._slots_free():
            progressed = False
            for batch_id, queue in self._queues.items():
                job_id = self._next_queued(batch_id, queue)
                if job_id is None:
                    continue
                progressed = True  # a job taken off the queue, even one that already ended
                if self.jobs[job_id].state is not JobState.RESERVED:
                    continue
                self.jobs[job_id].move(JobState.RUNNING)
                self.durable.running(self.jobs[job_id])
                self._running += 1
                self._queued -= 1
                self._batch_running[batch_id] += 1
                host = self.hosts.host_of(job_id)
                assert host is not None, f"job {job_id} has no host"
                start = starts.setdefault((host.host_id, batch_id), (host, batch_id, []))
                start[2].append(self._specs[job_id])
        for batch_id in [b for b, q in self._queues.items() if not q]:
            del self._queues[batch_id]  # a batch never queues again once its queue is empty
        for host, batch_id, specs in starts.values():
            self._spawn_task(self._start_on(host, specs, self._batch_meta[batch_id]))

    async def _start_on(
        self, host: HostCalls, specs: list[CloneSpec], meta: BatchSubmission, tries: int = 3
    ) -> None:
        """Start clones on a host; a host that is gone is replaced (``tries`` new hosts in all;
        moving to a busy live host costs no try).

        Only jobs the host accepted count as started there: should it die, those are restarted
        from their checkpoints (:meth:`_host_lost`), and jobs it never accepted simply move on.
        """
        specs = [s for s in specs if not self.jobs[s.job_id].is_terminal]
        if not specs:
            return
        resume = {
            s.job_id: self._checkpoints[s.job_id] for s in specs if s.job_id in self._checkpoints
        }
        try:
            # Placement first: once started, a quick host may finish and be gone.
            node = await node_of(host)
            await host.start(specs, meta.config, meta.sim_script, resume or None)
        except ClusterError as exc:
            self._start_failed(host, specs, meta, tries, exc)
            return
        ids = [s.job_id for s in specs]
        self.hosts.started(host, ids)
        if self.hosts.is_dead(host):  # its drain loop found it dead while it answered us
            self._host_lost(host, ids, f"clone host {host.host_id} died as its clones started")
            return
        for spec in specs:
            self.jobs[spec.job_id].node = node
        self.mail.started(host, ids, resume)

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
        ids = [s.job_id for s in specs if not self.jobs[s.job_id].is_terminal]
        if tries > 1 and ids:
            # E.g. a warm host that died while idle: its new clones go to another host.
            by_id = {s.job_id: s for s in specs}
            for move in self._move(host, meta.batch_id, ids):
                again = [by_id[j] for j in move.job_ids]
                self._spawn_task(self._start_on(move.host, again, meta, tries - int(move.new)))
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
        meta = self._batch_meta[batch_id]
        planned = len(self._batches.get(batch_id, ())) or len(ids)
        per = meta.clones_per_actor or choose_clones_per_actor(planned, self.cpus, self.nodes)
        capped = meta.max_concurrency is not None or self.max_concurrency is not None
        moves = self.hosts.move(dead, ids, per, None if capped else per)
        for move in moves:
            for job_id in move.job_ids:
                self.jobs[job_id].host_id = move.host.host_id
        return moves

    def _move_waiting(self, dead: HostCalls) -> None:
        """Move the queued jobs bound to a dead host, all at once, to live hosts: each would
        otherwise find the host dead only when it got a slot, and move alone."""
        by_batch: dict[str, list[str]] = {}
        for job_id in self.hosts.bound_to(dead):
            if self._is_waiting(job_id):
                by_batch.setdefault(self.jobs[job_id].batch_id, []).append(job_id)
        for batch_id, ids in by_batch.items():
            self._move(dead, batch_id, ids)

    def _is_waiting(self, job_id: str) -> bool:
        rec = self.jobs.get(job_id)
        return rec is not None and rec.state is JobState.RESERVED and job_id in self._specs

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
            rec = self.jobs[job_id]
            if rec.is_terminal or self.hosts.host_of(job_id) is not host:
                continue  # ended, or already moved (its start and the drain loop both saw it)
            if job_id in self._stop_reasons:  # asked to stop: it does not start again
                self._end(rec, JobState.CANCELLED, self._stop_reasons[job_id])
                continue
            limit = self._batch_meta[rec.batch_id].config.limits.max_restarts
            if rec.restarts >= limit or job_id not in self._specs:
                tried = f"; restarted {rec.restarts} time(s), limits.max_restarts is {limit}"
                self._crash(job_id, detail + tried)
            else:
                by_batch.setdefault(rec.batch_id, []).append(job_id)
        for batch_id, ids in by_batch.items():
            for move in self._move(host, batch_id, ids):
                for job_id in move.job_ids:
                    self._restarted(self.jobs[job_id], host, detail)
                specs = [self._specs[j] for j in move.job_ids]
                self._spawn_task(self._start_on(move.host, specs, self._batch_meta[batch_id]))

    def _restarted(self, rec: JobRecord, dead: HostCalls, detail: str) -> None:
        rec.restarts += 1
        rec.node = None
        self.durable.restarted(rec)
        turn = int((state_of(self._checkpoints.get(rec.job_id)) or {}).get("turns", 0) or 0)
        event = {"type": str(EventType.RESTARTED), "ts": time.time(), "attempt": rec.restarts}
        event.update(from_host=dead.host_id, resumed_turn=turn, detail=detail[:500])
        self._log.record(rec.job_id, event)

    def _release(self, rec: JobRecord, was_running: bool) -> None:
        if was_running:
            self._running -= 1
            self._batch_running[rec.batch_id] -= 1
        self._specs.pop(rec.job_id, None)
        self._pump()

    # -- events from hosts ---------------------------------------------------------------
    def _apply(self, job_id: str, event: dict[str, Any]) -> None:
        """Count one event of a host's clone into its job and log it."""
        rec = self.jobs.get(job_id)
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
                self._checkpoints[job_id] = state
                self.durable.checkpoint(job_id, state)
            return
        if kind == EventType.RESULT:
            return  # the scheduler writes the one terminal event itself (see _finish)
        if kind == EventType.USAGE:
            rec.turns = event.get("turn", rec.turns)
            rec.model = event.get("model") or rec.model
            passed = self.usage.count(rec, event)  # job, batch and fleet totals; budgets
            self._log.record(job_id, event)
            if passed:
                self._budget_passed(rec, passed)
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
        self._log.record(job_id, event)

    def _finish(self, rec: JobRecord, result: dict[str, Any]) -> None:
        was_running = rec.state is JobState.RUNNING
        if rec.state is JobState.RESERVED and rec.job_id in self._specs:
            self._queued -= 1  # it ends while it waited
        passed = self.usage.settle(rec, result.get("usage"))
        reason = self._stop_reasons.pop(rec.job_id, None)
        if reason is not None and result.get("status") == JobState.CANCELLED:
            # Cancelled by the scheduler (a budget stop): the run ends with that reason.
            result = {**result, "stop_reason": str(reason), "error": stop_error(reason)}
        rec.finish(result)
        self.durable.ended(rec, self.usage.recorded(rec.batch_id))
        self._checkpoints.pop(rec.job_id, None)
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
            "cost_usd": known_cost(
                rec.cost_usd, rec.unpriced_tokens, rec.usage.get("total_tokens", 0)
            ),
            "record": rec.run_record(),
        }
        self._log.record(rec.job_id, event)
        self._release(rec, was_running)
        if passed:
            self._budget_passed(rec, passed)

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

    def _crash(self, job_id: str, detail: str) -> None:
        """End a job whose host died or could not start it."""
        rec = self.jobs[job_id]
        if rec.is_terminal:
            return
        rec.detail = detail
        event = {
            "type": str(EventType.ERROR),
            "ts": time.time(),
            "stop_reason": str(StopReason.ABNORMAL),
            "detail": detail,
        }
        self._log.record(job_id, event)
        self._end(rec, JobState.FAILED, StopReason.ABNORMAL, detail)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- job control ---------------------------------------------------------------------
    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> api.Submitted:
        """Start a batch on behalf of a running clone (the ``subagent`` tool); see
        :func:`~clonefleet.scheduler._nested.spawn_nested`."""
        return await spawn_nested(self, request, parent_job_id)

    async def job_cancel(self, job_id: str) -> api.JobStatus:
        rec = self._get(job_id)
        await self.cancel_many([job_id])
        return rec.status()

    def capacity(self) -> api.Capacity:
        return {
            "running": self._running,
            "max_concurrency": self.max_concurrency,
            "queued": self._queued,
        }

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hosts.aclose()
