"""The scheduler core: job table, the pool of slots, host assignment and the event log.

:class:`SchedulerCore` is plain async Python; it reaches clone hosts only through the small
:class:`HostLike` protocol, so tests drive it with in-process hosts and the Ray shell gives it
actor-backed ones. It owns which job runs where and when; it never renders or loads
definitions (the client does that before submitting, so nothing starts on a render error).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ..actors import CloneSpec, JobControl, crashed_result
from ..vocab import EventType
from ..config import Config
from ..definitions import Catalog, SkillCatalog
from ..errors import ClusterError, IdCollision, UnknownJobError, UsageError
from ..providers import SimScript
from ._state import TERMINAL, JobRecord, JobState, display_name, new_batch_id, new_job_id

__all__ = [
    "BatchSubmission",
    "HostFactory",
    "HostLike",
    "LEVELS",
    "SchedulerCore",
    "choose_clones_per_actor",
]

LEVELS: dict[str, frozenset[str]] = {
    "lifecycle": frozenset(
        {
            "queued",
            "started",
            "progress",
            "result",
            "error",
            "model_failover",
            "message_delivered",
            "compaction",
        }
    ),
}
LEVELS["tools"] = LEVELS["lifecycle"] | {"tool_call_start", "tool_call_end"}
LEVELS["all"] = LEVELS["tools"] | {"assistant", "usage"}


class HostLike(Protocol):
    """What the core needs of a clone host."""

    host_id: str

    async def start(
        self, specs: Sequence[CloneSpec], config: Config, sim_script: SimScript | None
    ) -> int: ...
    async def cancel(self, job_ids: Sequence[str]) -> list[str]: ...
    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]: ...
    async def close(self) -> None: ...


HostFactory = Callable[[str, JobControl], HostLike]
"""Makes a host for ``(host_id, control)``; ``control`` is the in-process job control of this
core (an actor-backed host reaches the scheduler actor by name instead)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSubmission:
    """A fully rendered batch, ready to start."""

    batch_id: str
    specs: tuple[CloneSpec, ...]
    config: Config
    sim_script: SimScript | None = None
    clones_per_actor: int | None = None
    """Clones per host actor; ``None`` = chosen automatically."""
    max_concurrency: int | None = None
    """Jobs of this batch running at once; ``None`` = no per-batch cap."""
    subagents_dirs: tuple[str, ...] = ()
    """``--subagents-dir`` entries, reused when a clone of this batch spawns subagents."""
    project_path: str | None = None
    """The submitting caller's directory (where ``.clonefleet/subagents/`` is looked up)."""
    catalog: Catalog | None = None
    """The caller's definitions as loaded at submission: nested spawns of this batch use them,
    so a remote cluster never needs the caller's files."""
    skills: SkillCatalog | None = None
    """The caller's skills, likewise."""


class CoreControl:
    """In-process :class:`JobControl` over a core (used by in-process hosts)."""

    def __init__(self, core: SchedulerCore) -> None:
        self.core = core

    async def spawn(self, request: dict[str, Any], parent_job_id: str) -> dict[str, Any]:
        return await self.core.spawn_nested(request, parent_job_id)

    async def job_status(self, job_id: str) -> dict[str, Any]:
        return self.core.job_status(job_id)

    async def job_result(self, job_id: str) -> dict[str, Any]:
        return self.core.job_result(job_id)

    async def job_cancel(self, job_id: str) -> dict[str, Any]:
        return await self.core.job_cancel(job_id)

    async def job_block(
        self, job_ids: list[str], wait_seconds: float | None, timeout_seconds: float | None
    ) -> dict[str, Any]:
        return await self.core.job_block(job_ids, wait_seconds, timeout_seconds)

    async def list_jobs(self, **filters: Any) -> dict[str, Any]:
        return self.core.list_jobs(**filters)


def choose_clones_per_actor(count: int, cpus: int, nodes: int = 1) -> int:
    """Clones per host: enough hosts to use every CPU (and every node), few enough that a
    batch of thousands does not pay a Python process per clone."""
    hosts = max(min(count, max(cpus, nodes, 1)), 1)
    return max(math.ceil(count / hosts), 1)


class SchedulerCore:
    """Owns the job table and runs batches on clone hosts.

    Args:
        host_factory: makes a host for ``(host_id, control)``.
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
        self._factory = host_factory
        self.max_concurrency, self.cpus, self.nodes = max_concurrency, cpus, nodes
        self.jobs: dict[str, JobRecord] = {}
        self._reserved_ids: dict[str, str] = {}
        """Job ids handed out by :meth:`reserve_ids` but not yet submitted, to their batch id."""
        self._specs: dict[str, CloneSpec] = {}
        self._job_host: dict[str, HostLike] = {}
        self._host_jobs: dict[str, set[str]] = {}
        self._queues: dict[str, deque[str]] = {}
        self._batch_cap: dict[str, int | None] = {}
        self._batch_running: dict[str, int] = {}
        self._batches: dict[str, list[str]] = {}
        self._batch_meta: dict[str, BatchSubmission] = {}
        self.control = CoreControl(self)
        self._children: dict[str, list[str]] = {}
        self._running = 0
        self._log: list[tuple[frozenset[str], str, dict[str, Any]]] = []
        self._tick = asyncio.Event()
        self._done_tick = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._host_seq = 0
        self._idle: list[HostLike] = []
        self._draining: set[str] = set()
        self._host_open: dict[str, int] = {}
        """Unfinished jobs per host: its drain loop runs while this is above zero."""
        self._dead: set[str] = set()
        self.warm_hosts = 0
        """Idle hosts kept for the next batches (``warm`` sets it)."""

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

    def submit(self, sub: BatchSubmission) -> dict[str, Any]:
        """Record every job of the batch as ``reserved``, assign hosts and start what the caps allow.

        Ids may come from :meth:`reserve_ids` or be drawn by the client (which renders before it
        reaches the cluster); either way none may be in use already.

        Raises:
            UsageError: an empty batch.
            IdCollision: the batch id or a job id is already in use.
        """
        if not sub.specs:
            raise UsageError("a batch needs at least one clone")
        if sub.batch_id in self._batches:
            raise IdCollision(sub.batch_id)
        seen: set[str] = set()
        for spec in sub.specs:
            if spec.job_id in seen:
                raise IdCollision(spec.job_id)
            seen.add(spec.job_id)
        for spec in sub.specs:
            if (
                spec.job_id in self.jobs
                or self._reserved_ids.get(spec.job_id, sub.batch_id) != sub.batch_id
            ):
                raise IdCollision(spec.job_id)
        self._batches[sub.batch_id] = [s.job_id for s in sub.specs]
        self._batch_meta[sub.batch_id] = replace(sub, specs=())
        self._batch_cap[sub.batch_id] = sub.max_concurrency
        self._batch_running[sub.batch_id] = 0
        self._queues[sub.batch_id] = deque()
        for spec in sub.specs:
            self._reserved_ids.pop(spec.job_id, None)
            rec = JobRecord(
                job_id=spec.job_id,
                batch_id=spec.batch_id,
                agent=spec.agent,
                clone_index=spec.clone_index,
                clone_count=spec.clone_count,
                parent=spec.parent,
                depth=spec.depth,
                model=spec.candidates[spec.start % len(spec.candidates)]
                if spec.candidates
                else None,
                warnings=list(spec.warnings),
            )
            self.jobs[spec.job_id] = rec
            self._specs[spec.job_id] = spec
            self._queues[sub.batch_id].append(spec.job_id)
            if spec.parent:
                self._children.setdefault(spec.parent, []).append(spec.job_id)
            self._record(spec.job_id, {"type": "queued", "ts": time.time()})
        self._assign_hosts(sub)
        self._pump()
        return {"batch_id": sub.batch_id, "job_ids": [s.job_id for s in sub.specs]}

    def _assign_hosts(self, sub: BatchSubmission) -> None:
        per = sub.clones_per_actor or choose_clones_per_actor(len(sub.specs), self.cpus, self.nodes)
        for start in range(0, len(sub.specs), per):
            chunk = sub.specs[start : start + per]
            self._bind(self._acquire_host(), [s.job_id for s in chunk])

    def _new_host(self) -> HostLike:
        self._host_seq += 1
        return self._factory(f"h{self._host_seq}", self.control)

    def _acquire_host(self) -> HostLike:
        """A warm idle host when there is one (no process start, imports done), else a new one."""
        return self._idle.pop() if self._idle else self._new_host()

    def _bind(self, host: HostLike, job_ids: Sequence[str]) -> None:
        jobs = self._host_jobs.setdefault(host.host_id, set())
        jobs.update(job_ids)
        self._host_open[host.host_id] = self._host_open.get(host.host_id, 0) + sum(
            1 for j in job_ids if not self.jobs[j].is_terminal
        )
        for job_id in job_ids:
            self._job_host[job_id] = host
            self.jobs[job_id].host_id = host.host_id
        if host.host_id not in self._draining:
            self._draining.add(host.host_id)
            self._spawn_task(self._drain_loop(host))

    async def warm_ready(self) -> int:
        """Wait until every idle host has started (its process is up, imports done)."""
        ready = 0
        for host in list(self._idle):
            if hasattr(host, "node_id"):
                try:
                    await host.node_id()
                except ClusterError:
                    continue
            ready += 1
        return ready

    def warm(self, count: int) -> None:
        """Start ``count`` idle hosts now, so the next batches skip process start-up."""
        self.warm_hosts = count
        while len(self._idle) < count:
            self._idle.append(self._new_host())

    # -- the pool ------------------------------------------------------------------------
    def _slots_free(self) -> bool:
        return self.max_concurrency is None or self._running < self.max_concurrency

    def _pump(self) -> None:
        """Start queued jobs while slots are free (round-robin over batches)."""
        starts: dict[tuple[str, str], tuple[HostLike, str, list[CloneSpec]]] = {}
        progressed = True
        while progressed and self._slots_free():
            progressed = False
            for batch_id, queue in self._queues.items():
                if not queue or not self._slots_free():
                    continue
                cap = self._batch_cap[batch_id]
                if cap is not None and self._batch_running[batch_id] >= cap:
                    continue
                job_id = queue.popleft()
                rec = self.jobs[job_id]
                if rec.state is not JobState.RESERVED:
                    continue
                rec.move(JobState.RUNNING)
                self._running += 1
                self._batch_running[batch_id] += 1
                host = self._job_host[job_id]
                starts.setdefault((host.host_id, batch_id), (host, batch_id, []))[2].append(
                    self._specs[job_id]
                )
                progressed = True
        for batch_id in [b for b, q in self._queues.items() if not q]:
            del self._queues[batch_id]  # a batch never queues again once its queue is empty
        for host, batch_id, specs in starts.values():
            self._spawn_task(self._start_on(host, specs, self._batch_meta[batch_id]))

    async def _start_on(
        self, host: HostLike, specs: list[CloneSpec], meta: BatchSubmission, retry: bool = True
    ) -> None:
        try:
            # Placement first: once started, a quick host may finish and be gone.
            node = await host.node_id() if hasattr(host, "node_id") else None
            await host.start(specs, meta.config, meta.sim_script)
        except ClusterError as exc:
            self._dead.add(host.host_id)
            if retry:
                # A warm host that died while idle: move its new clones to a fresh host, once.
                fresh = self._new_host()
                ids = [s.job_id for s in specs if not self.jobs[s.job_id].is_terminal]
                self._host_jobs[host.host_id].difference_update(ids)
                self._host_open[host.host_id] -= len(ids)
                self._bind(fresh, ids)
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
    async def _drain_loop(self, host: HostLike) -> None:
        """Pull the host's events until its clones have all ended; then it idles or goes."""
        jobs = self._host_jobs[host.host_id]
        healthy = True
        try:
            while self._host_open.get(host.host_id, 0) > 0:
                try:
                    batch = await host.drain(1.0)
                except ClusterError as exc:
                    healthy = False
                    for job_id in list(jobs):
                        self._crash(job_id, f"clone host {host.host_id} died: {exc}")
                    return
                for item in batch:
                    self._apply(item["job_id"], item["event"])
        finally:
            self._draining.discard(host.host_id)
            jobs.clear()
            self._host_open[host.host_id] = 0
            if healthy and host.host_id not in self._dead and len(self._idle) < self.warm_hosts:
                self._idle.append(host)
            else:
                self._spawn_task(host.close())

    def _apply(self, job_id: str, event: dict[str, Any]) -> None:
        rec = self.jobs.get(job_id)
        if rec is None or rec.is_terminal:
            return
        kind = event["type"]
        if kind == EventType.FINAL:
            self._finish(rec, event["result"])
            return
        if kind == "result":
            return  # the scheduler writes the one terminal event itself (see _finish)
        if kind == "usage":
            rec.turns = event.get("turn", rec.turns)
            rec.model = event.get("model") or rec.model
            for key in ("input_tokens", "output_tokens", "total_tokens"):
                rec.usage[key] = rec.usage.get(key, 0) + int(event.get(key, 0))
        elif kind == "progress":
            rec.progress = event.get("progress")
        elif kind == "model_failover":
            rec.model = event.get("to") or rec.model
        elif kind == "error":
            rec.detail = event.get("detail")
        elif kind == "started":
            rec.model = event.get("model") or rec.model
        self._record(job_id, event)

    def _finish(self, rec: JobRecord, result: dict[str, Any]) -> None:
        was_running = rec.state is JobState.RUNNING
        rec.finish(result)
        if rec.host_id in self._host_open and rec.job_id in self._host_jobs.get(rec.host_id, ()):
            self._host_open[rec.host_id] -= 1
        done, self._done_tick = self._done_tick, asyncio.Event()
        done.set()
        self._record(
            rec.job_id,
            {
                "type": "result",
                "ts": time.time(),
                "status": str(rec.state),
                "stop_reason": rec.stop_reason,
                "outcome": rec.outcome,
                "error": rec.error,
                "record": rec.run_record(),
            },
        )
        self._release(rec, was_running)

    def _crash(self, job_id: str, detail: str) -> None:
        rec = self.jobs[job_id]
        if rec.is_terminal:
            return
        fields = {
            "job_id": job_id,
            "batch_id": rec.batch_id,
            "agent": rec.agent,
            "clone_index": rec.clone_index,
            "model": rec.model,
            "warnings": rec.warnings,
        }
        rec.detail = detail
        self._record(
            job_id,
            {"type": "error", "ts": time.time(), "stop_reason": "abnormal", "detail": detail},
        )
        self._finish(rec, crashed_result(fields, detail))

    def _envelope(self, rec: JobRecord, event: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "subagent_event",
            "parent_session_id": rec.parent or rec.batch_id,
            "subagent_run_id": rec.job_id,
            "subagent_type": rec.agent,
            "display_name": display_name(rec.agent, rec.clone_index),
            "batch_id": rec.batch_id,
            "event": event,
        }

    def _record(self, job_id: str, event: dict[str, Any]) -> None:
        """Log one clone event, wrapped once per ancestor: a grandchild's event arrives inside
        its parent's envelope inside the root job's envelope."""
        rec = self.jobs[job_id]
        env = self._envelope(rec, event)
        chain = [job_id]
        while rec.parent is not None and rec.parent in self.jobs:
            rec = self.jobs[rec.parent]
            chain.append(rec.job_id)
            env = self._envelope(rec, env)
        env["seq"] = len(self._log)
        self._log.append((frozenset(chain), event["type"], env))
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- nested spawns --------------------------------------------------------------------
    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> dict[str, Any]:
        """Start a batch on behalf of a running clone (the ``subagent`` tool).

        The child batch inherits its parent batch's config, simulation script and definition
        directories; its launch directory defaults to the parent's and may not leave it.

        Raises:
            UsageError: parent not running, depth past ``limits.max_depth``, bad count or cwd.
            DefinitionError: unknown agent or render failure (nothing started).
        """
        from ..definitions import load_catalog
        from ._batch import BatchRequest, check_count, plan_specs

        parent = self._get(parent_job_id)
        parent_spec = self._specs.get(parent_job_id)
        if parent.state is not JobState.RUNNING or parent_spec is None:
            raise UsageError(
                f"job {parent_job_id} is {parent.state}; only a running clone can spawn subagents"
            )
        meta = self._batch_meta[parent.batch_id]
        depth = parent.depth + 1
        if depth > meta.config.limits.max_depth:
            raise UsageError(
                f"nesting depth {depth} exceeds limits.max_depth ({meta.config.limits.max_depth}); finish the task without another subagent"
            )
        agent = request.get("subagent_type") or "_default"
        req = BatchRequest(
            agent=str(agent),
            prompt=str(request.get("prompt", "")),
            count=request.get("count", 1),
            model=request.get("model_override"),
            cwd=request.get("cwd"),
            parent=parent_job_id,
            depth=depth,
        )
        catalog = meta.catalog
        if catalog is None:
            project = Path(meta.project_path or parent_spec.cwd)
            catalog = await asyncio.to_thread(
                load_catalog, project, [Path(d) for d in meta.subagents_dirs], meta.config
            )
        batch_id, job_ids = self.reserve_ids(check_count(req.count, meta.config))
        try:
            specs = plan_specs(
                req,
                catalog,
                meta.config,
                batch_id=batch_id,
                job_ids=job_ids,
                caller_cwd=Path(parent_spec.cwd),
                caller_tools=parent_spec.tools,
                skills=meta.skills,
            )
        except Exception:
            for job_id in job_ids:
                self._reserved_ids.pop(job_id, None)
            raise
        sub = replace(
            meta, batch_id=batch_id, specs=specs, clones_per_actor=None, max_concurrency=None
        )
        return self.submit(sub)

    # -- job control ---------------------------------------------------------------------
    def _get(self, job_id: str) -> JobRecord:
        rec = self.jobs.get(job_id)
        if rec is None:
            raise UnknownJobError(job_id)
        return rec

    def expand(self, ids: Sequence[str]) -> list[str]:
        """Job ids, with batch ids replaced by their jobs."""
        out: list[str] = []
        for ident in ids:
            if ident in self._batches:
                out.extend(self._batches[ident])
            else:
                out.append(self._get(ident).job_id)
        return out

    def job_status(self, job_id: str) -> dict[str, Any]:
        return self._get(job_id).status()

    def job_result(self, job_id: str) -> dict[str, Any]:
        """The finished job's ``run --json`` record.

        Raises:
            UsageError: the job has not finished yet.
        """
        rec = self._get(job_id)
        if not rec.is_terminal:
            raise UsageError(
                f"job {job_id} is still {rec.state}; wait for it (`job_block`) or poll `job_status`"
            )
        return rec.run_record()

    async def job_cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job and its descendants; idempotent. Returns the job's status."""
        rec = self._get(job_id)
        await self.cancel_many([job_id])
        return rec.status()

    async def cancel_many(self, ids: Sequence[str]) -> int:
        """Cancel jobs (or batches' jobs) and all their descendants with one call per host.

        Queued jobs end ``cancelled`` at once; running ones are cancelled in their hosts and end
        when their clones have stopped. Idempotent. Returns how many jobs were still unfinished.
        """
        todo, seen = list(self.expand(ids)), set()
        per_host: dict[str, tuple[HostLike, list[str]]] = {}
        while todo:
            job_id = todo.pop()
            if job_id in seen:
                continue
            seen.add(job_id)
            todo.extend(self._children.get(job_id, []))
            rec = self.jobs[job_id]
            if rec.state is JobState.RESERVED:
                self._finish(
                    rec,
                    {
                        "status": "cancelled",
                        "stop_reason": "cancelled",
                        "outcome": "cancelled",
                        "error": "Error: subagent run was cancelled",
                    },
                )
            elif rec.state is JobState.RUNNING:
                host = self._job_host[job_id]
                per_host.setdefault(host.host_id, (host, []))[1].append(job_id)
        for host, job_ids in per_host.values():
            try:
                await host.cancel(job_ids)
            except ClusterError as exc:
                for job_id in job_ids:
                    self._crash(job_id, str(exc))
        return sum(len(j) for _, j in per_host.values())

    async def job_block(
        self,
        job_ids: Sequence[str],
        wait_seconds: float | None = None,
        timeout_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Wait until every job is terminal or the time is up; returns current statuses."""
        ids = self.expand(job_ids)
        await self._until_terminal(
            ids, min(x for x in (wait_seconds, timeout_seconds, 3600.0) if x is not None)
        )
        statuses = [self.jobs[j].status() for j in ids]
        return {"done": all(s["status"] in TERMINAL for s in statuses), "jobs": statuses}

    async def _until_terminal(self, ids: Sequence[str], limit_s: float) -> list[str]:
        """Wait until none of ``ids`` is pending or ``limit_s`` passed; returns those pending.

        Wakes once per batch of job endings (not per event), and re-checks only what was still
        pending, so waiting on 10,000 jobs costs little.
        """
        deadline = time.monotonic() + limit_s
        pending = [j for j in ids if not self.jobs[j].is_terminal]
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            tick = self._done_tick
            try:
                async with asyncio.timeout(left):
                    await tick.wait()
            except TimeoutError:
                pass
            pending = [j for j in pending if not self.jobs[j].is_terminal]
        return pending

    async def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        """How many of ``ids`` (job or batch ids) have not ended, after waiting up to ``wait_seconds``."""
        return len(await self._until_terminal(self.expand(ids), wait_seconds))

    def capacity(self) -> dict[str, Any]:
        queued = sum(len(q) for q in self._queues.values())
        return {"running": self._running, "max_concurrency": self.max_concurrency, "queued": queued}

    def list_jobs(
        self,
        *,
        status: str | None = None,
        batch: str | None = None,
        agent: str | None = None,
        parent: str | None = None,
    ) -> dict[str, Any]:
        rows = [
            r.status()
            for r in self.jobs.values()
            if (status is None or r.state == status)
            and (batch is None or r.batch_id == batch)
            and (agent is None or r.agent == agent)
            and (parent is None or r.parent == parent)
        ]
        return {"jobs": rows, "capacity": self.capacity()}

    async def events(
        self,
        *,
        target: str | None = None,
        cursor: int = 0,
        level: str = "lifecycle",
        wait_s: float = 0.0,
        limit: int = 5000,
    ) -> dict[str, Any]:
        """Events after ``cursor`` for a batch or job (or all), waiting up to ``wait_s`` for one."""
        if level not in LEVELS:
            raise UsageError(f"unknown level {level!r}; use lifecycle, tools or all")
        ids = set(self.expand([target])) if target else None
        deadline = time.monotonic() + wait_s
        while True:
            out, pos = self._scan(ids, cursor, LEVELS[level], limit)
            left = deadline - time.monotonic()
            if out or left <= 0:
                return {"events": out, "cursor": pos}
            cursor = pos
            tick = self._tick
            try:
                async with asyncio.timeout(left):
                    await tick.wait()
            except TimeoutError:
                pass

    def _scan(
        self, ids: set[str] | None, cursor: int, kinds: frozenset[str], limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        out = []
        for pos in range(cursor, len(self._log)):
            chain, kind, env = self._log[pos]
            if (ids is None or not ids.isdisjoint(chain)) and kind in kinds:
                out.append(env)
                if len(out) >= limit:
                    return out, pos + 1
        return out, len(self._log)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        idle, self._idle = self._idle, []
        for host in idle:
            await host.close()
