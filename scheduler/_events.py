"""The event log: every clone event in ``subagent_event`` envelopes, and cursor reads over it.

An event of a nested job is wrapped once per ancestor, so a reader following a batch sees its
descendants' events inside their parents' envelopes. Readers page with a cursor (the position
after the last event they saw) and may wait for the next event instead of polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..control import EventPage
from ..errors import UsageError
from ..vocab import EVENT_LEVELS, EventType
from ._state import JobRecord, display_name

__all__ = ["EventLog", "Pulse", "envelope"]

PAGE_LIMIT = 5000
"""Most events one read returns; the reader continues from the cursor it got."""


class Pulse:
    """A broadcast wake-up: :meth:`fire` wakes everyone waiting now; later waiters wait for the
    next fire."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout_s: float) -> None:
        """Return at the next :meth:`fire`, or after ``timeout_s``."""
        event = self._event
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass


def envelope(rec: JobRecord, event: dict[str, Any]) -> dict[str, Any]:
    """One job's event (or a descendant's envelope) wrapped in the job's envelope."""
    return {
        "type": str(EventType.ENVELOPE),
        "parent_session_id": rec.parent or rec.batch_id,
        "subagent_run_id": rec.job_id,
        "subagent_type": rec.agent,
        "display_name": display_name(rec.agent, rec.clone_index),
        "batch_id": rec.batch_id,
        "event": event,
    }


class EventLog:
    """Every recorded event, in order, with the jobs it concerns.

    Args:
        jobs: the job table (read for envelopes and ancestry).
    """

    def __init__(self, jobs: Mapping[str, JobRecord]) -> None:
        self._jobs = jobs
        self._log: list[tuple[frozenset[str], str, dict[str, Any]]] = []
        """``(the job and its ancestors, event type, outermost envelope)`` per event."""
        self._pulse = Pulse()

    def record(self, job_id: str, event: dict[str, Any]) -> None:
        """Log one event of a job, wrapped once per ancestor: a grandchild's event arrives
        inside its parent's envelope inside the root job's envelope."""
        rec = self._jobs[job_id]
        env = envelope(rec, event)
        chain = [job_id]
        while rec.parent is not None and rec.parent in self._jobs:
            rec = self._jobs[rec.parent]
            chain.append(rec.job_id)
            env = envelope(rec, env)
        env["seq"] = len(self._log)
        self._log.append((frozenset(chain), event["type"], env))
        self._pulse.fire()

    async def read(self, ids: set[str] | None, cursor: int, level: str, wait_s: float) -> EventPage:
        """Events of ``ids`` (and their descendants; ``None`` = every job) after ``cursor`` at
        ``level``, waiting up to ``wait_s`` for one when there is none yet.

        Raises:
            UsageError: an unknown level.
        """
        if level not in EVENT_LEVELS:
            raise UsageError(f"unknown level {level!r}; use {', '.join(EVENT_LEVELS)}")
        kinds = EVENT_LEVELS[level]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            out, cursor = self._scan(ids, cursor, kinds)
            left = deadline - loop.time()
            if out or left <= 0:
                return {"events": out, "cursor": cursor}
            await self._pulse.wait(left)

    def _scan(
        self, ids: set[str] | None, cursor: int, kinds: frozenset[str]
    ) -> tuple[list[dict[str, Any]], int]:
        out = []
        for pos in range(cursor, len(self._log)):
            chain, kind, env = self._log[pos]
            if (ids is None or not ids.isdisjoint(chain)) and kind in kinds:
                out.append(env)
                if len(out) >= PAGE_LIMIT:
                    return out, pos + 1
        return out, len(self._log)
