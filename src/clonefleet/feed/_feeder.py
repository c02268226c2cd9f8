"""The feeder: rows in, one growing batch out, run records back as jobs end."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Unpack

from clonefleet.control import EventPage, EventQuery, Target
from clonefleet.errors import ClonefleetError, DefinitionError, UnknownJobError, UsageError
from clonefleet.feed._inflight import Limiter
from clonefleet.feed._resume import Adopted
from clonefleet.feed._seen_keys import SeenKeys
from clonefleet.inputs import Row, RowError
from clonefleet.vocab import RUN_RECORD_FIELDS, EventType, JobState, Outcome, StopReason

__all__ = [
    "DEFAULT_AHEAD",
    "Ended",
    "FeedClient",
    "Feeder",
    "Part",
    "Planner",
    "ahead_for",
    "failed_record",
    "slice_for",
]

DEFAULT_AHEAD = 1000
"""The least number of rows kept submitted but not ended (more on a larger fleet)."""
SLICE_MIN, SLICE_MAX = 256, 1000
"""Bounds of the rows planned and submitted together as one part."""
POLL_S = 0.25
"""How long one wait for the batch's events lasts before the feeder looks again."""
SWEEP_S = 5.0
"""After this long without an event, the pending jobs' states are asked instead."""
TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

Planner = Callable[[Sequence[tuple[str, Any]], "str | None", int], Any]
"""Plans one part: ``(rows as (key, data) pairs, batch_id or None for the first, the index in
the whole batch of the part's first clone) -> plan``.
Raises a :class:`~clonefleet.errors.ClonefleetError` when some row cannot be rendered."""


class Part(Protocol):
    """What submitting a part answers: the batch's id and the part's job ids, in row order."""

    @property
    def batch_id(self) -> str: ...

    @property
    def job_ids(self) -> Sequence[str]: ...


class FeedClient(Protocol):
    """The job control a feeder needs (:class:`clonefleet.fleet.Fleet` is one)."""

    def submit(self, plan: Any, open: bool = False) -> Part: ...

    def extend(self, plan: Any, last: bool = False) -> Part: ...

    def close_batch(self, batch_id: str) -> bool: ...

    def job_block(
        self, job_ids: Sequence[str], wait_seconds: float | None = None
    ) -> Any: ...  # a BlockResult: {"done": bool, "jobs": [JobStatus, ...]}

    def job_result(self, job_id: str) -> dict[str, Any]: ...

    def events(self, target: Target = None, **query: Unpack[EventQuery]) -> EventPage: ...

    def cancel_many(self, ids: Sequence[str]) -> int: ...


@dataclass(frozen=True, slots=True)
class Ended:
    """One row's end: its run record (with ``key``) and the row's data (``None`` for a row
    that could not be read)."""

    record: dict[str, Any]
    row: Any
    ran: bool
    """Whether a job ran for it (``False``: the row failed before it was submitted)."""


def ahead_for(capacity: int | None) -> int:
    """Rows kept submitted but not ended on a fleet running ``capacity`` jobs at once
    (``None``: no cap known): twice that, and at least :data:`DEFAULT_AHEAD`."""
    return max(DEFAULT_AHEAD, 2 * capacity) if capacity else DEFAULT_AHEAD


def slice_for(ahead: int) -> int:
    """Rows planned together as one part: a quarter of ``ahead``, within 256-1,000, and never
    more than ``ahead``."""
    return max(1, min(ahead, max(SLICE_MIN, min(SLICE_MAX, ahead // 4))))


def failed_record(
    key: str | None, error: str, *, agent: str, batch_id: str | None = None
) -> dict[str, Any]:
    """The run record of a row that failed without running: status ``failed``, stop reason
    ``abnormal``, ``error`` the reason in plain words, no usage."""
    out: dict[str, Any] = dict.fromkeys(RUN_RECORD_FIELDS)
    out.update(
        batch_id=batch_id,
        agent=agent,
        key=key,
        status=str(JobState.FAILED),
        stop_reason=str(StopReason.ABNORMAL),
        outcome=str(Outcome.FAILURE),
        salvaged=False,
        nonconforming=False,
        concerns=[],
        warnings=[],
        error=error,
        turns=0,
        usage={
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
        },
    )
    return out


class Feeder:
    """Feed ``rows`` into one growing batch through ``client``; iterate :meth:`run` for each
    row's :class:`Ended` as its job ends.

    Args:
        rows: :class:`~clonefleet.inputs.Row` and :class:`~clonefleet.inputs.RowError` items,
            read lazily (a generator is never read ahead by more than one slice).
        plan: the :data:`Planner` of one part.
        client: the :class:`FeedClient`.
        agent: the definition's name (for the records of rows that fail without running).
        ahead: most rows submitted but not ended at once (:func:`ahead_for`).
        inflight: a :class:`~clonefleet.feed.Limiter` (an :class:`~clonefleet.feed.InFlight`)
            whose limit (never above ``ahead``)
            is the number of rows kept submitted and not ended, told of each row that ends
            (when it was submitted and when it ended, on ``clock``); ``None`` keeps ``ahead``
            rows in flight.
        slice_rows: rows planned together as one part (default :func:`slice_for`; at most
            ``ahead`` when following the jobs).
        check_keys: give a row whose key was seen before a failed record (keeps a 64-bit
            hash of each key seen, 16-32 bytes a key: :class:`SeenKeys`).
        source: what the rows come from, named in the records of rows that fail
            (``inputs file data.jsonl``).
        poll_s: the longest wait for the batch's events before more rows are submitted.
        sweep_s: how long without an event before the pending jobs' states are asked.
        clock: times ``sweep_s``.
        adopted: the batch an earlier run of the same command submitted
            (:func:`~clonefleet.feed.adopt`): a row whose key it has is not submitted again;
            its job is collected (its record read at once when it has ended), and the rows it
            lacks are added to it as parts.
        follow: keep each submitted job to collect its end; ``False`` for a feeder that only
            submits (:meth:`submit_all`, a detached run).

    Memory is bounded by ``ahead`` rows (and their job ids) plus one slice: rows are read as
    room frees up and records are yielded, not kept.
    """

    def __init__(
        self,
        rows: Iterable[Row | RowError],
        plan: Planner,
        client: FeedClient,
        *,
        agent: str,
        ahead: int = DEFAULT_AHEAD,
        slice_rows: int | None = None,
        check_keys: bool = True,
        source: str = "input",
        poll_s: float = POLL_S,
        sweep_s: float = SWEEP_S,
        clock: Callable[[], float] = time.monotonic,
        adopted: Adopted | None = None,
        follow: bool = True,
        inflight: Limiter | None = None,
    ) -> None:
        if ahead < 1:
            raise ValueError(f"ahead must be 1 or more, got {ahead}")
        self._rows: Iterator[Row | RowError] = iter(rows)
        self._plan, self._client, self.agent = plan, client, agent
        self.ahead = ahead
        self.inflight = inflight
        self.slice_rows = max(1, slice_rows or slice_for(ahead))
        if follow:  # a slice is never more than the rows kept in flight
            self.slice_rows = min(self.slice_rows, ahead)
        self._seen = SeenKeys() if check_keys else None
        self.source, self.poll_s, self.sweep_s = source, poll_s, sweep_s
        self._clock = clock
        self._quiet_since = clock()
        self._cursor = 0
        self.batch_id: str | None = None
        self._pending: dict[str, tuple[str, Any]] = {}
        """Job id -> (key, row data) of every job submitted and not yet ended."""
        self._sent_at: dict[str, float] = {}
        """Job id -> when it was submitted (``clock()``), for :attr:`inflight`."""
        self._next: Row | RowError | None = None
        self._exhausted = False
        self._closed = False
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self.peak_held = 0
        """The most rows held at once (submitted and not ended, plus the slice being planned)."""
        self.submitted = 0
        """Rows submitted as jobs so far."""
        self.parts = 0
        self._planned = 0
        """Rows handed to the planner so far (the next part's first clone index)."""
        self._started = False
        self._early: list[Ended] = []
        self._warm = False
        """Whether a job of the batch has begun on a host (an event past ``queued`` came): until
        then only the first part is submitted, so that planning and submitting the others do
        not hold up the start of the hosts the first part needs (docs/inputs.md)."""
        self._adopted: dict[str, str] = {}
        """Key -> job id of the adopted batch's jobs whose rows were not read yet."""
        self._adopted_ended: set[str] = set()
        """Adopted job ids known to have ended (at adoption, or by an event seen since)."""
        self._adopted_unread: set[str] = set()
        """Adopted job ids whose rows were not read yet (an end event of one is noted)."""
        self._collecting = follow
        """Whether jobs are followed to their end (see ``follow``)."""
        self.adopted = 0
        """Rows whose job an earlier run submitted (collected, not submitted again)."""
        if adopted is not None:
            self.batch_id = adopted.batch_id
            self._adopted = dict(adopted.jobs)
            self._adopted_ended = set(adopted.ended)
            self._adopted_unread = set(adopted.jobs.values())
            self._planned = adopted.size
            self._closed = not adopted.open

    # -- reading rows --------------------------------------------------------------------
    def _take(self) -> Row | RowError | None:
        """The next row (``None`` at the end), reading one more ahead to know the end."""
        if self._next is None and not self._exhausted:
            self._next = next(self._rows, None)
        row, self._next = self._next, None
        if row is None:
            self._exhausted = True
            return None
        self._next = next(self._rows, None)
        if self._next is None:
            self._exhausted = True
        return row

    def _fail(self, key: str | None, reason: str, row: Any = None) -> Ended:
        error = f"{self.source}: {reason}"
        return Ended(
            failed_record(key, error, agent=self.agent, batch_id=self.batch_id), row, False
        )

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        """Read, plan and submit the first slice now (so :attr:`batch_id` is known), keeping
        the rows of it that failed alone for :meth:`run`.

        Raises:
            ClonefleetError: no row of the first slice could be planned (a bad option, an
                unknown definition, a template no row renders): nothing was submitted.
        """
        if not self._started:
            self._started = True
            size = min(self.slice_rows, self.limit) if self._collecting else self.slice_rows
            self._early = list(self._slice(size, first=True))

    def run(self) -> Iterator[Ended]:
        """Submit rows and yield each row's end, until every row read has ended (or, after
        :meth:`cancel`, every row submitted)."""
        try:
            self.start()
            yield from self._early
            self._early = []
            while True:
                yield from self._fill()
                if not self._pending:
                    if self._exhausted or self._cancelled.is_set():
                        break
                    continue
                yield from self._collect()
        finally:
            self._finish()

    def submit_all(self) -> Iterator[Ended]:
        """Submit every row without waiting for any job to end (a detached run, with
        ``follow=False``), closing the batch with the last part; yields only the rows that fail alone. Rows the adopted batch
        has are skipped (counted in :attr:`adopted`). Nothing is kept per job: memory stays at
        one slice."""
        try:
            self.start()
            yield from self._early
            self._early = []
            while not self._exhausted and not self._cancelled.is_set():
                yield from self._slice()
        finally:
            self._finish()

    @property
    def limit(self) -> int:
        """The most rows kept submitted and not ended now (:attr:`inflight`'s limit, else
        :attr:`ahead`)."""
        if self.inflight is None:
            return self.ahead
        return max(1, min(self.ahead, self.inflight.limit))

    def _fill(self) -> Iterator[Ended]:
        """Read and submit slices while there is room; yields the rows that fail alone.

        A part is a slice; under an :attr:`inflight` limit, what room there is once that is a
        slice or a quarter of the limit (so a limit below a slice still fills, in parts of a few
        rows)."""
        while not self._cancelled.is_set() and not self._exhausted:
            limit = self.limit
            room = min(self.slice_rows, limit - len(self._pending))
            least = self.slice_rows
            if self.inflight is not None:
                least = max(1, min(self.slice_rows, limit // 4))
            if room < least:
                return
            if self._pending and not self._warm:
                return
            yield from self._slice(room)

    def _slice(self, size: int | None = None, first: bool = False) -> Iterator[Ended]:
        """Read up to ``size`` rows (a slice) and submit those that are good; yields the
        others."""
        good: list[tuple[str, Any]] = []
        lines: dict[str, int] = {}
        for _ in range(size or self.slice_rows):
            row = self._take()
            if row is None:
                break
            if isinstance(row, RowError):
                yield self._fail(row.key, row.message)
                continue
            if self._seen is not None and not self._seen.add(row.key):
                yield self._fail(
                    row.key,
                    f"line {row.line}: the key {row.key!r} was seen before; "
                    "each row needs a key of its own",
                    row.data,
                )
                continue
            job_id = self._adopted.pop(row.key, None)
            if job_id is not None:
                ended = self._take_over(job_id, row.key, row.data)
                if ended is not None:
                    yield ended
                continue
            good.append((row.key, row.data))
            lines[row.key] = row.line
        self.peak_held = max(self.peak_held, len(self._pending) + len(good))
        if good:
            yield from self._submit(good, lines, first)

    def _take_over(self, job_id: str, key: str, data: Any) -> Ended | None:
        """Collect the adopted ``job_id`` for the row ``key``: its record now when it has
        ended, else once it ends (it joins the pending jobs)."""
        self.adopted += 1
        self._adopted_unread.discard(job_id)
        if not self._collecting:
            return None
        if job_id not in self._adopted_ended:
            self._pending[job_id] = (key, data)
            return None
        try:
            return Ended(self._client.job_result(job_id), data, True)
        except UnknownJobError:
            return self._fail(key, f"row {key!r}: job {job_id} is gone from the fleet", data)

    def _submit(
        self, rows: list[tuple[str, Any]], lines: dict[str, int], first: bool = False
    ) -> Iterator[Ended]:
        """Plan and submit one part; rows that fail to render fail alone.

        The planner may raise for the whole part (then each row is planned alone to find
        those that fail), or answer a plan of rows that fail alone (``plan`` and ``failures``,
        as :func:`clonefleet.planning.plan_rows` does)."""
        start, self._planned = self._planned, self._planned + len(rows)
        try:
            plan = self._plan(rows, self.batch_id, start)
        except ClonefleetError:
            rows, bad = self._sort_out(rows, start)
            if first and not rows:
                raise  # nothing in the first slice renders: a whole-batch error, said once
            for key, data, reason in bad:
                yield self._fail(key, f"line {lines[key]}: {reason}", data)
            if not rows:
                return
            plan = self._plan(rows, self.batch_id, start)
        failures = getattr(plan, "failures", None)
        if failures is not None:
            failed = {f.key: f.reason for f in failures}
            plan = plan.plan
            if first and plan is None and failed:
                reason = next(iter(failed.values()))
                raise DefinitionError(f"no row of the first {len(rows)} renders: {reason}")
            for key, data in rows:
                if key in failed:
                    yield self._fail(key, f"line {lines[key]}: {failed[key]}", data)
            rows = [row for row in rows if row[0] not in failed]
            if plan is None or not rows:
                return
        last = self._exhausted
        refused: str | None = None
        with self._lock:
            if self._cancelled.is_set():
                return
            if self.batch_id is None:
                part = self._client.submit(plan, open=not last)
                self.batch_id = part.batch_id
            elif self._closed:  # an adopted batch that was closed takes no new part
                refused = (
                    f"not in batch {self.batch_id}, which an earlier run of this command "
                    "closed; run it with a new --out"
                )
            else:
                try:
                    part = self._client.extend(plan, last=last)
                except UsageError as exc:  # the batch was cancelled or closed meanwhile
                    refused = str(exc)
            if refused is None:
                self._closed = last
        if refused is not None:
            for key, data in rows:
                yield self._fail(key, f"line {lines[key]}: row {key!r}: {refused}", data)
            return
        self.parts += 1
        self.submitted += len(rows)
        if self._collecting:
            now = self._clock()
            for job_id, row in zip(part.job_ids, rows, strict=True):
                self._pending[job_id] = row
                if self.inflight is not None:
                    self._sent_at[job_id] = now

    def _sort_out(
        self, rows: list[tuple[str, Any]], start: int
    ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any, str]]]:
        """Plan each row alone to find those that cannot be rendered."""
        good, bad = [], []
        for key, data in rows:
            try:
                self._plan([(key, data)], self.batch_id, start)
            except ClonefleetError as exc:
                bad.append((key, data, str(exc)))
            else:
                good.append((key, data))
        return good, bad

    def _collect(self) -> Iterator[Ended]:
        """Wait up to :attr:`poll_s` for the batch's next lifecycle events and yield the
        record of each pending job whose ``result`` event came; when no event came for
        :attr:`sweep_s`, ask the jobs' states instead (an end whose event was missed)."""
        page = self._client.events(
            self.batch_id, cursor=self._cursor, level="lifecycle", wait_s=self.poll_s
        )
        self._cursor = page["cursor"]
        ended: list[tuple[str, dict[str, Any] | None]] = []
        for env in page["events"]:
            event = env.get("event") or {}
            job = env.get("subagent_run_id")
            self._warm = self._warm or event.get("type") != EventType.QUEUED
            if event.get("type") != EventType.RESULT:
                continue
            if job in self._adopted_unread:  # its row comes later: read its record then
                self._adopted_ended.add(job)
            elif job in self._pending:
                record = event.get("record")
                ended.append((job, record if isinstance(record, dict) else None))
        now = self._clock()
        if page["events"]:
            self._quiet_since = now
        elif now - self._quiet_since >= self.sweep_s:
            self._quiet_since = now
            self._warm = True  # whatever the events said: the rest may go in
            ended.extend((job, None) for job in self._ended_by_state())
        if self.inflight is not None and ended:
            sent = self._sent_at
            # Adopted jobs were not submitted by this run: their times say nothing.
            spans = [(sent.pop(job), now) for job, _ in ended if job in sent]
            if spans:
                self.inflight.ended(spans)
        for job_id, record in ended:
            if job_id not in self._pending:
                continue
            key, data = self._pending.pop(job_id)
            if record is None:
                try:
                    record = self._client.job_result(job_id)
                except UnknownJobError:
                    yield self._fail(key, f"row {key!r}: job {job_id} is gone from the fleet", data)
                    continue
            yield Ended(record, data, True)

    def _ended_by_state(self) -> list[str]:
        """The pending jobs that have ended, by their state (one gone from the fleet too)."""
        ids = list(self._pending)
        block = self._client.job_block(ids, wait_seconds=0)
        seen, ended = set(), []
        for status in block["jobs"]:
            seen.add(status["job_id"])
            if status["status"] in TERMINAL:
                ended.append(status["job_id"])
        ended.extend(j for j in ids if j not in seen)  # evicted meanwhile: it ended
        return ended

    def cancel(self) -> None:
        """Stop submitting rows and cancel the batch's jobs (safe from another thread); the
        records of jobs already submitted still come back, ``cancelled``."""
        with self._lock:
            self._cancelled.set()
            if self.batch_id is not None:
                self._client.cancel_many([self.batch_id])
                self._closed = True  # cancelling a batch closes it

    def _finish(self) -> None:
        """Close the batch if it is still open (the iterator ended or was dropped early)."""
        with self._lock:
            if self.batch_id is not None and not self._closed:
                self._closed = True
                # Also on the way out of an interruption or an error: a close that fails then
                # must not hide it (a batch left open on a stopped embedded cluster is gone).
                with contextlib.suppress(ClonefleetError):
                    self._client.close_batch(self.batch_id)
