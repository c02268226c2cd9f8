"""What the scheduler writes to its journal, and the job table read back from it.

The scheduler appends one record per fact (``part`` and ``batch``, ``grow``, ``close``,
``run``, ``ckpt``, ``restart``, ``end``, ``evict``, ``events``); what each holds is in
docs/durability.md, "What the journal holds". :func:`fold` turns the records back into a :class:`Table` without Ray and without
unpickling anything, so ``clonefleet jobs`` can read finished results when no cluster runs; the
restarted scheduler unpickles a batch's submission only to run its unfinished jobs again.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from clonefleet.errors import JournalError
from clonefleet.journal import read_journal
from clonefleet.scheduler._events import Entry, spill_records, spilled_entries
from clonefleet.scheduler._state import ZERO_USAGE, JobRecord
from clonefleet.scheduler._usage import Totals
from clonefleet.vocab import JobState

if TYPE_CHECKING:
    from clonefleet.journal import Journal, Replay


__all__ = ["Durable", "Table", "fold", "job_row", "part_key", "read_table", "record_of"]

_ROW_FIELDS = tuple(f.name for f in fields(JobRecord))


def job_row(rec: JobRecord, names: Iterable[str] = _ROW_FIELDS) -> dict[str, Any]:
    """The fields ``names`` (default: every field) of a job's record as plain data (the state
    as its string)."""
    row = {name: getattr(rec, name) for name in names}
    if "state" in row:
        row["state"] = str(rec.state)
    return row


_PLAIN = (str, int, float, bool)


def split_rows(rows: list[JobRecord]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The rows of a batch's jobs (:func:`job_row`) as the values they all share and, per job,
    the other fields: ``{**shared, **row}`` is a job's row. A new batch's jobs differ in a few
    fields, and its record is walked, packed and written while its caller waits.

    Shared are plain values (strings, numbers, booleans, ``None``) equal in every row with the
    same type, and maps of plain values equal key by key with the same types (a job's usage
    counters). Replay copies a shared map for each job (see :func:`_fold_batch`).
    """
    shared: dict[str, Any] = {}
    if len(rows) > 1:
        for name in _ROW_FIELDS:
            values = list(map(attrgetter(name), rows))
            if _all_same(values):
                shared[name] = str(values[0]) if name == "state" else values[0]
    varying = [name for name in _ROW_FIELDS if name not in shared]
    return shared, [job_row(rec, varying) for rec in rows]


def _all_same(values: list[Any]) -> bool:
    first = values[0]
    if first is None or isinstance(first, _PLAIN):
        try:
            return len(set(values)) == 1 and len(set(map(type, values))) == 1
        except TypeError:  # an unhashable value in a later row
            return False
    if isinstance(first, list):
        return not first and all(type(v) is list and not v for v in values)
    if not isinstance(first, dict) or not all(isinstance(v, _PLAIN) for v in first.values()):
        return False
    kinds = [type(v) for v in first.values()]
    return all(
        type(v) is dict and v == first and [type(x) for x in v.values()] == kinds for v in values
    )


def record_of(row: dict[str, Any]) -> JobRecord | None:
    """A job record from :func:`job_row`'s output, or ``None`` when the row is unusable; a
    usage counter the row lacks (written before the prompt cache was counted) is 0."""
    try:
        values = {k: v for k, v in row.items() if k in _ROW_FIELDS}
        values["state"] = JobState(values["state"])
        if isinstance(values.get("usage"), dict):
            values["usage"] = {**ZERO_USAGE, **values["usage"]}
        return JobRecord(**values)
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(slots=True)
class Table:
    """The job table as the journal tells it."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    batches: dict[str, list[str]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    """Pickled submission of each batch that has unfinished jobs."""
    checkpoints: dict[str, Any] = field(default_factory=dict)
    parts: dict[str, dict[int, bytes]] = field(default_factory=dict)
    """Pieces of submissions whose batch record has not been read yet."""
    damage: list[str] = field(default_factory=list)
    """Damaged spots of the journal, one sentence each."""
    skipped: int = 0
    """Records that made no sense (unknown kind, unknown job, bad row)."""
    events_next: int = 0
    """Sequence number after the last spilled event (a restarted log continues from it)."""
    usage: dict[str, Totals] = field(default_factory=dict)
    """Each batch's usage totals as last recorded (with a job's end, or in a snapshot)."""
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each budgeted batch's ``budget_tokens`` and ``budget_usd``."""
    grown: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    """Each batch's parts after its first (``grow`` records): the part's number (its pickled
    submission is :attr:`blobs` at :func:`part_key`) and where its jobs are in the batch's job
    ids (from, to)."""
    open: set[str] = field(default_factory=set)
    """Batches that may still take parts (submitted open, not closed yet)."""
    cancelled: set[str] = field(default_factory=set)
    """Batches cancelled as a whole (closed; they refuse more parts)."""

    def unfinished(self) -> list[JobRecord]:
        return [r for r in self.jobs.values() if not r.is_terminal]


def fold(records: Iterable[dict[str, Any]]) -> Table:
    """Replay journal records into a :class:`Table` (pure; no Ray, no unpickling)."""
    table = Table()
    for rec in records:
        kind = rec.get("k")
        handler = _FOLD.get(kind) if isinstance(kind, str) else None
        if handler is None or not handler(table, rec):
            table.skipped += 1
    return table


def _fold_batch(table: Table, rec: dict[str, Any]) -> bool:
    batch_id, rows, base = rec.get("b"), rec.get("jobs"), rec.get("base", {})
    if not isinstance(batch_id, str) or not isinstance(rows, list) or not isinstance(base, dict):
        return False
    ids = []
    maps = [name for name, value in base.items() if isinstance(value, dict | list)]
    for row in rows:
        fresh = {name: base[name].copy() for name in maps}  # each job its own counters
        job = record_of({**base, **fresh, **row}) if isinstance(row, dict) else None
        if job is None:
            return False
        table.jobs.setdefault(job.job_id, job)
        ids.append(job.job_id)
    table.batches[batch_id] = ids
    if rec.get("open") is True:
        table.open.add(batch_id)
    if isinstance(rec.get("budget"), dict):
        table.budgets[batch_id] = rec["budget"]
    _note_totals(table, batch_id, rec.get("usage"))
    blob = _join_pieces(table, batch_id, rec.get("parts"))
    if blob is not None:
        table.blobs[batch_id] = blob
    elif isinstance(rec.get("blob"), bytes):
        table.blobs[batch_id] = rec["blob"]
    return True


def _fold_grow(table: Table, rec: dict[str, Any]) -> bool:
    """One more part of a batch: its jobs join the batch's, its submission is kept apart."""
    batch_id, index, rows, base = rec.get("b"), rec.get("n"), rec.get("jobs"), rec.get("base", {})
    if not isinstance(batch_id, str) or batch_id not in table.batches:
        return False
    if not isinstance(index, int) or index < 1 or not isinstance(rows, list):
        return False
    jobs = _decode_rows(rows, base) if isinstance(base, dict) else None
    if jobs is None or any(job.batch_id != batch_id for job in jobs):
        return False
    ids = table.batches[batch_id]
    start = len(ids)
    for job in jobs:
        table.jobs.setdefault(job.job_id, job)
        ids.append(job.job_id)
    key = part_key(batch_id, index)
    blob = _join_pieces(table, key, rec.get("parts"))
    if blob is not None:
        table.blobs[key] = blob
    table.grown.setdefault(batch_id, []).append((index, start, len(ids)))
    if rec.get("last") is True:
        table.open.discard(batch_id)
    return True


def _decode_rows(rows: list[Any], base: dict[str, Any]) -> list[JobRecord] | None:
    """A record's job rows over its ``base`` (see :func:`split_rows`); ``None`` if one is bad."""
    maps = [name for name, value in base.items() if isinstance(value, dict | list)]
    jobs = []
    for row in rows:
        fresh = {name: base[name].copy() for name in maps}  # each job its own counters
        job = record_of({**base, **fresh, **row}) if isinstance(row, dict) else None
        if job is None:
            return None
        jobs.append(job)
    return jobs


def _join_pieces(table: Table, key: str, count: Any) -> bytes | None:
    """The pickled submission whose ``count`` pieces (``part`` records) were kept under
    ``key``; ``None`` when there are none or some are missing."""
    pieces = table.parts.pop(key, {})
    if isinstance(count, int) and count > 0 and sorted(pieces) == list(range(count)):
        return b"".join(pieces[i] for i in range(count))
    return None


def _fold_close(table: Table, rec: dict[str, Any]) -> bool:
    batch_id = rec.get("b")
    if not isinstance(batch_id, str) or batch_id not in table.batches:
        return False
    table.open.discard(batch_id)
    if rec.get("why") == "cancelled":
        table.cancelled.add(batch_id)
    return True


def part_key(batch_id: str, index: int) -> str:
    """Where the pickled submission of a batch's part ``index`` is kept (its ``part`` records'
    ``b``, and its key in :attr:`Table.blobs`): the batch id for its first part."""
    return batch_id if index == 0 else f"{batch_id}/{index}"


def _note_totals(table: Table, batch_id: str, data: Any) -> None:
    totals = Totals.from_view(data)
    if totals is not None:
        known = table.usage.setdefault(batch_id, totals)
        known.at_least(totals)


def _fold_part(table: Table, rec: dict[str, Any]) -> bool:
    batch_id, index, data = rec.get("b"), rec.get("i"), rec.get("data")
    if not isinstance(batch_id, str) or not isinstance(index, int) or not isinstance(data, bytes):
        return False
    table.parts.setdefault(batch_id, {})[index] = data
    return True


def _fold_run(table: Table, rec: dict[str, Any]) -> bool:
    job = table.jobs.get(str(rec.get("j")))
    if job is None:
        return False
    if job.state is JobState.RESERVED:
        job.state = JobState.RUNNING
        job.started_at = rec.get("at") or job.started_at
    job.host_id = rec.get("h") or job.host_id
    return True


def _fold_ckpt(table: Table, rec: dict[str, Any]) -> bool:
    job_id, state = str(rec.get("j")), rec.get("s")
    if job_id not in table.jobs or not isinstance(state, dict | bytes):
        return False
    if not table.jobs[job_id].is_terminal:
        table.checkpoints[job_id] = state
    return True


def _fold_restart(table: Table, rec: dict[str, Any]) -> bool:
    job = table.jobs.get(str(rec.get("j")))
    if job is None or not isinstance(rec.get("n"), int):
        return False
    job.restarts = max(job.restarts, rec["n"])
    return True


def _fold_end(table: Table, rec: dict[str, Any]) -> bool:
    row = rec.get("row")
    job = record_of(row) if isinstance(row, dict) else None
    if job is None or job.job_id not in table.jobs:
        return False
    if not table.jobs[job.job_id].is_terminal:  # the first end wins: a result is recorded once
        table.jobs[job.job_id] = job
        table.checkpoints.pop(job.job_id, None)
    _note_totals(table, job.batch_id, rec.get("bt"))
    return True


def _fold_evict(table: Table, rec: dict[str, Any]) -> bool:
    ids = table.batches.pop(str(rec.get("b")), None)
    if ids is None:
        return False
    for kept in (table.blobs, table.usage, table.budgets):
        kept.pop(str(rec.get("b")), None)
    for index, _, _ in table.grown.pop(str(rec.get("b")), []):
        table.blobs.pop(part_key(str(rec.get("b")), index), None)
    table.open.discard(str(rec.get("b")))
    table.cancelled.discard(str(rec.get("b")))
    for job_id in ids:
        table.jobs.pop(job_id, None)
        table.checkpoints.pop(job_id, None)
    return True


def _fold_events(table: Table, rec: dict[str, Any]) -> bool:
    first, rows = rec.get("from"), rec.get("ev")
    if not isinstance(first, int) or not isinstance(rows, list):
        return False
    table.events_next = max(table.events_next, first + len(rows))
    return True


def _fold_json(table: Table, rec: dict[str, Any]) -> bool:
    """A record kept as JSON text because msgpack could not hold it (e.g. a huge integer)."""
    try:
        inner = json.loads(rec.get("json", ""))
    except (TypeError, ValueError):
        return False
    kind = inner.get("k") if isinstance(inner, dict) else None
    handler = _FOLD.get(kind) if isinstance(kind, str) else None
    return handler is not None and handler is not _fold_json and handler(table, inner)


_FOLD: dict[str, Callable[[Table, dict[str, Any]], bool]] = {
    "part": _fold_part,
    "batch": _fold_batch,
    "grow": _fold_grow,
    "close": _fold_close,
    "run": _fold_run,
    "ckpt": _fold_ckpt,
    "restart": _fold_restart,
    "end": _fold_end,
    "evict": _fold_evict,
    "events": _fold_events,
    "json": _fold_json,
}


def read_table(replay: Replay) -> Table:
    """The table a journal's records describe, with its damage reported."""
    table = fold(replay.records)
    table.damage = [str(d) for d in replay.damage]
    return table


class Durable:
    """The scheduler's side of the journal: one method per kind of record.

    Args:
        journal: where records go (``None``: nothing is kept, as for an in-process test core).
        dumps: pickles a batch submission (the Ray shell passes Ray's cloudpickle, which also
            carries the Python-function tools of a batch made in code).
    """

    def __init__(
        self, journal: Journal | None, dumps: Callable[[Any], bytes] = pickle.dumps
    ) -> None:
        self.journal, self._dumps = journal, dumps
        self.failures: list[str] = []
        """Records that could not be kept (at most the last 20), one sentence each."""

    def note_failure(self, sentence: str) -> None:
        """Keep one sentence about something that could not be kept (the last 20)."""
        self.failures = [*self.failures[-19:], sentence]

    def _append(self, record: dict[str, Any]) -> None:
        if self.journal is None:
            return
        try:
            self.journal.append(record)
        except JournalError as exc:
            try:
                self.journal.append({"k": "json", "json": json.dumps(record, default=str)})
            except (JournalError, TypeError, ValueError):
                self.failures = [*self.failures[-19:], f"{record.get('k')}: {exc}"]

    async def commit(self) -> None:
        """Wait until every record so far is on disk."""
        if self.journal is not None:
            await self.journal.commit()

    def dumps_or_none(self, submission: Any) -> bytes | None:
        """The pickled submission, or ``None`` (noted in :attr:`failures`) when it cannot be
        pickled (a tool made of a closure over an open file...): its jobs cannot be resumed."""
        if self.journal is None:
            return None
        try:
            return self._dumps(submission)
        except Exception as exc:
            self.failures = [*self.failures[-19:], f"a batch kept without its specs: {exc}"]
            return None

    def batch(
        self,
        batch_id: str,
        rows: list[JobRecord],
        submission: Any,
        blob: bytes | None = None,
        budget: dict[str, Any] | None = None,
        open: bool = False,
    ) -> None:
        """Record a new batch (its rows, budget and pickled submission, in parts when large;
        ``open``: it will take more parts).

        Raises:
            JournalError: the batch cannot be recorded (the caller then refuses it).
        """
        if self.journal is None:
            return
        if blob is None:
            blob = self.dumps_or_none(submission)
        for record in batch_records(batch_id, rows, blob, budget=budget, open=open):
            self.journal.append(record | {"at": time.time()})

    def part(
        self,
        batch_id: str,
        index: int,
        rows: list[JobRecord],
        submission: Any,
        blob: bytes | None = None,
        *,
        last: bool = False,
    ) -> None:
        """Record part ``index`` (1 on) of an open batch: its rows and its own pickled
        submission (in pieces when large), and whether it is the batch's last part.

        Raises:
            JournalError: the part cannot be recorded (the caller then refuses it).
        """
        if self.journal is None:
            return
        if blob is None:
            blob = self.dumps_or_none(submission)
        now = time.time()
        key = part_key(batch_id, index)
        pieces = 0
        for piece in blob_pieces(key, blob):
            self.journal.append(piece | {"at": now})
            pieces += 1
        shared, jobs = split_rows(rows)
        record: dict[str, Any] = {"k": "grow", "b": batch_id, "n": index, "jobs": jobs}
        if shared:
            record["base"] = shared
        record.update(parts=pieces, at=now)
        if last:
            record["last"] = True
        self.journal.append(record)

    def closed(self, batch_id: str, *, cancelled: bool = False) -> None:
        """Record that a batch takes no more parts (closed, or ``cancelled`` as a whole)."""
        self._append({"k": "close", "b": batch_id, "why": "cancelled" if cancelled else "closed"})

    def running(self, rec: JobRecord) -> None:
        self._append({"k": "run", "j": rec.job_id, "h": rec.host_id, "at": rec.started_at})

    def checkpoint(self, job_id: str, state: dict[str, Any] | bytes) -> None:
        self._append({"k": "ckpt", "j": job_id, "s": state})

    def restarted(self, rec: JobRecord) -> None:
        self._append({"k": "restart", "j": rec.job_id, "n": rec.restarts})

    def ended(self, rec: JobRecord, batch_totals: dict[str, Any] | None = None) -> None:
        record: dict[str, Any] = {"k": "end", "j": rec.job_id, "row": job_row(rec)}
        if batch_totals is not None:
            record["bt"] = batch_totals
        self._append(record)

    def events(self, first: int, entries: list[Entry]) -> None:
        """Keep events that leave the scheduler's memory (see :func:`~clonefleet.scheduler._events.spill_records`)."""
        if self.journal is None:
            return  # nothing is kept: not even the rows are made
        for record in spill_records(first, entries):
            self._append(record)

    def read_events(self, cursor: int) -> list[tuple[int, Entry]]:
        """Events kept by :meth:`events` from ``cursor`` on, read from disk (blocking)."""
        if self.journal is None:
            return []
        out: list[tuple[int, Entry]] = []
        for rec in read_journal(self.journal.folder).records:
            if rec.get("k") == "events":
                out.extend(spilled_entries(rec, cursor))
        out.sort(key=lambda item: item[0])
        return out

    def evicted(self, batch_id: str) -> None:
        self._append({"k": "evict", "b": batch_id})

    def snapshot(self, table: Table, blobs: dict[str, bytes]) -> Iterator[dict[str, Any]]:
        """The live state as records, for :meth:`Journal.compact`."""
        for batch_id, ids in table.batches.items():
            rows = [table.jobs[j] for j in ids if j in table.jobs]
            live = batch_id in blobs and any(not r.is_terminal for r in rows)
            totals = table.usage.get(batch_id)
            yield from batch_records(
                batch_id,
                rows,
                blobs[batch_id] if live else None,
                budget=table.budgets.get(batch_id),
                totals=totals.view() if totals is not None else None,
                open=batch_id in table.open,
            )
            if batch_id in table.cancelled:
                yield {"k": "close", "b": batch_id, "why": "cancelled"}
        for job_id, state in table.checkpoints.items():
            yield {"k": "ckpt", "j": job_id, "s": state}


BLOB_PART = 16 * 1024 * 1024
"""Largest piece of a pickled submission in one record (records stay under their limit)."""


def batch_records(
    batch_id: str,
    rows: list[JobRecord],
    blob: bytes | None,
    *,
    budget: dict[str, Any] | None = None,
    totals: dict[str, Any] | None = None,
    open: bool = False,
) -> Iterator[dict[str, Any]]:
    """A batch as records: its submission's parts (``part``), then the batch itself (with its
    budget, and, in a snapshot, its usage totals; ``open`` when it will take more parts)."""
    parts = 0
    for piece in blob_pieces(batch_id, blob):
        yield piece
        parts += 1
    shared, jobs = split_rows(rows)
    record: dict[str, Any] = {"k": "batch", "b": batch_id, "jobs": jobs}
    if shared:
        record["base"] = shared
    record["parts"] = parts
    if budget is not None:
        record["budget"] = budget
    if totals is not None:
        record["usage"] = totals
    if open:
        record["open"] = True
    yield record


def blob_pieces(key: str, blob: bytes | None) -> Iterator[dict[str, Any]]:
    """A pickled submission as ``part`` records of at most :data:`BLOB_PART` bytes each."""
    if blob is None:
        return
    for index, at in enumerate(range(0, len(blob), BLOB_PART)):
        yield {"k": "part", "b": key, "i": index, "data": blob[at : at + BLOB_PART]}
