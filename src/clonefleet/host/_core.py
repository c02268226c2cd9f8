"""Clone hosting: many clones as concurrent loops in one process (no Ray here).

:class:`HostCore` runs each clone of a :class:`CloneSpec` as its own asyncio task with its own
context, failover cursor and lifecycle, sharing one :class:`ProviderPool` (and so one HTTP
connection pool) across them. Events of every clone collect in one buffer that the scheduler
drains; a clone's final event carries its :class:`RunResult`.

After each turn but its last, a clone hands over a checkpoint (``_checkpoint``). The host keeps
the latest one per job and ships it with :meth:`HostCore.drain` at most once per the batch's
``durability.checkpoint_interval_s`` (each one when that is 0); a job's final event drops its
pending checkpoint, so none ever follows it.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import os
import pickle
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from clonefleet.admission import HostGates, SyncSource
from clonefleet.clone import Candidate, Clone, CloneSpec, McpManager, RunResult, pack_state
from clonefleet.config import Config, McpServerConfig
from clonefleet.control import JobControl
from clonefleet.errors import ModelHTTPError
from clonefleet.host._model_pool import ProviderPool
from clonefleet.providers import SimScript
from clonefleet.vocab import EventType, JobState, Outcome, StopReason, stop_error

__all__ = ["HostCore"]

DRAIN_MAX_EVENTS = 20_000
"""Events one drain returns at most."""

_FINAL = str(EventType.FINAL)
_FAILOVER = str(EventType.MODEL_FAILOVER)
_RATE_LIMITED = str(EventType.RATE_LIMITED)
_CHECKPOINT = str(EventType.CHECKPOINT)
_RESULT = str(EventType.RESULT)


class HostCore:
    """Runs clones as tasks and buffers their events for the scheduler.

    A host outlives batches: each ``start`` names its batch's config and simulation script, and
    clones of batches with the same pair share one :class:`ProviderPool` (one HTTP pool).

    Args:
        control: job control for clones whose definition allows spawning subagents.
        max_buffer: events held between drains; past it, new non-final events are dropped (a
            job's final event never is; a checkpoint waits for the next drain).
        clock: monotonic clock of the checkpoint interval, injected for tests.
        drain_every_s: least time between the ends of two drains: a drain that comes sooner
            waits out the rest first, so events ship in batches of that period's worth rather
            than one actor call per handful of events (each call costs both processes CPU).
    """

    def __init__(
        self,
        *,
        control: JobControl | None = None,
        max_buffer: int = 200_000,
        clock: Callable[[], float] = time.monotonic,
        drain_every_s: float = 0.0,
        admission: SyncSource | None = None,
    ) -> None:
        self._drain_every_s = drain_every_s
        self._drained_at = float("-inf")
        self._pools: dict[str, ProviderPool] = {}
        self.gates = HostGates(f"{os.getpid()}-{uuid.uuid4().hex[:8]}", admission)
        """Admission of this host's model requests: through the fleet's limiter when
        ``admission`` reaches one, else the host's own (docs/rate-limits.md)."""
        self.mcp = McpManager()
        """The MCP servers of this host, shared by all its clones (started on first need)."""
        self.control = control
        self._tasks: dict[str, asyncio.Task[RunResult]] = {}
        self._clones: dict[str, Clone] = {}
        self._events: list[dict[str, Any]] = []
        self._wakeup = asyncio.Event()
        self._max_buffer = max_buffer
        self._cancelled_early: set[str] = set()
        self._render_thread: ThreadPoolExecutor | None = None
        self._clock = clock
        self._interval: dict[str, float] = {}
        """Checkpoint interval of each running job (its batch's config)."""
        self._dirty: dict[str, dict[str, Any]] = {}
        """The latest checkpoint event of each job not shipped yet."""
        self._due_at: dict[str, float] = {}
        """When each job's pending checkpoint is due (``clock()`` time)."""
        self._due: list[tuple[float, str]] = []
        """``(due, job)`` of the pending checkpoints, soonest first: a drain ships the due ones
        without reading the rest (thousands of clones of a host each hold one, and most end
        before theirs is due). An entry whose job has shipped or ended since is skipped."""
        self._mail: dict[str, list[tuple[str, str]]] = {}
        """Messages for each clone here, taken at its next turn boundary (see :meth:`deliver`)."""

    def _push(self, job_id: str, event: dict[str, Any]) -> None:
        if event["type"] == _FINAL:
            # The result supersedes any checkpoint: none may follow it.
            self._mail.pop(job_id, None)  # its job ended first: the inbox says undelivered
            for table in (self._dirty, self._interval, self._due_at):
                table.pop(job_id, None)
        elif event["type"] == _RESULT or len(self._events) >= self._max_buffer:
            # The clone's own `result` event stays here: its job's final event carries the
            # whole record, and the scheduler logs the one terminal event itself from that.
            return
        elif event["type"] == _CHECKPOINT and isinstance(event["state"], dict):
            event["state"] = pack_state(event["state"])  # only a shipped one is packed
        self._events.append({"job_id": job_id, "event": event})
        self._wakeup.set()

    def _hold(self, job_id: str, state: dict[str, Any]) -> None:
        """Keep a clone's checkpoint for the next drain, or push it now with interval 0."""
        event = {"type": _CHECKPOINT, "ts": time.time(), "state": state}
        if (
            self._interval.get(job_id) == 0.0
            and job_id not in self._dirty
            and len(self._events) < self._max_buffer
        ):
            self._push(job_id, event)
        else:
            if job_id not in self._dirty:  # pending since now
                due = self._due_at[job_id] = self._clock() + self._interval.get(job_id, 0.0)
                heapq.heappush(self._due, (due, job_id))
            self._dirty[job_id] = event  # a newer one keeps the older one's place and age

    def _ship_checkpoints(self) -> None:
        """Move the checkpoints pending for at least their interval into the buffer, while it
        has room. A clone that ends within its interval never ships one (its result supersedes
        it), so short runs cost nothing; a long run ships its latest every interval.
        """
        now, due = self._clock(), self._due
        while due and due[0][0] <= now:
            if len(self._events) >= self._max_buffer:
                return  # the rest ship at a later drain
            at, job_id = heapq.heappop(due)
            if self._due_at.get(job_id) == at:
                del self._due_at[job_id]
                self._push(job_id, self._dirty.pop(job_id))

    def pool_for(self, config: Config, sim_script: SimScript | None) -> ProviderPool:
        """The provider pool of a (config, script) pair, made on first use."""
        key = hashlib.blake2b(
            pickle.dumps((config.model_dump_json(), sim_script)), digest_size=16
        ).hexdigest()
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ProviderPool(config, sim_script=sim_script, gates=self.gates)
        return pool

    def start(
        self,
        specs: Sequence[CloneSpec],
        config: Config,
        sim_script: SimScript | None = None,
        resume: Mapping[str, dict[str, Any]] | None = None,
    ) -> int:
        """Start one task per spec; returns at once, with how many specs were given.

        A spec whose job id has an entry in ``resume`` resumes from that checkpoint (see
        :class:`Clone`); a malformed one starts afresh with a warning.
        """
        pool = self.pool_for(config, sim_script)
        checkpoints = resume or {}
        for spec in specs:
            if spec.job_id in self._tasks:
                continue
            if spec.job_id in self._cancelled_early:
                # The cancel overtook the start (calls to an async actor are not ordered).
                self._push(
                    spec.job_id,
                    {"type": _FINAL, "ts": time.time(), "result": _cancelled(spec).to_json()},
                )
                continue
            self._interval[spec.job_id] = config.durability.checkpoint_interval_s
            task = self._tasks[spec.job_id] = asyncio.get_running_loop().create_task(
                self._run(spec, pool, checkpoints.get(spec.job_id), config.mcp_servers),
                name=spec.job_id,
            )
            task.add_done_callback(self._ends_cancelled(spec))
        return len(specs)

    def _ends_cancelled(self, spec: CloneSpec) -> Callable[[asyncio.Task[RunResult]], None]:
        return lambda task: self._cancelled_unstarted(spec, task)

    def _cancelled_unstarted(self, spec: CloneSpec, task: asyncio.Task[RunResult]) -> None:
        # A task cancelled before its first step never ran `_run`, which reports every other
        # end: its job must still end (a cancel may follow a start at once, as a budget stop's
        # does).
        if task.cancelled():
            result = _cancelled(spec).to_json()
            self._push(spec.job_id, {"type": _FINAL, "ts": time.time(), "result": result})

    async def _run(
        self,
        spec: CloneSpec,
        pool: ProviderPool,
        resume: Mapping[str, Any] | None,
        servers: Mapping[str, McpServerConfig] | None = None,
    ) -> RunResult:
        def emit(event: dict[str, Any], job_id: str = spec.job_id) -> None:
            self._push(job_id, event)

        async def checkpoint(state: dict[str, Any], job_id: str = spec.job_id) -> None:
            self._hold(job_id, state)

        async def inbox(job_id: str = spec.job_id) -> list[tuple[str, str]]:
            return self._mail.pop(job_id, [])

        def on_failover(src: str, dst: str, reason: str) -> None:
            emit(
                {
                    "type": _FAILOVER,
                    "ts": time.time(),
                    "from": src,
                    "to": dst,
                    "reason": reason[:500],
                }
            )

        def on_rate_limited(cand: Candidate, err: ModelHTTPError) -> None:
            emit(
                {
                    "type": _RATE_LIMITED,
                    "ts": time.time(),
                    "model": cand.key,
                    "provider": cand.provider,
                    "status": err.status,
                    "retry_after_s": err.retry_after_s,
                }
            )

        try:
            # Only a clone with MCP servers in sight pays for this (and only its first start).
            host_tools = (
                await self.mcp.tools_for(spec, servers or {})
                if servers or spec.mcp_servers
                else None
            )
            clone = Clone(
                spec,
                pool.failover_for(spec, on_failover, on_rate_limited),
                host_tools=host_tools,
                emit=emit,
                checkpoint=checkpoint,
                inbox=inbox,
                control=self.control,
                resume=resume,
                web=pool.web,
            )
            self._clones[spec.job_id] = clone
            result = await clone.run()
        except asyncio.CancelledError:
            result = _cancelled(spec)
        except Exception as exc:  # building the clone failed (bad model name, provider config)
            result = _abnormal(spec, f"{type(exc).__name__}: {exc}")
        finally:
            self._clones.pop(spec.job_id, None)
        emit({"type": _FINAL, "ts": time.time(), "result": result.to_json()})
        return result

    def running_clone(self, job_id: str) -> Clone | None:
        """The clone running job ``job_id`` on this host (``None``: none is, or it ended)."""
        return self._clones.get(job_id)

    def deliver(self, items: Sequence[Mapping[str, Any]]) -> int:
        """Hand messages (``{delivery_id, job_id, text}``) to clones here: each clone takes its
        own, in order, at its next turn boundary, and acknowledges them with a
        ``message_delivered`` event. A message its clone already took is skipped by the clone."""
        waiting: dict[str, set[str]] = {}
        for item in items:
            job_id = str(item["job_id"])
            task = self._tasks.get(job_id)
            if task is not None and task.done():
                continue  # its job ended here: the inbox learns that from the scheduler
            box = self._mail.setdefault(job_id, [])
            seen = waiting.get(job_id)
            if seen is None:
                seen = waiting[job_id] = {d for d, _ in box}
            delivery_id = str(item["delivery_id"])
            if delivery_id not in seen:  # one routed again while it waited is not added twice
                seen.add(delivery_id)
                box.append((delivery_id, str(item["text"])))
        return len(items)

    def cancel(self, job_ids: Sequence[str]) -> list[str]:
        """Cancel running clones; returns the ids that were still running here."""
        hit = []
        for job_id in job_ids:
            task = self._tasks.get(job_id)
            if task is None:
                self._cancelled_early.add(job_id)
                hit.append(job_id)
                continue
            if task.done():
                continue
            clone = self._clones.get(job_id)
            if clone is not None:
                clone.request_cancel()
            task.cancel()
            hit.append(job_id)
        return hit

    async def plan(self, planner: Callable[[], tuple[CloneSpec, ...]]) -> tuple[CloneSpec, ...]:
        """Run ``planner`` (a nested spawn's render, ``planning.NestedPlan``) in this host's one
        render thread, off its event loop, and return what it returns. Why a thread, and why on
        the host: docs/architecture.md#nested-spawns.
        """
        if self._render_thread is None:
            self._render_thread = ThreadPoolExecutor(1, thread_name_prefix="clonefleet-render")
        return await asyncio.get_running_loop().run_in_executor(self._render_thread, planner)

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        """Return buffered events (at most :data:`DRAIN_MAX_EVENTS`), waiting up to ``wait_s``
        for the first one.

        Checkpoints whose interval has passed join the buffer first (and again after the wait).
        A drain within ``drain_every_s`` of the previous one waits out the rest first.
        """
        early = self._drained_at + self._drain_every_s - time.monotonic()
        if early > 0:
            await asyncio.sleep(early)
        self._ship_checkpoints()
        if not self._events:
            self._wakeup.clear()
            try:
                async with asyncio.timeout(wait_s):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
            self._ship_checkpoints()
        out, self._events = self._events[:DRAIN_MAX_EVENTS], self._events[DRAIN_MAX_EVENTS:]
        if not self._events:
            self._wakeup.clear()
        if out:
            self._drained_at = time.monotonic()
        return out

    async def aclose(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for pool in self._pools.values():
            await pool.aclose()
        self._pools.clear()
        await self.gates.aclose()
        await self.mcp.aclose()
        if self._render_thread is not None:
            self._render_thread.shutdown(wait=False, cancel_futures=True)


def _ended(
    spec: CloneSpec, status: JobState, reason: StopReason, outcome: Outcome, detail: str = ""
) -> RunResult:
    return RunResult(
        job_id=spec.job_id,
        batch_id=spec.batch_id,
        agent=spec.agent,
        clone_index=spec.clone_index,
        key=spec.key,
        status=status,
        stop_reason=reason,
        outcome=outcome,
        result=None,
        warnings=spec.warnings,
        error=stop_error(reason, detail),
    )


def _cancelled(spec: CloneSpec) -> RunResult:
    return _ended(spec, JobState.CANCELLED, StopReason.CANCELLED, Outcome.CANCELLED)


def _abnormal(spec: CloneSpec, detail: str) -> RunResult:
    return _ended(spec, JobState.FAILED, StopReason.ABNORMAL, Outcome.FAILURE, detail)
