"""Stopping jobs on purpose: cancelling jobs with their descendants, and stopping a batch whose
usage passed its budget.

:class:`JobStops` is a base class of :class:`~clonefleet.scheduler.SchedulerCore` (and builds
on its read side, ``_queries.py``): queued jobs
end at once, running ones are cancelled in their hosts (one call per host) and end when their
clones stop; the reason a job was stopped for (``cancelled`` or ``budget``) becomes its stop
reason. How a job ends and the pool of slots stay in ``_core.py``.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Sequence
from typing import Any

from clonefleet.errors import ClusterError
from clonefleet.host import HostCalls
from clonefleet.scheduler._hosts import HostPool
from clonefleet.scheduler._queries import JobQueries
from clonefleet.scheduler._state import JobRecord
from clonefleet.vocab import EventType, JobState, StopReason

__all__ = ["JobStops"]

PerHost = dict[str, tuple[HostCalls, list[str]]]
"""Running jobs to cancel, by host: ``host_id -> (host, job ids)``."""


class JobStops(JobQueries):
    """Cancelling jobs and budget stops over the core's job table."""

    hosts: HostPool
    _stop_reasons: dict[str, StopReason]
    """Running jobs asked to stop, and why: a clone that then ends ``cancelled`` ends with this
    reason, and one whose host dies meanwhile ends instead of starting again."""
    _pump_held: bool
    """While set, ending jobs starts no queued ones (see :meth:`_mark`)."""

    def _end(self, rec: JobRecord, state: JobState, reason: StopReason, detail: str = "") -> None:
        raise NotImplementedError

    def _crash(self, job_id: str, detail: str) -> None:
        raise NotImplementedError

    def _pump(self) -> None:
        raise NotImplementedError

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        raise NotImplementedError

    async def cancel_many(self, ids: Sequence[str]) -> int:
        """Cancel with one call per host; queued jobs end ``cancelled`` at once."""
        per_host = self._mark(self._expand(ids), StopReason.CANCELLED)
        await self._cancel_on_hosts(per_host)
        return sum(len(j) for _, j in per_host.values())

    def _mark(self, ids: Sequence[str], reason: StopReason) -> PerHost:
        """End the queued ones of ``ids`` and their descendants now, with ``reason``, and note
        the running ones (returned by host) to cancel. No queued job starts meanwhile: a slot
        one of them frees must not start the next job of a batch being stopped."""
        todo, seen = list(ids), set()
        per_host: PerHost = {}
        held, self._pump_held = self._pump_held, True
        try:
            while todo:
                job_id = todo.pop()
                if job_id in seen:
                    continue
                seen.add(job_id)
                todo.extend(self._children.get(job_id, []))
                rec = self.jobs[job_id]
                host = self.hosts.host_of(job_id)
                if rec.state is JobState.RESERVED:
                    self._end(rec, JobState.CANCELLED, reason)
                elif rec.state is JobState.RUNNING and host is not None:
                    per_host.setdefault(host.host_id, (host, []))[1].append(job_id)
                    self._stop_reasons.setdefault(job_id, reason)
        finally:
            self._pump_held = held
        if not held:
            self._pump()
        return per_host

    async def _cancel_on_hosts(self, per_host: PerHost) -> None:
        for host, job_ids in per_host.values():
            try:
                await host.cancel(job_ids)
            except ClusterError as exc:
                for job_id in job_ids:
                    self._crash(job_id, str(exc))

    def _budget_passed(self, rec: JobRecord, batch_ids: Sequence[str]) -> None:
        """Stop each batch whose budget ``rec``'s usage just passed: its queued jobs (and their
        descendants) end ``cancelled``/``budget`` now, running ones are cancelled."""
        for batch_id in batch_ids:
            budget = self.usage.budgets.get(batch_id)
            event = {"type": str(EventType.BUDGET), "ts": time.time(), "batch_id": batch_id}
            if budget is not None:
                event.update(budget.view())
            self._log.record(rec.job_id, event)
            per_host = self._mark(self._batches.get(batch_id, []), StopReason.BUDGET)
            if per_host:
                self._spawn_task(self._cancel_on_hosts(per_host))
