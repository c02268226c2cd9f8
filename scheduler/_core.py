"""The scheduler core: the job table, the pool of slots and job control.

:class:`SchedulerCore` is plain async Python and implements :class:`~clonefleet.control.JobControl`
itself. It reaches clone hosts only through :class:`~clonefleet.scheduler._hosts.HostLike` (see
``_hosts.py``), so tests drive it with in-process hosts and the Ray shell gives it actor-backed
ones; events go to the log of ``_events.py``. It owns which job runs where and when; it never
renders a template: the client renders a user's batch before submitting (so nothing starts on
a render error), and the parent's clone host renders a nested spawn (``_nested.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from itertools import chain
from typing import Any, Unpack

from .. import control as api
from ..actors import CloneSpec
from ..config import Config
from ..control import Seconds
from ..errors import ClusterError, IdCollision, TemplateError, UnknownJobError, UsageError
from ..vocab import EventType, JobState, Outcome, StopReason, stop_error
from ._batch import BatchRequest, check_count
from ._events import EventLog, Pulse
from ._hosts import HostFactory, HostLike, HostPool, choose_clones_per_actor, node_of
from ._nested import NestedPlan, check_planned
from ._state import TERMINAL, BatchSubmission, JobRecord, new_batch_id, new_job_id

__all__ = ["BatchSubmission", "SchedulerCore"]

LONGEST_WAIT_S = 3600.0
"""How long ``job_block`` waits when given no time limit."""
NESTED_PLAN_TIMEOUT_S = 30.0
"""How long :meth:`SchedulerCore.spawn_nested` waits for the parent's host to render the child
batch (the render's own budget is seconds; this only bounds a host that stopped answering)."""


class SchedulerCore:
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
    ) -> None:
        self.max_concurrency, self.cpus, self.nodes = max_concurrency, cpus, nodes
        self.jobs: dict[str, JobRecord] = {}
        self.hosts = HostPool(
            host_factory, self, apply=self._apply, lost=self._crash, spawn=self._spawn_task
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
        self._running = 0
        self._log = EventLog(self.jobs)
        self._ended = Pulse()
        """Fired once per batch of job endings (not per event)."""
        self._tasks: set[asyncio.Task[None]] = set()

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

    def submit(self, sub: BatchSubmission) -> api.Submitted:
        """Record every job of the batch as ``reserved``, assign hosts and start what the caps allow.

        Ids may come from :meth:`reserve_ids` or be drawn by the client (which renders before it
        reaches the cluster); either way none may be in use already.

        Raises:
            UsageError: an empty batch.
            IdCollision: the batch id or a job id is already in use.
        """
        self._check_ids(sub)
        self._batches[sub.batch_id] = [s.job_id for s in sub.specs]
        self._batch_meta[sub.batch_id] = replace(sub, specs=())
        self._batch_cap[sub.batch_id] = sub.max_concurrency
        self._batch_running[sub.batch_id] = 0
        self._queues[sub.batch_id] = deque()
        for spec in sub.specs:
            self._add_job(spec)
        per = sub.clones_per_actor or choose_clones_per_actor(len(sub.specs), self.cpus, self.nodes)
        for start in range(0, len(sub.specs), per):
            self._bind(self.hosts.acquire(), [s.job_id for s in sub.specs[start : start + per]])
        self._pump()
        return {"batch_id": sub.batch_id, "job_ids": [s.job_id for s in sub.specs]}

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
        self._queues[spec.batch_id].append(spec.job_id)
        if spec.parent:
            self._children.setdefault(spec.parent, []).append(spec.job_id)
        self._log.record(spec.job_id, {"type": str(EventType.QUEUED), "ts": time.time()})

    def _bind(self, host: HostLike, job_ids: Sequence[str]) -> None:
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
        starts: dict[tuple[str, str], tuple[HostLike, str, list[CloneSpec]]] = {}
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
                self._running += 1
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
        self, host: HostLike, specs: list[CloneSpec], meta: BatchSubmission, retry: bool = True
    ) -> None:
        try:
            # Placement first: once started, a quick host may finish and be gone.
            node = await node_of(host)
            await host.start(specs, meta.config, meta.sim_script)
        except ClusterError as exc:
            self.hosts.mark_dead(host)
            if retry:
                # A warm host that died while idle: move its new clones to a fresh host, once.
                ids = [s.job_id for s in specs if not self.jobs[s.job_id].is_terminal]
                fresh = self.hosts.rebind(host, ids)
                for job_id in ids:
                    self.jobs[job_id].host_id = fresh.host_id
                await self._start_on(fresh, specs, meta, retry=False)
                return
            for spec in specs:
                self._crash(spec.job_id, f"clone host {host.host_id} unavailable: {exc}")
            return
        for spec in specs:
            self.jobs[spec.job_id].node = node

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
        if kind == EventType.RESULT:
            return  # the scheduler writes the one terminal event itself (see _finish)
        if kind == EventType.USAGE:
            rec.turns = event.get("turn", rec.turns)
            rec.model = event.get("model") or rec.model
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                rec.usage[key] = rec.usage.get(key, 0) + int(event.get(key, 0))
        elif kind == EventType.PROGRESS:
            rec.progress = event.get("progress")
        elif kind == EventType.MODEL_FAILOVER:
            rec.model = event.get("to") or rec.model
        elif kind == EventType.ERROR:
            rec.detail = event.get("detail")
        elif kind == EventType.STARTED:
            rec.model = event.get("model") or rec.model
        self._log.record(job_id, event)

    def _finish(self, rec: JobRecord, result: dict[str, Any]) -> None:
        was_running = rec.state is JobState.RUNNING
        rec.finish(result)
        self.hosts.ended(rec.job_id)
        self._ended.fire()
        event = {
            "type": str(EventType.RESULT),
            "ts": time.time(),
            "status": str(rec.state),
            "stop_reason": rec.stop_reason,
            "outcome": rec.outcome,
            "error": rec.error,
            "record": rec.run_record(),
        }
        self._log.record(rec.job_id, event)
        self._release(rec, was_running)

    def _end(self, rec: JobRecord, state: JobState, reason: StopReason, detail: str = "") -> None:
        """End a job whose clone cannot report its own end (cancelled while queued, or its host
        is gone), keeping what its events had counted: turns, usage and model."""
        outcome = Outcome.CANCELLED if reason is StopReason.CANCELLED else Outcome.FAILURE
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
        :meth:`JobControl.spawn_nested <clonefleet.control.JobControl.spawn_nested>`.

        The child batch is rendered on the parent's clone host, never here (see
        ``scheduler/_nested.py``): this core checks the parent, depth and count, reserves ids,
        and awaits the host's answer (at most :data:`NESTED_PLAN_TIMEOUT_S`) like any other host
        call, so a slow or hostile prompt delays no other caller.
        """
        parent = self._get(parent_job_id)
        parent_spec = self._specs.get(parent_job_id)
        host = self.hosts.host_of(parent_job_id)
        if parent.state is not JobState.RUNNING or parent_spec is None or host is None:
            raise UsageError(
                f"job {parent_job_id} is {parent.state}; only a running clone can spawn subagents"
            )
        meta = self._batch_meta[parent.batch_id]
        req = _child_request(request, parent, meta.config)
        batch_id, job_ids = self.reserve_ids(check_count(req.count, meta.config))
        plan = NestedPlan(
            request=req,
            config=meta.config,
            batch_id=batch_id,
            job_ids=tuple(job_ids),
            caller_cwd=parent_spec.cwd,
            caller_tools=parent_spec.tools,
            catalog=meta.catalog,
            skills=meta.skills,
            project_path=meta.project_path or parent_spec.cwd,
            subagents_dirs=meta.subagents_dirs,
        )
        try:
            try:
                async with asyncio.timeout(NESTED_PLAN_TIMEOUT_S):
                    specs = check_planned(await host.plan(plan), plan)
            except TimeoutError:
                raise TemplateError(
                    f"the subagent's prompt was not rendered within {NESTED_PLAN_TIMEOUT_S:g} s"
                    f" on clone host {host.host_id}",
                    "template-limit",
                ) from None
            if parent.state is not JobState.RUNNING:
                raise UsageError(f"job {parent_job_id} ended while its subagents were planned")
        except BaseException:
            for job_id in job_ids:
                self._reserved_ids.pop(job_id, None)
            raise
        return self.submit(
            replace(
                meta, batch_id=batch_id, specs=specs, clones_per_actor=None, max_concurrency=None
            )
        )

    def _get(self, job_id: str) -> JobRecord:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJobError(job_id)
        return rec

    def _expand(self, ids: Sequence[str]) -> list[str]:
        out: list[str] = []
        for ident in ids:
            if ident in self._batches:
                out.extend(self._batches[ident])
            else:
                out.append(self._get(ident).job_id)
        return out

    async def job_status(self, job_id: str) -> api.JobStatus:
        return self._get(job_id).status()

    async def job_result(self, job_id: str) -> api.RunRecord:
        rec = self._get(job_id)
        if not rec.is_terminal:
            raise UsageError(
                f"job {job_id} is still {rec.state}; wait for it (`job_block`) or poll `job_status`"
            )
        return rec.run_record()

    async def job_cancel(self, job_id: str) -> api.JobStatus:
        rec = self._get(job_id)
        await self.cancel_many([job_id])
        return rec.status()

    async def cancel_many(self, ids: Sequence[str]) -> int:
        """Cancel with one call per host; queued jobs end ``cancelled`` at once."""
        todo, seen = self._expand(ids), set()
        per_host: dict[str, tuple[HostLike, list[str]]] = {}
        while todo:
            job_id = todo.pop()
            if job_id in seen:
                continue
            seen.add(job_id)
            todo.extend(self._children.get(job_id, []))
            rec = self.jobs[job_id]
            host = self.hosts.host_of(job_id)
            if rec.state is JobState.RESERVED:
                self._end(rec, JobState.CANCELLED, StopReason.CANCELLED)
            elif rec.state is JobState.RUNNING and host is not None:
                per_host.setdefault(host.host_id, (host, []))[1].append(job_id)
        for host, job_ids in per_host.values():
            try:
                await host.cancel(job_ids)
            except ClusterError as exc:
                for job_id in job_ids:
                    self._crash(job_id, str(exc))
        return sum(len(j) for _, j in per_host.values())

    async def job_block(
        self, job_ids: Sequence[str], wait_seconds: Seconds = None, timeout_seconds: Seconds = None
    ) -> api.BlockResult:
        ids = self._expand(job_ids)
        limits = [x for x in (wait_seconds, timeout_seconds) if x is not None]
        await self._until_terminal(ids, min(limits, default=LONGEST_WAIT_S))
        statuses = [self.jobs[j].status() for j in ids]
        return {"done": all(s["status"] in TERMINAL for s in statuses), "jobs": statuses}

    async def _until_terminal(self, ids: Sequence[str], limit_s: float) -> list[str]:
        """Wait until none of ``ids`` is pending or ``limit_s`` passed; returns those pending.

        Wakes once per batch of job endings (not per event), and re-checks only what was still
        pending, so waiting on 10,000 jobs costs little.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        pending = [j for j in ids if not self.jobs[j].is_terminal]
        while pending:
            left = deadline - loop.time()
            if left <= 0:
                break
            await self._ended.wait(left)
            pending = [j for j in pending if not self.jobs[j].is_terminal]
        return pending

    async def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        return len(await self._until_terminal(self._expand(ids), wait_seconds))

    def capacity(self) -> api.Capacity:
        # Queues keep jobs cancelled while they waited until the pump takes them: not queued.
        queued = sum(self.jobs[j].state is JobState.RESERVED for j in chain(*self._queues.values()))
        return {"running": self._running, "max_concurrency": self.max_concurrency, "queued": queued}

    async def list_jobs(self, **filters: Unpack[api.JobFilter]) -> api.JobListing:
        status, batch = filters.get("status"), filters.get("batch")
        agent, parent = filters.get("agent"), filters.get("parent")
        rows = [
            r.status()
            for r in self.jobs.values()
            if (status is None or r.state == status)
            and (batch is None or r.batch_id == batch)
            and (agent is None or r.agent == agent)
            and (parent is None or r.parent == parent)
        ]
        return {"jobs": rows, "capacity": self.capacity()}

    async def expand(self, ids: Sequence[str]) -> list[str]:
        return self._expand(ids)

    async def events(
        self, target: api.Target = None, **query: Unpack[api.EventQuery]
    ) -> api.EventPage:
        ids = set(self._expand([target])) if target else None
        cursor, level = query.get("cursor", 0), query.get("level", "lifecycle")
        return await self._log.read(ids, cursor, level, query.get("wait_s", 0.0))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hosts.aclose()


def _child_request(request: dict[str, Any], parent: JobRecord, config: Config) -> BatchRequest:
    """The batch a ``subagent`` call asks for, one level below its parent.

    Raises:
        UsageError: the child would be deeper than ``limits.max_depth``.
    """
    depth = parent.depth + 1
    if depth > config.limits.max_depth:
        raise UsageError(
            f"nesting depth {depth} exceeds limits.max_depth ({config.limits.max_depth}); "
            "finish the task without another subagent"
        )
    return BatchRequest(
        agent=str(request.get("subagent_type") or "_default"),
        prompt=str(request.get("prompt", "")),
        count=request.get("count", 1),
        model=request.get("model_override"),
        cwd=request.get("cwd"),
        parent=parent.job_id,
        depth=depth,
    )
