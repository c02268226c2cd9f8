"""The job table: every job's record and every batch's, changed only through its methods.

:class:`JobTable` is the scheduler's state about jobs: their records, the specs of those not yet
ended, their checkpoints, who spawned whom, the ids handed out for rendering, and one
:class:`BatchRecord` per batch (its jobs, its queue, its cap, how many of its jobs run, its
submission). It knows nothing of hosts, events or the journal; the core
(:class:`~clonefleet.scheduler.SchedulerCore`) decides, the table keeps count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from clonefleet import control as api
from clonefleet.clone import CloneSpec
from clonefleet.errors import IdCollision, UnknownJobError, UsageError
from clonefleet.planning import BatchSubmission, new_batch_id, new_job_id
from clonefleet.scheduler._listing import JobOrder, page_jobs
from clonefleet.scheduler._state import JobRecord
from clonefleet.vocab import JobState

__all__ = ["BatchRecord", "JobTable"]


@dataclass(slots=True)
class BatchRecord:
    """One batch of the table: its jobs, its queue, how many of its jobs run, its submission."""

    job_ids: list[str]
    meta: BatchSubmission | None = None
    """The submission without its specs; ``None`` for a batch restored without it (its jobs
    have all ended, or it could not be read back from the journal)."""
    running: int = 0
    queue: deque[str] = field(default_factory=deque)
    """Its jobs bound to hosts and waiting for a slot, in the order they start."""
    open: bool = False
    """More parts may still come (:meth:`JobTable.extend_batch`): the batch is not done while
    it is open, even when every job it has so far has ended."""
    cancelled: bool = False
    """The batch was cancelled as a whole: it is closed and refuses more parts."""
    parts: int = 1
    """The number the next part gets (its first part is 0; a part refused keeps its number,
    so a journal never holds two parts with one number)."""

    @property
    def cap(self) -> int | None:
        """Most of its jobs that run at once (``None`` = no cap of its own)."""
        return self.meta.max_concurrency if self.meta is not None else None


class _JobIdsView(Mapping[str, Sequence[str]]):
    """Each batch's job ids, read through the batch records."""

    def __init__(self, batches: Mapping[str, BatchRecord]) -> None:
        self._batches = batches

    def __getitem__(self, batch_id: str) -> Sequence[str]:
        return self._batches[batch_id].job_ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


class JobTable:
    """Every job and batch the scheduler knows, and the counts of running and waiting jobs."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobRecord] = {}
        self._batches: dict[str, BatchRecord] = {}
        self._queued_batches: dict[str, BatchRecord] = {}
        """Batches with a queue, in the order they were queued (the pump's round)."""
        self._specs: dict[str, CloneSpec] = {}
        """The spec of each job that has not ended (a restarted clone needs it again)."""
        self._children: dict[str, list[str]] = {}
        self._checkpoints: dict[str, Any] = {}
        """Each running job's latest checkpoint as its host shipped it, packed (``state_of``
        unpacks it); a restarted clone resumes from it."""
        self._reserved: dict[str, str] = {}
        """Job ids handed out by :meth:`reserve_ids` but not yet submitted, to their batch id."""
        self._order = JobOrder()
        self._running = 0
        self._queued = 0
        """Jobs waiting for a slot (``reserved``, with a spec): kept, not counted per call."""
        self.batch_job_ids: Mapping[str, Sequence[str]] = _JobIdsView(self._batches)
        """Each batch's job ids (a read-only view)."""

    # -- reading -------------------------------------------------------------------------
    @property
    def jobs(self) -> Mapping[str, JobRecord]:
        """Every job's record, by id (read-only: records enter and leave through methods)."""
        return self._jobs

    @property
    def running(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def reserved(self) -> Mapping[str, str]:
        """Ids handed out for rendering and not yet submitted, to their batch id."""
        return self._reserved

    @property
    def checkpoints(self) -> Mapping[str, Any]:
        """The latest checkpoint of each running job that sent one."""
        return self._checkpoints

    def get(self, job_id: str) -> JobRecord:
        """The job's record.

        Raises:
            UnknownJobError: no such job.
        """
        rec = self._jobs.get(job_id)
        if rec is None:
            raise UnknownJobError(job_id)
        return rec

    def expand(self, ids: Sequence[str]) -> list[str]:
        """Job ids and batch ids as job ids (a batch id stands for its jobs).

        Raises:
            UnknownJobError: an id that is neither.
        """
        out: list[str] = []
        for ident in ids:
            batch = self._batches.get(ident)
            if batch is not None:
                out.extend(batch.job_ids)
            else:
                out.append(self.get(ident).job_id)
        return out

    def batch(self, batch_id: str) -> BatchRecord | None:
        return self._batches.get(batch_id)

    def batches(self) -> list[tuple[str, BatchRecord]]:
        """Every batch, in the order they entered the table."""
        return list(self._batches.items())

    def spec_of(self, job_id: str) -> CloneSpec | None:
        """The spec of a job that has not ended (``None`` once it has)."""
        return self._specs.get(job_id)

    def checkpoint_of(self, job_id: str) -> Any:
        """The job's latest checkpoint, packed (``None``: none)."""
        return self._checkpoints.get(job_id)

    def children_of(self, job_id: str) -> Sequence[str]:
        return self._children.get(job_id, ())

    def is_waiting(self, job_id: str) -> bool:
        """Whether the job waits for a slot (``reserved`` and not ended)."""
        rec = self._jobs.get(job_id)
        return rec is not None and rec.state is JobState.RESERVED and job_id in self._specs

    def page(self, filters: api.JobFilter) -> tuple[list[JobRecord], str | None]:
        """One page of the job listing (see :func:`~clonefleet.scheduler._listing.page_jobs`)."""
        return page_jobs(
            self._jobs,
            filters,
            order=self._order,
            batches=self.batch_job_ids,
            children=self._children,
        )

    # -- ids and batches -----------------------------------------------------------------
    def reserve_ids(self, count: int) -> tuple[str, list[str]]:
        """Allocate a batch id and ``count`` unique job ids for rendering."""
        batch_id = new_batch_id()
        while batch_id in self._batches:
            batch_id = new_batch_id()
        ids: list[str] = []
        while len(ids) < count:
            job_id = new_job_id()
            if job_id not in self._jobs and job_id not in self._reserved:
                self._reserved[job_id] = batch_id
                ids.append(job_id)
        return batch_id, ids

    def release_ids(self, job_ids: Sequence[str]) -> None:
        """Give back reserved ids whose batch will not be submitted."""
        for job_id in job_ids:
            self._reserved.pop(job_id, None)

    def check_ids(self, sub: BatchSubmission) -> None:
        """Whether the batch may enter the table.

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
            taken = spec.job_id in self._jobs or spec.job_id in seen
            if taken or self._reserved.get(spec.job_id, sub.batch_id) != sub.batch_id:
                raise IdCollision(spec.job_id)
            seen.add(spec.job_id)

    def add_batch(self, sub: BatchSubmission, *, open: bool = False) -> list[JobRecord]:
        """Enter a checked batch (:meth:`check_ids`): each job ``reserved``, waiting; returns
        the new records. An ``open`` batch takes more parts (:meth:`extend_batch`)."""
        self._batches[sub.batch_id] = BatchRecord(
            [s.job_id for s in sub.specs], meta=replace(sub, specs=()), open=open
        )
        return [self._add_job(spec) for spec in sub.specs]

    def check_part(self, sub: BatchSubmission) -> BatchRecord:
        """Whether ``sub`` may join its batch (``sub.batch_id``) as one more part; returns the
        batch.

        Raises:
            UsageError: an empty part; no such batch; the batch was cancelled or is closed.
            IdCollision: a job id is already in use.
        """
        if not sub.specs:
            raise UsageError(f"a part of batch {sub.batch_id} needs at least one clone")
        batch = self._batches.get(sub.batch_id)
        if batch is None:
            raise UsageError(f"no batch {sub.batch_id} to add jobs to (submit it first)")
        if batch.cancelled:
            raise UsageError(f"batch {sub.batch_id} was cancelled: it takes no more jobs")
        if not batch.open:
            raise UsageError(
                f"batch {sub.batch_id} is closed: it takes no more jobs (a batch that grows is"
                " submitted open and takes parts until its last one)"
            )
        seen: set[str] = set()
        for spec in sub.specs:
            taken = spec.job_id in self._jobs or spec.job_id in seen
            if taken or self._reserved.get(spec.job_id, sub.batch_id) != sub.batch_id:
                raise IdCollision(spec.job_id)
            seen.add(spec.job_id)
        return batch

    def extend_batch(self, sub: BatchSubmission) -> list[JobRecord]:
        """Add a checked part (:meth:`check_part`) to its batch: each job ``reserved``,
        waiting; returns the new records (the batch keeps its first part's submission)."""
        batch = self._batches[sub.batch_id]
        batch.job_ids.extend(s.job_id for s in sub.specs)
        batch.parts += 1
        return [self._add_job(spec) for spec in sub.specs]

    def unextend(self, batch_id: str, records: Sequence[JobRecord]) -> None:
        """Take a part added by :meth:`extend_batch` out again (its record could not be kept):
        its jobs leave the table as if never submitted."""
        batch = self._batches[batch_id]
        gone = {r.job_id for r in records}
        batch.job_ids[:] = [j for j in batch.job_ids if j not in gone]
        for rec in records:
            if self.is_waiting(rec.job_id):
                self._queued -= 1
            self._jobs.pop(rec.job_id, None)
            self._specs.pop(rec.job_id, None)
            if rec.parent in self._children:
                self._children[rec.parent] = [
                    c for c in self._children[rec.parent] if c not in gone
                ]
        self._order.forget(len(records), self._jobs)

    def _add_job(self, spec: CloneSpec) -> JobRecord:
        self._reserved.pop(spec.job_id, None)
        rec = self._jobs[spec.job_id] = JobRecord(
            job_id=spec.job_id,
            batch_id=spec.batch_id,
            agent=spec.agent,
            clone_index=spec.clone_index,
            clone_count=spec.clone_count,
            key=spec.key,
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
        return rec

    def forget_batch(self, batch_id: str) -> list[str]:
        """Drop a batch and its jobs from the table (never accepted, or evicted); returns its
        job ids."""
        batch = self._batches.pop(batch_id, None)
        if batch is None:
            return []
        self._queued_batches.pop(batch_id, None)
        ids = batch.job_ids
        parents: set[str] = set()
        for job_id in ids:
            if self.is_waiting(job_id):
                self._queued -= 1
            rec = self._jobs.pop(job_id, None)
            self._specs.pop(job_id, None)
            self._checkpoints.pop(job_id, None)
            self._children.pop(job_id, None)
            if rec is not None and rec.parent in self._children:
                parents.add(rec.parent)
        gone = set(ids)
        for parent in parents:
            self._children[parent] = [c for c in self._children[parent] if c not in gone]
        self._order.forget(len(ids), self._jobs)
        return ids

    # -- a restarted scheduler -----------------------------------------------------------
    def load_batch(self, batch_id: str, recs: Sequence[JobRecord]) -> None:
        """Enter a batch read back from the journal, its jobs as recorded (none waiting; see
        :meth:`set_meta` and :meth:`requeue`)."""
        self._batches[batch_id] = BatchRecord([r.job_id for r in recs])
        for rec in recs:
            self._jobs[rec.job_id] = rec
            self._order.add(rec.job_id)
            if rec.parent:
                self._children.setdefault(rec.parent, []).append(rec.job_id)

    def set_meta(self, sub: BatchSubmission) -> None:
        """Give a loaded batch its submission (without specs), so its jobs can run again."""
        self._batches[sub.batch_id].meta = replace(sub, specs=())

    def requeue(self, rec: JobRecord, spec: CloneSpec, checkpoint: Any = None) -> None:
        """Make a loaded job wait for a slot again (from ``checkpoint``, when it has one)."""
        rec.state, rec.host_id, rec.node = JobState.RESERVED, None, None
        self._specs[rec.job_id] = spec
        self._queued += 1
        if checkpoint is not None:
            self._checkpoints[rec.job_id] = checkpoint

    # -- the pool ------------------------------------------------------------------------
    def waiting_in(self, batch_id: str) -> list[str]:
        """The batch's jobs that wait for a slot."""
        batch = self._batches.get(batch_id)
        return [j for j in batch.job_ids if self.is_waiting(j)] if batch is not None else []

    def enqueue(self, batch_id: str, job_ids: Sequence[str]) -> None:
        """Queue jobs of a batch (already bound to hosts) for the pump."""
        batch = self._batches[batch_id]
        batch.queue.extend(job_ids)
        self._queued_batches[batch_id] = batch

    def take_queued(self, max_running: int | None) -> list[tuple[str, str]]:
        """Move queued jobs to ``running`` while ``max_running`` and each batch's cap allow,
        round-robin over batches; returns ``(batch_id, job_id)`` of each."""
        taken: list[tuple[str, str]] = []
        progressed = True
        while progressed and (max_running is None or self._running < max_running):
            progressed = False
            for batch_id, batch in self._queued_batches.items():
                if max_running is not None and self._running >= max_running:
                    break
                if not batch.queue or (batch.cap is not None and batch.running >= batch.cap):
                    continue
                job_id = batch.queue.popleft()
                progressed = True  # a job taken off the queue, even one that already ended
                rec = self._jobs[job_id]
                if rec.state is not JobState.RESERVED:
                    continue
                rec.move(JobState.RUNNING)
                self._running += 1
                self._queued -= 1
                batch.running += 1
                taken.append((batch_id, job_id))
        for batch_id in [b for b, batch in self._queued_batches.items() if not batch.queue]:
            del self._queued_batches[batch_id]  # a batch never queues again once it is empty
        return taken

    def set_checkpoint(self, job_id: str, state: Any) -> None:
        self._checkpoints[job_id] = state

    def drop_checkpoint(self, job_id: str) -> None:
        """Forget a job's checkpoint (its clone starts again from the beginning)."""
        self._checkpoints.pop(job_id, None)

    def ending(self, rec: JobRecord) -> bool:
        """Count a job out as it ends (before its record is finished): its slot or its place in
        the queue, its spec and checkpoint; returns whether it was running."""
        was_running = rec.state is JobState.RUNNING
        if was_running:
            self._running -= 1
            batch = self._batches.get(rec.batch_id)
            if batch is not None:
                batch.running -= 1
        elif self.is_waiting(rec.job_id):
            self._queued -= 1
        self._specs.pop(rec.job_id, None)
        self._checkpoints.pop(rec.job_id, None)
        return was_running
