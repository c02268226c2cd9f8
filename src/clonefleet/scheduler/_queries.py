"""Reading the job table: status, results, waiting, listings and events.

:class:`JobQueries` is the read side of :class:`~clonefleet.scheduler.SchedulerCore`, which
answers these calls through it: nothing here changes a job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Unpack

from clonefleet import control as api
from clonefleet.control import Seconds
from clonefleet.errors import JournalError, UsageError
from clonefleet.scheduler._durable import Durable
from clonefleet.scheduler._events import PAGE_LIMIT, EventLog, Pulse
from clonefleet.scheduler._listing import check_limit
from clonefleet.scheduler._state import TERMINAL, JobRecord
from clonefleet.scheduler._table import JobTable
from clonefleet.scheduler._usage import UsageBook

__all__ = ["LONGEST_WAIT_S", "JobQueries"]

TARGETS_KEPT = 8
"""Batches whose sets of job ids are kept for the next read of their events."""
LONGEST_WAIT_S = 3600.0
"""How long ``job_block`` waits when given no time limit."""


class JobQueries:
    """The read-only half of job control over a job table.

    Args:
        table: the job table.
        usage: the usage ledger (for the totals of a listing).
        log: the event log.
        ended: fired once per batch of job endings.
        durable: the journal (what a caller learns has ended is on disk first).
        capacity: the pool's running and queued counts, as :meth:`JobControl.capacity` says them.
    """

    def __init__(
        self,
        table: JobTable,
        usage: UsageBook,
        log: EventLog,
        ended: Pulse,
        durable: Durable,
        capacity: Callable[[], api.Capacity],
    ) -> None:
        self._table, self._usage, self._log = table, usage, log
        self._ended, self._durable, self._capacity = ended, durable, capacity
        self._targets: dict[str, tuple[list[str], int, set[str]]] = {}
        """The job ids of the batches whose events were read last: the batch's list of ids,
        how many of them the set holds, the set (grown as the batch grows)."""

    def _ids_of(self, target: str) -> set[str]:
        """The job ids a target stands for. A batch's set is kept and grown with the batch
        rather than made again: a feeder reads a growing batch of 100,000 jobs's events many
        times a second (docs/inputs.md). A part taken out again (:meth:`JobTable.unextend`)
        may leave its ids in the set: they never had events."""
        batch = self._table.batch(target)
        if batch is None:
            return set(self._table.expand([target]))
        job_ids = batch.job_ids
        kept = self._targets.pop(target, None)
        if kept is None or kept[0] is not job_ids or kept[1] > len(job_ids):
            kept = (job_ids, 0, set())
        ids = kept[2]
        if kept[1] < len(job_ids):
            ids.update(job_ids[kept[1] :])
        self._targets[target] = (job_ids, len(job_ids), ids)
        while len(self._targets) > TARGETS_KEPT:
            del self._targets[next(iter(self._targets))]
        return ids

    async def job_status(self, job_id: str) -> api.JobStatus:
        return self._table.get(job_id).status()

    async def job_result(self, job_id: str) -> api.RunRecord:
        rec = self._table.get(job_id)
        if not rec.is_terminal:
            raise UsageError(
                f"job {job_id} is still {rec.state}; wait for it (`job_block`) or poll `job_status`"
            )
        await self._durable.commit()  # a result is read only once it is on disk: recorded once
        return rec.run_record()

    async def job_block(
        self, job_ids: Sequence[str], wait_seconds: Seconds = None, timeout_seconds: Seconds = None
    ) -> api.BlockResult:
        limits = [x for x in (wait_seconds, timeout_seconds) if x is not None]
        ids, _, still_open = await self._settle(job_ids, min(limits, default=LONGEST_WAIT_S))
        statuses = [self._table.jobs[j].status() for j in ids if j in self._table.jobs]
        done = not still_open and all(s["status"] in TERMINAL for s in statuses)
        if done:
            await self._durable.commit()  # what the caller learns has ended stays ended
        return {"done": done, "jobs": statuses}

    async def _settle(
        self, idents: Sequence[str], limit_s: float
    ) -> tuple[list[str], list[str], list[str]]:
        """Wait until the jobs of ``idents`` (job and batch ids) have ended and none of its
        batches is open, or ``limit_s`` passed; returns the job ids (a batch's as it has them
        now), those pending and the batches still open.

        An open batch is not done even when every job it has so far has ended: its next part
        or its close (both wake the waiters) may come; its new jobs are then waited for too.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        ids = self._table.expand(idents)
        pending = await self._until_terminal(ids, limit_s)
        still_open = self._open_in(idents)
        while still_open and not pending and (left := deadline - loop.time()) > 0:
            await self._ended.wait(left)
            ids = self._table.expand(idents)
            pending = await self._until_terminal(ids, max(deadline - loop.time(), 0.0))
            still_open = self._open_in(idents)
        return ids, pending, still_open

    def _open_in(self, idents: Sequence[str]) -> list[str]:
        """The batch ids of ``idents`` whose batch may still take parts."""
        out = []
        for ident in idents:
            batch = self._table.batch(ident)
            if batch is not None and batch.open:
                out.append(ident)
        return out

    async def _until_terminal(self, ids: Sequence[str], limit_s: float) -> list[str]:
        """Wait until none of ``ids`` is pending or ``limit_s`` passed; returns those pending.

        Wakes once per batch of job endings (not per event). An ended job never runs again, so
        each wake moves past the ended jobs at the front of the pending list and stops at the
        first one still running: jobs end in about the order they started, and waiting on
        10,000 jobs reads each about once, not once per wake.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        pending = [j for j in ids if not self._table.jobs[j].is_terminal]
        at = 0
        while at < len(pending):
            left = deadline - loop.time()
            if left <= 0:
                break
            await self._ended.wait(left)
            at = self._first_pending(pending, at)
        return [j for j in pending[at:] if self._first_pending([j], 0) == 0]

    def _first_pending(self, pending: list[str], at: int) -> int:
        """The index of the first job of ``pending`` from ``at`` on that has not ended (one no
        longer in the table, evicted meanwhile, has ended)."""
        jobs, end = self._table.jobs, len(pending)
        while at < end:
            rec = jobs.get(pending[at])
            if rec is not None and not rec.is_terminal:
                break
            at += 1
        return at

    async def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        """How many of the jobs have not ended; an open batch counts one more until it is
        closed (it is not done while more parts may come)."""
        _, pending, still_open = await self._settle(ids, wait_seconds)
        return len(pending) + len(still_open)

    async def list_jobs(self, **filters: Unpack[api.JobFilter]) -> api.JobListing:
        rows, next_cursor = self._table.page(filters)
        return {
            "jobs": [r.status() for r in rows],
            "capacity": self._capacity(),
            "totals": self._totals(rows, filters.get("batch")),
            "next_cursor": next_cursor,
        }

    def _totals(self, rows: Sequence[JobRecord], batch: str | None = None) -> api.UsageTotals:
        """The fleet's usage totals, and those of ``batch`` or else of each batch in ``rows``."""
        wanted = [batch] if batch is not None else dict.fromkeys(r.batch_id for r in rows)
        views = {b: self._usage.batch_view(b, self._jobs_in(b)) for b in wanted}
        batches = {}
        for batch_id, view in views.items():
            if view is not None:
                record = self._table.batch(batch_id)
                batches[batch_id] = {**view, "open": record is not None and record.open}
        return {"fleet": self._usage.fleet().view(), "batches": batches}

    def _jobs_in(self, batch_id: str) -> int:
        batch = self._table.batch(batch_id)
        return len(batch.job_ids) if batch is not None else 0

    async def expand(self, ids: Sequence[str]) -> list[str]:
        return self._table.expand(ids)

    async def events(
        self, target: api.Target = None, **query: Unpack[api.EventQuery]
    ) -> api.EventPage:
        ids = self._ids_of(target) if target else None
        cursor, level = query.get("cursor", 0), query.get("level", "lifecycle")
        limit = check_limit(query.get("limit"), PAGE_LIMIT) or PAGE_LIMIT
        while cursor < (base := self._log.base):
            # Spilled events are read back from the journal: every one of them on disk first
            # (a spill while this waited counts too), else the page would skip those in flight.
            try:
                await self._durable.commit()
            except JournalError:
                break  # a failing journal: read what it holds
            if self._log.base == base:
                break
        return await self._log.read(ids, cursor, level, query.get("wait_s", 0.0), limit)
