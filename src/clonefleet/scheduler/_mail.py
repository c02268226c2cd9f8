"""The scheduler's part in messaging: it knows where each job runs, so it routes deliveries.

The inbox actor owns the deliveries (``clonefleet.inbox``); it hands the queued ones here
(:meth:`Mailroom.route`) in batches. A running job's deliveries go to its clone host in one call
per host; a job not started yet keeps them until its host accepts it. Acknowledgements (a clone's
``message_delivered`` events) and job endings go back to the inbox in batches, so thousands of
clones cost a few calls, never one per clone per turn. A clone restarted from a checkpoint gets
again what its checkpoint's context lacks (:meth:`InboxLink.resend`); the clone skips what it has.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from clonefleet.clone import state_of
from clonefleet.errors import ClonefleetError, ClusterError, UnknownJobError, UsageError
from clonefleet.host import HostCalls
from clonefleet.scheduler._hosts import HostPool
from clonefleet.scheduler._table import JobTable
from clonefleet.vocab import EventType

__all__ = ["InboxLink", "Mailroom", "check_message"]

FLUSH_S = 0.05
"""How long acknowledgements and endings gather before they go to the inbox in one call."""

MAX_TRIES = 200
"""Flushes tried in a row while the inbox does not answer (10 s) before they are given up."""


class InboxLink(Protocol):
    """What the scheduler needs of the inbox."""

    async def acked(self, delivery_ids: list[str]) -> None: ...
    async def ended(self, job_ids: list[str]) -> list[dict[str, Any]]:
        """Mark the queued deliveries of ended jobs undelivered; returns them."""
        ...

    async def resend(self, jobs: list[tuple[str, list[str]]]) -> None:
        """Route again each job's deliveries missing from ``have`` (restarted clones)."""
        ...


def check_message(
    table: JobTable,
    job_id: str,
    text: str,
    refs: Sequence[str],
    sender: str | None = None,
) -> None:
    """Whether ``text`` may go to ``job_id``: the job exists and has not ended, every
    ``@skill:`` reference names a skill its definition lets its model load, and a ``sender``
    job (a clone's ``message_subagent``) is one of its ancestors.

    Raises:
        UnknownJobError: no such job.
        UsageError: the job has ended, or a reference is refused (nothing is queued).
    """
    rec = table.jobs.get(job_id)
    if rec is None:
        raise UnknownJobError(job_id)
    if rec.is_terminal:
        raise UsageError(f"job {job_id} has already ended ({rec.state}); it takes no messages")
    if sender is not None and not _descends(table, job_id, sender):
        raise UsageError(f"job {job_id} is not a subagent of {sender}; a clone messages its own")
    spec = table.spec_of(job_id)
    allowed = {name for name, _, _ in spec.available_skills} if spec is not None else set()
    for name in refs:
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise UsageError(
                f"@skill:{name} is not a skill job {job_id} may load (its definition's"
                f" skill policy allows: {known}); the message was not queued"
            )


def _descends(table: JobTable, job_id: str, ancestor: str) -> bool:
    rec = table.jobs.get(job_id)
    for _ in range(64):  # nesting is bounded by limits.max_depth; so is this walk
        if rec is None or rec.parent is None:
            return False
        if rec.parent == ancestor:
            return True
        rec = table.jobs.get(rec.parent)
    return False


class Mailroom:
    """Routing state of one scheduler.

    Args:
        table: the job table.
        hosts: the host pool (where each job runs, and whether it started there).
        record: logs one event of a job.
        spawn: runs a coroutine as a background task of the scheduler.
    """

    def __init__(
        self,
        table: JobTable,
        hosts: HostPool,
        record: Callable[[str, dict[str, Any]], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._table, self._hosts, self._record, self._spawn = table, hosts, record, spawn
        self.link: InboxLink | None = None
        self._waiting: dict[str, list[dict[str, Any]]] = {}
        """Deliveries of jobs whose host has not accepted them yet."""
        self._known: dict[str, dict[str, str]] = {}
        """Each job's deliveries and their state as this scheduler saw them."""
        self._acks: list[str] = []
        self._ended: list[str] = []
        self._flushing = False
        self._tries = 0

    # -- from the inbox ----------------------------------------------------------------------
    async def route(self, items: Sequence[Mapping[str, Any]]) -> list[str]:
        """Send deliveries to their clones; returns the job ids that have already ended (the
        inbox marks their deliveries undelivered)."""
        ended: list[str] = []
        per_host: dict[str, tuple[HostCalls, list[dict[str, Any]]]] = {}
        for raw in items:
            item = {"delivery_id": str(raw["delivery_id"]), "job_id": str(raw["job_id"])}
            item["text"] = str(raw["text"])
            job_id = item["job_id"]
            rec = self._table.jobs.get(job_id)
            if rec is not None:
                self._note(job_id, item["delivery_id"], "queued")  # even if it ended just now
            if rec is None or rec.is_terminal:
                ended.append(job_id)
                continue
            host = self._hosts.host_of(job_id)
            if host is not None and self._hosts.has_started(host, job_id):
                per_host.setdefault(host.host_id, (host, []))[1].append(item)
            else:
                self._waiting.setdefault(job_id, []).append(item)
        for host, batch in per_host.values():
            await self._hand(host, batch)
        return sorted(set(ended))

    async def _hand(self, host: HostCalls, batch: list[dict[str, Any]]) -> None:
        try:
            await host.deliver(batch)
        except ClusterError:
            # The host died: its clones restart elsewhere and get these again (resend).
            for item in batch:
                self._waiting.setdefault(item["job_id"], []).append(item)

    def _note(self, job_id: str, delivery_id: str, state: str) -> None:
        """Count a delivery's state into its job (and log the event) once per state."""
        known = self._known.setdefault(job_id, {})
        before = known.get(delivery_id)
        if before == state or before in ("delivered", "undelivered"):
            return
        known[delivery_id] = state
        rec = self._table.jobs.get(job_id)
        if rec is None:
            return
        if before is not None:
            rec.messages[before] -= 1
        rec.messages[state] += 1
        kind = {"queued": EventType.MESSAGE_QUEUED, "undelivered": EventType.MESSAGE_UNDELIVERED}
        if state in kind:
            event = {"type": str(kind[state]), "ts": time.time(), "delivery_id": delivery_id}
            self._record(job_id, event)

    def note_undelivered(self, job_id: str, delivery_id: str) -> None:
        """The inbox marked a delivery undelivered (its job ended before taking it)."""
        self._note(job_id, delivery_id, "undelivered")

    # -- from the hosts ----------------------------------------------------------------------
    def started(self, host: HostCalls, job_ids: Sequence[str], resumed: Mapping[str, Any]) -> None:
        """A host accepted these jobs: hand it what waited for them. A clone started again (its
        host died, or the scheduler restarted) also asks the inbox for what its checkpoint
        lacks: everything, when it restarted before its first checkpoint (the clone that died
        may have taken deliveries that no checkpoint recorded)."""
        batch = [item for j in job_ids for item in self._waiting.pop(j, ())]
        if batch:
            self._spawn(self._hand(host, batch))
        again = [
            (j, list((state_of(resumed.get(j)) or {}).get("delivered") or []))
            for j in job_ids
            if j in resumed or self._restarted(j)
        ]
        if again and self.link is not None:
            self._spawn(self._resend(again))

    def _restarted(self, job_id: str) -> bool:
        rec = self._table.jobs.get(job_id)
        return rec is not None and rec.restarts > 0

    async def _resend(self, jobs: list[tuple[str, list[str]]]) -> None:
        if self.link is not None:
            try:
                await self.link.resend(jobs)
            except ClonefleetError:
                pass  # the inbox routes every queued delivery again when it restarts

    def delivered(self, job_id: str, delivery_id: str) -> None:
        self._note(job_id, delivery_id, "delivered")
        if self.link is not None:
            self._acks.append(delivery_id)
            self._soon()

    def ended(self, job_id: str) -> None:
        self._waiting.pop(job_id, None)
        if self.link is not None and job_id in self._known:
            self._ended.append(job_id)
            self._soon()

    def _soon(self) -> None:
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        """Acknowledgements and endings of the last :data:`FLUSH_S` in one call each."""
        await asyncio.sleep(FLUSH_S)
        self._flushing = False
        acks, self._acks = self._acks, []
        ended, self._ended = self._ended, []
        link = self.link
        if link is None:
            return
        try:
            if acks:
                await link.acked(acks)
            if ended:
                for item in await link.ended(ended):
                    self._note(str(item["job_id"]), str(item["delivery_id"]), "undelivered")
        except ClonefleetError:
            # The inbox is restarting: try again for a while. Past that it rebuilds from its
            # journal and routes its queued deliveries again, which tells it which jobs ended.
            self._tries += 1
            if self._tries <= MAX_TRIES:
                self._acks[:0], self._ended[:0] = acks, ended
                self._soon()
            return
        self._tries = 0
