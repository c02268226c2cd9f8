"""The event log: every clone event in ``subagent_event`` envelopes, and cursor reads over it.

An event of a nested job is wrapped once per ancestor, so a reader following a batch sees its
descendants' events inside their parents' envelopes. Readers page with a cursor (the position
after the last event they saw) and may wait for the next event instead of polling. Events that
leave the scheduler's memory become journal records of up to :data:`EVENT_CHUNK` events
(:func:`spill_records`) and are read back from them (:func:`spilled_entries`); the record's
format is in docs/durability.md, "What the journal holds".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from clonefleet.control import EventPage
from clonefleet.errors import UsageError
from clonefleet.scheduler._state import JobRecord, display_name
from clonefleet.vocab import EVENT_LEVELS, EventType

__all__ = ["EVENT_CHUNK", "EventLog", "Pulse", "envelope", "spill_records", "spilled_entries"]

PAGE_LIMIT = 5000
"""Most events one read returns; the reader continues from the cursor it got."""


class Pulse:
    """A broadcast wake-up: :meth:`fire` wakes everyone waiting now; later waiters wait for the
    next fire."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        """The event waiters wait on; ``None`` while nobody waits (a fire then costs nothing:
        it runs once per logged event)."""

    def fire(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, timeout_s: float) -> None:
        """Return at the next :meth:`fire`, or after ``timeout_s``."""
        event = self._event
        if event is None:
            event = self._event = asyncio.Event()
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass


_ENVELOPE = str(EventType.ENVELOPE)


def envelope(rec: JobRecord, event: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """One job's event (or a descendant's envelope) wrapped in the job's envelope (``name``:
    the job's display name, when the caller has it already); ``key``: the job's row key, when
    it has one."""
    env = {
        "type": _ENVELOPE,
        "parent_session_id": rec.parent or rec.batch_id,
        "subagent_run_id": rec.job_id,
        "subagent_type": rec.agent,
        "display_name": name or display_name(rec.agent, rec.clone_index),
        "batch_id": rec.batch_id,
        "event": event,
    }
    if rec.key is not None:  # a job of a dataset row; a counted batch's envelopes have none
        env["key"] = rec.key
    return env


Entry = tuple[frozenset[str], str, dict[str, Any]]
"""``(the job and its ancestors, event type, outermost envelope)`` of one logged event."""
Spill = Callable[[int, list[Entry]], None]
"""Keeps events that leave memory: ``(sequence number of the first, entries)``."""
Unspill = Callable[[int], list[tuple[int, Entry]]]
"""Reads kept events back, from a sequence number on (blocking; run off the event loop)."""


class EventLog:
    """Every recorded event, in order, with the jobs it concerns; the newest ``max_events`` in
    memory, older ones handed to ``spill`` (the journal) and read back through ``unspill``.

    Args:
        jobs: the job table (read for envelopes and ancestry).
        max_events: events kept in memory; past it the older half is spilled.
        spill: keeps events that leave memory (``None``: they are dropped).
        unspill: reads spilled events back for a cursor older than memory.
    """

    def __init__(
        self,
        jobs: Mapping[str, JobRecord],
        *,
        max_events: int = 200_000,
        spill: Spill | None = None,
        unspill: Unspill | None = None,
    ) -> None:
        self._jobs = jobs
        self._log: list[Entry] = []
        self._base = 0
        """Sequence number of ``_log[0]``: events before it were spilled."""
        self.max_events, self._spill, self._unspill = max_events, spill, unspill
        self._pulse = Pulse()
        self._shared: dict[str, tuple[frozenset[str], str]] = {}
        """Per job: the set of it and its ancestors, and its display name, made once and shared
        by its events (tens of thousands of events are kept; pruned as jobs leave the table)."""

    def record(self, job_id: str, event: dict[str, Any]) -> None:
        """Log one event of a job, wrapped once per ancestor: a grandchild's event arrives
        inside its parent's envelope inside the root job's envelope."""
        rec = self._jobs[job_id]
        shared = self._shared.get(job_id)
        name = shared[1] if shared else display_name(rec.agent, rec.clone_index)
        env = envelope(rec, event, name)
        chain = [job_id]
        while rec.parent is not None and rec.parent in self._jobs:
            rec = self._jobs[rec.parent]
            chain.append(rec.job_id)
            env = envelope(rec, env)
        if shared is None or len(shared[0]) != len(chain):  # new, or an ancestor was evicted
            shared = self._shared[job_id] = (frozenset(chain), name)
        env["seq"] = self._base + len(self._log)
        self._log.append((shared[0], event["type"], env))
        if len(self._log) > self.max_events:
            self._trim()
        self._pulse.fire()

    @property
    def entries(self) -> Sequence[Entry]:
        """The events in memory, oldest first (what a spill writes)."""
        return self._log

    @property
    def base(self) -> int:
        """The number of the oldest event in memory (those before it were spilled)."""
        return self._base

    @property
    def next_seq(self) -> int:
        """The number the next event gets."""
        return self._base + len(self._log)

    def continue_at(self, seq: int) -> None:
        """Number the next event ``seq`` (after events a previous log spilled); only while
        empty."""
        if not self._log:
            self._base = max(self._base, seq)

    def _trim(self) -> None:
        """Move the older half of memory out (to ``spill``), keeping sequence numbers."""
        cut = len(self._log) // 2
        old, self._log = self._log[:cut], self._log[cut:]
        self._shared = {k: v for k, v in self._shared.items() if k in self._jobs}
        if self._spill is not None:
            self._spill(self._base, old)
        self._base += cut

    async def read(
        self,
        ids: set[str] | None,
        cursor: int,
        level: str,
        wait_s: float,
        limit: int = PAGE_LIMIT,
    ) -> EventPage:
        """At most ``limit`` events of ``ids`` (and their descendants; ``None`` = every job)
        after ``cursor`` at ``level``, waiting up to ``wait_s`` for one when there is none yet.

        Raises:
            UsageError: an unknown level.
        """
        if level not in EVENT_LEVELS:
            raise UsageError(f"unknown level {level!r}; use {', '.join(EVENT_LEVELS)}")
        kinds = EVENT_LEVELS[level]
        if cursor < self._base:
            out, cursor = await self._read_spilled(ids, cursor, kinds, limit)
            if out:
                return {"events": out, "cursor": cursor}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            out, cursor = self._scan(ids, cursor, kinds, limit)
            left = deadline - loop.time()
            if out or left <= 0:
                return {"events": out, "cursor": cursor}
            await self._pulse.wait(left)

    async def _read_spilled(
        self, ids: set[str] | None, cursor: int, kinds: frozenset[str], limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of events older than memory (from ``unspill``, off the event loop)."""
        base = self._base
        if self._unspill is None:
            return [], base
        kept = await asyncio.to_thread(self._unspill, cursor)
        out = []
        for seq, (chain, kind, env) in kept:
            if seq < cursor or seq >= base:
                continue
            if (ids is None or not ids.isdisjoint(chain)) and kind in kinds:
                out.append(env)
                if len(out) >= limit:
                    return out, seq + 1
        return out, base

    def _scan(
        self, ids: set[str] | None, cursor: int, kinds: frozenset[str], limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        out = []
        start = max(cursor, self._base) - self._base
        for pos in range(start, len(self._log)):
            chain, kind, env = self._log[pos]
            if (ids is None or not ids.isdisjoint(chain)) and kind in kinds:
                out.append(env)
                if len(out) >= limit:
                    return out, self._base + pos + 1
        return out, self._base + len(self._log)


EVENT_CHUNK = 2000
"""Events per journal record when the event log spills (a record stays far under its limit)."""

_HEADER_KEYS = frozenset(
    {
        "type",
        "parent_session_id",
        "subagent_run_id",
        "subagent_type",
        "display_name",
        "batch_id",
        "key",
    }
)
_ENVELOPE_KEYS = _HEADER_KEYS - {"key"} | {"event", "seq"}
_KEYED_KEYS = _ENVELOPE_KEYS | {"key"}
"""An envelope of a job with a row key (see :func:`envelope`)."""


def spill_records(first: int, entries: list[Entry]) -> Iterator[dict[str, Any]]:
    """The records of ``entries``, numbered from ``first``."""
    for at in range(0, len(entries), EVENT_CHUNK):
        heads: list[list[Any]] = []
        index: dict[frozenset[str], int] = {}
        rows: list[list[Any]] = []
        for i, (chain, kind, env) in enumerate(entries[at : at + EVENT_CHUNK]):
            seq = first + at + i
            keys = env.keys()
            if keys != _ENVELOPE_KEYS and keys != _KEYED_KEYS:
                rows.append([seq, sorted(chain), kind, env])
                continue
            slot = index.get(chain)
            if slot is None:
                slot = index[chain] = len(heads)
                heads.append([sorted(chain), {k: env[k] for k in env if k in _HEADER_KEYS}])
            elif heads[slot][1]["subagent_run_id"] != env["subagent_run_id"]:
                rows.append([seq, sorted(chain), kind, env])  # never expected: kept whole
                continue
            rows.append([seq, slot, kind, env["event"]])
        yield {"k": "events", "from": first + at, "hd": heads, "ev": rows}


def spilled_entries(record: dict[str, Any], cursor: int) -> Iterator[tuple[int, Entry]]:
    """The events of one ``events`` record numbered ``cursor`` or later; rows that make no
    sense are skipped."""
    heads, rows = record.get("hd", []), record.get("ev")
    if not isinstance(rows, list) or not isinstance(heads, list):
        return
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], int)):
            continue
        seq, who, kind, body = row
        if seq < cursor or not isinstance(body, dict):
            continue
        if isinstance(who, int) and not isinstance(who, bool):
            head = heads[who] if 0 <= who < len(heads) else None
            if not (isinstance(head, list) and len(head) == 2 and isinstance(head[1], dict)):
                continue
            chain, env = head[0], {**head[1], "event": body, "seq": seq}
        elif isinstance(who, list):
            chain, env = who, body
        else:
            continue
        if isinstance(chain, list) and all(isinstance(j, str) for j in chain):
            yield seq, (frozenset(chain), str(kind), env)
