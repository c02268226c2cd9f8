"""A scheduler that starts over a journal: rebuilding the job table, and keeping it bounded.

:func:`restore` is what a restarted scheduler (after a crash, or a ``cluster down`` and ``up``)
does first: finished jobs come back with their records and results; each unfinished job is
queued again and resumes from its last checkpoint, counting one restart, or ends ``failed`` with
"cluster lost" when its batch cannot be run again (see docs/durability.md).
:func:`housekeeping` runs for the scheduler's life: it evicts finished batches older than
``durability.retention_s`` and compacts the journal once it passed ``durability.compact_bytes``.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Callable
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

from clonefleet.clone import state_of
from clonefleet.planning import BatchSubmission
from clonefleet.scheduler._durable import Table, part_key
from clonefleet.scheduler._state import JobRecord
from clonefleet.scheduler._usage import Totals, resume_usage
from clonefleet.vocab import EventType, JobState, StopReason

if TYPE_CHECKING:
    from clonefleet.scheduler._core import SchedulerCore

__all__ = ["RestoreReport", "housekeeping", "restore"]

CLUSTER_LOST = "cluster lost"


class RestoreReport(dict[str, int]):
    """Counts of what :func:`restore` did: ``finished``, ``resumed``, ``lost``."""


def restore(
    core: SchedulerCore, table: Table, loads: Callable[[bytes], Any] = pickle.loads
) -> RestoreReport:
    """Load a journal's table into an empty core and queue its unfinished jobs again; a batch
    already past its budget starts none of them (they end ``cancelled``/``budget``)."""
    report = RestoreReport(finished=0, resumed=0, lost=0)
    core.journal_damage = list(table.damage)
    # Numbers the old log handed out live past what it spilled by at most its memory's size.
    log = core.event_log
    log.continue_at(table.events_next + log.max_events if table.events_next else 0)
    with core.paused():  # nothing starts before every batch is back and bound to hosts
        for batch_id, ids in table.batches.items():
            _restore_batch(core, table, batch_id, ids, loads, report)
        batch_jobs = core.table.batch_job_ids
        for batch_id in core.usage.respend(batch_jobs):
            core.stops.mark(batch_jobs[batch_id], StopReason.BUDGET)
        for batch_id, batch in core.table.batches():
            if batch.meta is not None:
                core.queue_batch(batch_id)
    return report


def _restore_batch(
    core: SchedulerCore,
    table: Table,
    batch_id: str,
    ids: list[str],
    loads: Callable[[bytes], Any],
    report: RestoreReport,
) -> None:
    recs = [table.jobs[j] for j in ids if j in table.jobs]
    core.table.load_batch(batch_id, recs)
    loaded = core.table.batch(batch_id)
    if loaded is not None:
        loaded.open = batch_id in table.open and batch_id not in table.cancelled
        loaded.cancelled = batch_id in table.cancelled
        loaded.parts = 1 + max((n for n, _, _ in table.grown.get(batch_id, ())), default=0)
    unfinished = [r for r in recs if not r.is_terminal]
    report["finished"] += len(recs) - len(unfinished)
    sub = _submission(table.blobs.get(batch_id), loads) if unfinished else None
    if unfinished and batch_id in table.grown:
        sub = _with_parts(sub, table, batch_id, ids, loads)
    for rec in unfinished:
        state = state_of(table.checkpoints.get(rec.job_id))
        if sub is not None and state is not None:
            resume_usage(rec, state, sub.config)
    recorded: Totals | None = table.usage.get(batch_id)
    budget = table.budgets.get(batch_id)
    core.usage.restore_batch(batch_id, recs, recorded, budget, sub.config if sub else None)
    if not unfinished:
        return
    if sub is None:
        for rec in unfinished:
            _lose(core, rec, "its batch could not be read back from the journal")
        report["lost"] += len(unfinished)
        return
    resumed = _requeue(core, sub, unfinished, table.checkpoints)
    report["resumed"] += resumed
    report["lost"] += len(unfinished) - resumed


def _with_parts(
    first: BatchSubmission | None,
    table: Table,
    batch_id: str,
    ids: list[str],
    loads: Callable[[bytes], Any],
) -> BatchSubmission | None:
    """A grown batch's submission for running its unfinished jobs again: its first part's
    (or, unreadable, a later part's) with the specs of every part that has unfinished jobs;
    a part whose jobs have all ended is not read."""
    specs = list(first.specs) if first is not None else []
    meta = first
    for index, start, end in table.grown[batch_id]:
        if all(table.jobs[j].is_terminal for j in ids[start:end] if j in table.jobs):
            continue
        part = _submission(table.blobs.get(part_key(batch_id, index)), loads)
        if part is None:
            continue  # its jobs are lost: no spec
        specs.extend(part.specs)
        meta = meta or part
    return replace(meta, specs=tuple(specs)) if meta is not None else None


def _submission(blob: bytes | None, loads: Callable[[bytes], Any]) -> BatchSubmission | None:
    if blob is None:
        return None
    try:
        sub = loads(blob)
    except Exception:  # a batch pickled by another clonefleet version, or damaged
        return None
    if not isinstance(sub, BatchSubmission):
        return None
    # One pickled by a version with fewer fields unpickles without them (slots restored by
    # position): it cannot be run again.
    return sub if all(hasattr(sub, f.name) for f in fields(sub)) else None


def _requeue(
    core: SchedulerCore,
    sub: BatchSubmission,
    unfinished: list[JobRecord],
    checkpoints: dict[str, dict[str, Any]],
) -> int:
    """Queue a batch's unfinished jobs again; returns how many were (the rest are lost)."""
    specs = {s.job_id: s for s in sub.specs}
    core.table.set_meta(sub)
    core.usage.add_batch(sub.batch_id, sub.config, sub.budget_tokens, sub.budget_usd)
    limit = sub.config.limits.max_restarts
    resumed = 0
    for rec in unfinished:
        spec = specs.get(rec.job_id)
        was_running = rec.state is JobState.RUNNING
        if spec is None or (was_running and rec.restarts >= limit):
            why = (
                "its spec is missing from the journal"
                if spec is None
                else f"restarted {rec.restarts} time(s), limits.max_restarts is {limit}"
            )
            _lose(core, rec, why)
            continue
        resumed += 1
        if not was_running:
            core.table.requeue(rec, spec)
            continue  # it had not started: it simply starts now
        core.table.requeue(rec, spec, checkpoints.get(rec.job_id))
        rec.restarts += 1
        core.durable.restarted(rec)
        turn = int((state_of(checkpoints.get(rec.job_id)) or {}).get("turns", 0) or 0)
        rec.detail = f"resumed after the scheduler restarted (from turn {turn})"
        event = {"type": str(EventType.RESTARTED), "ts": time.time(), "attempt": rec.restarts}
        event.update(resumed_turn=turn, detail="the scheduler restarted; resumed from the journal")
        core.event_log.record(rec.job_id, event)
    return resumed


def _lose(core: SchedulerCore, rec: JobRecord, why: str) -> None:
    rec.state, rec.host_id, rec.node = JobState.RESERVED, None, None  # ending it frees no slot
    core.crash_job(rec.job_id, f"{CLUSTER_LOST}: {why}")


async def housekeeping(core: SchedulerCore, every_s: float = 5.0) -> None:
    """Evict expired finished batches and compact the journal, every ``every_s`` seconds."""
    while True:
        await asyncio.sleep(every_s)
        try:
            evict_expired(core, time.time())
            await compact_if_due(core)
        except Exception as exc:  # noted (health) and tried again at the next round
            core.durable.note_failure(f"housekeeping: {type(exc).__name__}: {exc}")


def evict_expired(core: SchedulerCore, now: float) -> list[str]:
    """Drop finished batches whose last job ended more than ``retention_s`` ago (an open
    batch has not finished: more parts may come)."""
    gone = []
    for batch_id, batch in core.table.batches():
        if batch.open:
            continue
        meta = batch.meta
        keep = meta.config.durability.retention_s if meta is not None else core.retention_s
        if keep is None:
            continue
        recs = [core.jobs[j] for j in batch.job_ids if j in core.jobs]
        if any(not r.is_terminal for r in recs):
            continue
        ended = max((r.ended_at or 0.0 for r in recs), default=0.0)
        if now - ended < keep:
            continue
        core.forget_batch(batch_id)
        core.durable.evicted(batch_id)
        gone.append(batch_id)
    return gone


async def compact_if_due(core: SchedulerCore) -> bool:
    """Rewrite the journal as one snapshot of the live table once it grew past its limit."""
    journal = core.durable.journal
    if journal is None or journal.size_bytes() < core.compact_bytes:
        return False
    live = core.table
    table = Table(
        jobs=dict(live.jobs),
        batches={b: list(batch.job_ids) for b, batch in live.batches()},
        checkpoints=dict(live.checkpoints),
    )
    table.usage = dict(core.usage.batches)
    table.budgets = {b: budget.view() for b, budget in core.usage.budgets.items()}
    # A grown batch is kept as one batch record (its parts' waiting specs in one submission).
    table.open = {b for b, batch in live.batches() if batch.open}
    table.cancelled = {b for b, batch in live.batches() if batch.cancelled}
    blobs: dict[str, bytes] = {}
    for batch_id, batch in live.batches():
        specs = (live.spec_of(j) for j in batch.job_ids)
        waiting = tuple(s for s in specs if s is not None)
        if waiting and batch.meta is not None:
            blob = core.durable.dumps_or_none(replace(batch.meta, specs=waiting))
            if blob is not None:
                blobs[batch_id] = blob
    records = list(core.durable.snapshot(table, blobs))
    # Numbering goes on.
    records.append({"k": "events", "from": core.event_log.next_seq, "ev": []})
    await journal.compact(records)
    return True
