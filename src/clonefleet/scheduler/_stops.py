"""Stopping jobs on purpose: cancelling jobs with their descendants, and stopping a batch whose
usage passed its budget.

:class:`JobStops` is the part of :class:`~clonefleet.scheduler.SchedulerCore` that stops jobs
(the core holds one and answers ``cancel_many`` through it): queued jobs end at once, running
ones are cancelled in their hosts (one call per host) and end when their clones stop; the reason
a job was stopped for (``cancelled`` or ``budget``) becomes its stop reason. How a job ends and
the pool of slots stay in ``_core.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from typing import Any

from clonefleet.errors import ClusterError
from clonefleet.host import HostCalls
from clonefleet.scheduler._hosts import HostPool
from clonefleet.scheduler._state import JobRecord
from clonefleet.scheduler._table import JobTable
from clonefleet.scheduler._usage import UsageBook
from clonefleet.vocab import EventType, JobState, StopReason

__all__ = ["JobStops", "PerHost"]

PerHost = dict[str, tuple[HostCalls, list[str]]]
"""Running jobs to cancel, by host: ``host_id -> (host, job ids)``."""


End = Callable[[JobRecord, JobState, StopReason], None]
"""Ends a job that will not report its own end, with a state and a stop reason."""


class JobStops:
    """Cancelling jobs and budget stops over the core's job table; keeps why each running job
    was asked to stop.

    Args:
        table: the job table.
        hosts: the host pool (where each running job runs).
        usage: the usage ledger (the budgets).
        end: ends a queued job (the core's).
        crash: ends a job whose host failed, with a detail (the core's).
        paused: holds the core's pump while jobs are ended (see :meth:`mark`).
        spawn: runs a coroutine as a background task of the scheduler.
        record: logs one event of a job.
    """

    def __init__(
        self,
        table: JobTable,
        hosts: HostPool,
        usage: UsageBook,
        *,
        end: End,
        crash: Callable[[str, str], None],
        paused: Callable[[], AbstractContextManager[None]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        record: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self._table, self._hosts, self._usage = table, hosts, usage
        self._end, self._crash, self._paused = end, crash, paused
        self._spawn, self._record = spawn, record
        self._reasons: dict[str, StopReason] = {}
        """Running jobs asked to stop, and why: a clone that then ends ``cancelled`` ends with
        this reason, and one whose host dies meanwhile ends instead of starting again."""

    def reason_of(self, job_id: str) -> StopReason | None:
        """Why a running job was asked to stop (``None``: it was not)."""
        return self._reasons.get(job_id)

    def take_reason(self, job_id: str) -> StopReason | None:
        """:meth:`reason_of` for a job that ends now (forgotten after)."""
        return self._reasons.pop(job_id, None)

    async def cancel_many(self, ids: Sequence[str]) -> int:
        """Cancel with one call per host; queued jobs end ``cancelled`` at once."""
        per_host = self.mark(self._table.expand(ids), StopReason.CANCELLED)
        await self._cancel_on_hosts(per_host)
        return sum(len(j) for _, j in per_host.values())

    def mark(self, ids: Sequence[str], reason: StopReason) -> PerHost:
        """End the queued ones of ``ids`` and their descendants now, with ``reason``, and note
        the running ones (returned by host) to cancel. No queued job starts meanwhile: a slot
        one of them frees must not start the next job of a batch being stopped."""
        todo, seen = list(ids), set()
        per_host: PerHost = {}
        unplaced: dict[str, HostCalls] = {}
        with self._paused():
            while todo:
                job_id = todo.pop()
                if job_id in seen:
                    continue
                seen.add(job_id)
                todo.extend(self._table.children_of(job_id))
                rec = self._table.jobs[job_id]
                host = self._hosts.host_of(job_id)
                if rec.state is JobState.RESERVED:
                    self._end(rec, JobState.CANCELLED, reason)
                elif (
                    rec.state is JobState.RUNNING
                    and host is not None
                    and not self._hosts.is_placed(host)
                    and not self._hosts.has_started(host, job_id)
                ):
                    # Its host still waits for a node: nothing runs yet, so it ends now.
                    self._end(rec, JobState.CANCELLED, reason)
                    unplaced[host.host_id] = host
                elif rec.state is JobState.RUNNING and host is not None:
                    per_host.setdefault(host.host_id, (host, []))[1].append(job_id)
                    self._reasons.setdefault(job_id, reason)
        for host in unplaced.values():
            self._hosts.drop_if_unused(host)
        return per_host

    async def _cancel_on_hosts(self, per_host: PerHost) -> None:
        for host, job_ids in per_host.values():
            try:
                await host.cancel(job_ids)
            except ClusterError as exc:
                for job_id in job_ids:
                    self._crash(job_id, str(exc))

    def budget_passed(self, rec: JobRecord, batch_ids: Sequence[str]) -> None:
        """Stop each batch whose budget ``rec``'s usage just passed: its queued jobs (and their
        descendants) end ``cancelled``/``budget`` now, running ones are cancelled."""
        for batch_id in batch_ids:
            budget = self._usage.budgets.get(batch_id)
            event = {"type": str(EventType.BUDGET), "ts": time.time(), "batch_id": batch_id}
            if budget is not None:
                event.update(budget.view())
            self._record(rec.job_id, event)
            per_host = self.mark(self._table.batch_job_ids.get(batch_id, ()), StopReason.BUDGET)
            if per_host:
                self._spawn(self._cancel_on_hosts(per_host))
