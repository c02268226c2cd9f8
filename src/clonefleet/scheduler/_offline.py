"""Finished results without a cluster: the job table as the journal on disk tells it.

``clonefleet jobs list|status|result`` use :class:`JournalView` when no cluster is running
(docs/durability.md): it reads the journal folder (never writing to it), folds its records into
a table, and answers the read-only part of job control from that table. Jobs that had not ended
when the cluster went away show as they were last recorded; the next scheduler on that journal
resumes them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Unpack

from clonefleet import control as api
from clonefleet.errors import UnknownJobError, UsageError
from clonefleet.journal import read_journal
from clonefleet.scheduler._durable import Table, read_table
from clonefleet.scheduler._listing import JobOrder, page_jobs
from clonefleet.scheduler._usage import UsageBook

__all__ = ["JournalView", "journal_folder"]

KEEP_RUNS = 10
"""Journals of embedded runs kept (the newest); older ones are removed as new runs start."""


def journal_folder(configured: str | None, *, embedded: bool, base: Path) -> str:
    """Where a scheduler keeps its journal: ``durability.journal_dir`` when set; else, for a
    cluster, ``journal/`` in the state folder, and for an embedded run a fresh folder of its
    own under ``runs/`` there (only the newest :data:`KEEP_RUNS` are kept). ``base`` is the
    state folder (``clonefleet.cluster.state_dir()``)."""
    if configured:
        return str(Path(configured).expanduser())
    if not embedded:
        return str(base / "journal")
    runs = base / "runs"
    runs.mkdir(mode=0o700, parents=True, exist_ok=True)
    old = sorted(p for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
    for stale in old[: max(len(old) - KEEP_RUNS + 1, 0)]:
        if not _in_use(stale / "journal"):  # a run still going holds its journal's lock
            shutil.rmtree(stale, ignore_errors=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return str(runs / f"{stamp}-{os.getpid()}" / "journal")


def _in_use(folder: Path) -> bool:
    """Whether a journal writer holds ``folder`` (its advisory lock)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


class JournalView:
    """Read-only job control over a journal folder.

    Args:
        folder: the journal folder (a missing one reads as empty).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = os.fspath(folder)
        self.table: Table = read_table(read_journal(folder))
        self._order: JobOrder | None = None
        self._usage: UsageBook | None = None

    def close(self) -> None:
        """Nothing to release (the journal was read at once); the twin of ``Fleet.close``."""

    @property
    def damage(self) -> list[str]:
        """Damaged spots found while reading, one sentence each."""
        return list(self.table.damage)

    def _get(self, job_id: str) -> api.JobStatus:
        rec = self.table.jobs.get(job_id)
        if rec is None:
            raise UnknownJobError(job_id)
        return rec.status()

    def expand(self, ids: list[str]) -> list[str]:
        out: list[str] = []
        for ident in ids:
            if ident in self.table.batches:
                out.extend(self.table.batches[ident])
            else:
                out.append(self._get(ident)["job_id"])
        return out

    def job_status(self, job_id: str) -> api.JobStatus:
        return self._get(job_id)

    def job_result(self, job_id: str) -> api.RunRecord:
        rec = self.table.jobs.get(job_id)
        if rec is None:
            raise UnknownJobError(job_id)
        if not rec.is_terminal:
            raise UsageError(
                f"job {job_id} had not ended when its cluster went away ({rec.state}); it "
                "resumes when `clonefleet cluster up` starts a scheduler on this journal"
            )
        return rec.run_record()

    def list_jobs(self, **filters: Unpack[api.JobFilter]) -> api.JobListing:
        if self._order is None:
            self._order = JobOrder(list(self.table.jobs))
        rows, next_cursor = page_jobs(
            self.table.jobs, filters, order=self._order, batches=self.table.batches
        )
        usage = self.usage()
        batch = filters.get("batch")
        wanted = [batch] if batch is not None else dict.fromkeys(r.batch_id for r in rows)
        views = {b: usage.batch_view(b, len(self.table.batches.get(b, ()))) for b in wanted}
        return {
            "jobs": [r.status() for r in rows],
            "capacity": {"running": 0, "max_concurrency": None, "queued": 0},
            "totals": {
                "fleet": usage.fleet().view(),
                "batches": {
                    b: {**v, "open": b in self.table.open}
                    for b, v in views.items()
                    if v is not None
                },
            },
            "next_cursor": next_cursor,
        }

    def usage(self) -> UsageBook:
        """Usage totals and budgets of the journal's batches, as a restarted scheduler would
        rebuild them."""
        if self._usage is None:
            book = self._usage = UsageBook(self.table.jobs)
            for batch_id, ids in self.table.batches.items():
                rows = [self.table.jobs[j] for j in ids if j in self.table.jobs]
                recorded = self.table.usage.get(batch_id)
                book.restore_batch(batch_id, rows, recorded, self.table.budgets.get(batch_id))
            book.respend(self.table.batches)
        return self._usage
