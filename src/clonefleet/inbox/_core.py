"""The inbox: messages to running clones, each a delivery with a durable state (no Ray here).

:class:`InboxCore` is the state of every delivery: ``queued`` (recorded in the journal before the
sender hears so), ``delivered`` (its clone took it into its context at a turn boundary and
acknowledged it) or ``undelivered`` (its job ended first). Deliveries of one job keep the order
they were sent in. The core bounds what waits: a message's size, the queued deliveries of one job
and of the whole fleet (``limits`` in the config). It knows nothing of hosts: the Ray shell
(``remote.py``) routes queued deliveries to clones through the scheduler, which knows where each
job runs, and feeds acknowledgements and job endings back. An acknowledgement wins over an
``undelivered`` inferred from the job's end (it may arrive later). See docs/inbox.md.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from clonefleet.errors import UsageError

__all__ = ["DELIVERY_STATES", "Delivery", "InboxCore", "InboxLimits"]


QUEUED, DELIVERED, UNDELIVERED = "queued", "delivered", "undelivered"
DELIVERY_STATES = (QUEUED, DELIVERED, UNDELIVERED)


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxLimits:
    """How much may wait (``limits.max_message_chars``, ``limits.max_queued_messages_per_job``,
    ``limits.max_queued_messages``)."""

    max_message_chars: int = 100_000
    max_queued_per_job: int = 1_000
    max_queued: int = 100_000


@dataclass(slots=True, kw_only=True)
class Delivery:
    """One message to one job."""

    delivery_id: str
    job_id: str
    seq: int
    """Order of sending, fleet-wide (a job's deliveries enter its context in this order)."""
    text: str
    state: str = QUEUED
    sent_at: float = field(default_factory=time.time)
    settled_at: float | None = None
    """When it was delivered or became undelivered."""

    def view(self) -> dict[str, Any]:
        """What ``Fleet.delivery`` and ``clonefleet message --status`` show (not the text)."""
        return {
            "delivery_id": self.delivery_id,
            "job_id": self.job_id,
            "status": self.state,
            "chars": len(self.text),
            "sent_at": self.sent_at,
            "settled_at": self.settled_at,
        }

    def wire(self) -> dict[str, Any]:
        """What travels to the clone's host."""
        return {"delivery_id": self.delivery_id, "job_id": self.job_id, "text": self.text}


class Recorder(Protocol):
    """Where the core's facts go (the journal)."""

    def append(self, record: dict[str, Any]) -> int: ...


class InboxCore:
    """Every delivery and its state.

    Args:
        limits: the bounds on size and queue lengths.
        journal: receives one record per fact (``None``: nothing is kept).
    """

    def __init__(self, limits: InboxLimits | None = None, journal: Recorder | None = None) -> None:
        self.limits = limits or InboxLimits()
        self.journal = journal
        self.deliveries: dict[str, Delivery] = {}
        self._by_job: dict[str, list[str]] = {}
        self._queued_of: dict[str, int] = {}
        self.queued = 0
        self._seq = 0

    # -- facts -----------------------------------------------------------------------------
    def _record(self, record: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.append(record)

    def accept(self, job_id: str, text: str) -> Delivery:
        """Queue a message (the caller checked the job and its ``@skill:`` references).

        Raises:
            UsageError: the text is empty or too long, or a queue is full.
        """
        self.check(job_id, text)
        delivery = Delivery(
            delivery_id="dl_" + secrets.token_hex(6), job_id=job_id, seq=self._seq, text=text
        )
        self._add(delivery)
        self._record(
            {
                "k": "dq",
                "d": delivery.delivery_id,
                "j": job_id,
                "n": delivery.seq,
                "t": text,
                "at": delivery.sent_at,
            }
        )
        return delivery

    def check(self, job_id: str, text: str) -> None:
        """Whether a message fits the limits (checked before the job is asked about).

        Raises:
            UsageError: the text is empty or too long, or a queue is full.
        """
        limits = self.limits
        if not isinstance(text, str) or not text.strip():
            raise UsageError("a message needs some text")
        if len(text) > limits.max_message_chars:
            raise UsageError(
                f"the message has {len(text):,} characters; limits.max_message_chars is "
                f"{limits.max_message_chars:,}"
            )
        if self._queued_of.get(job_id, 0) >= limits.max_queued_per_job:
            raise UsageError(
                f"job {job_id} already has {limits.max_queued_per_job:,} messages waiting "
                "(limits.max_queued_messages_per_job); wait until it takes some"
            )
        if self.queued >= limits.max_queued:
            raise UsageError(
                f"{limits.max_queued:,} messages are waiting fleet-wide "
                "(limits.max_queued_messages); wait until clones take some"
            )

    def _add(self, delivery: Delivery) -> None:
        self.deliveries[delivery.delivery_id] = delivery
        self._by_job.setdefault(delivery.job_id, []).append(delivery.delivery_id)
        self._seq = max(self._seq, delivery.seq + 1)
        if delivery.state == QUEUED:
            self._queued_of[delivery.job_id] = self._queued_of.get(delivery.job_id, 0) + 1
            self.queued += 1

    def _settle(self, delivery: Delivery, state: str, at: float | None = None) -> None:
        if delivery.state == QUEUED:
            self._queued_of[delivery.job_id] -= 1
            self.queued -= 1
        delivery.state, delivery.settled_at = state, at or time.time()

    def acked(self, delivery_ids: Iterable[str]) -> list[Delivery]:
        """Clones took these into their contexts; returns those whose state changed.

        An acknowledgement is the clone's own word, so it also turns an ``undelivered`` one
        ``delivered``: the inbox marks a job's queued deliveries undelivered when it learns the
        job ended, and after an inbox restart it may learn that (by routing them again) before
        the acknowledgements sent while it was down reach it.
        """
        done = []
        for delivery_id in delivery_ids:
            delivery = self.deliveries.get(delivery_id)
            if delivery is None or delivery.state == DELIVERED:
                continue  # a repeated acknowledgement (after a restart) changes nothing
            self._settle(delivery, DELIVERED)
            self._record({"k": "dd", "d": delivery_id, "at": delivery.settled_at})
            done.append(delivery)
        return done

    def ended(self, job_ids: Iterable[str]) -> list[Delivery]:
        """These jobs ended: their queued deliveries become undelivered (returned)."""
        done = []
        for job_id in job_ids:
            for delivery in self.of_job(job_id):
                if delivery.state == QUEUED:
                    self._settle(delivery, UNDELIVERED)
                    self._record({"k": "du", "d": delivery.delivery_id, "at": delivery.settled_at})
                    done.append(delivery)
        return done

    # -- reading ---------------------------------------------------------------------------
    def of_job(self, job_id: str) -> list[Delivery]:
        """A job's deliveries, in the order they were sent."""
        return [self.deliveries[d] for d in self._by_job.get(job_id, ())]

    def get(self, delivery_id: str) -> Delivery:
        """Raises :class:`UsageError` for an unknown id."""
        delivery = self.deliveries.get(delivery_id)
        if delivery is None:
            raise UsageError(f"unknown delivery id {delivery_id!r}")
        return delivery

    def waiting(self) -> list[Delivery]:
        """Every queued delivery, in sending order."""
        return sorted((d for d in self.deliveries.values() if d.state == QUEUED), key=_by_seq)

    def to_resend(self, job_id: str, have: Iterable[str]) -> list[Delivery]:
        """What a clone restarted from a checkpoint must get again: every delivery of its job
        not ended undelivered and not in the checkpoint's context (``have``), in order."""
        seen = set(have)
        return [
            d for d in self.of_job(job_id) if d.state != UNDELIVERED and d.delivery_id not in seen
        ]

    def counts(self, job_id: str) -> dict[str, int]:
        out = dict.fromkeys(DELIVERY_STATES, 0)
        for delivery in self.of_job(job_id):
            out[delivery.state] += 1
        return out

    def evict_settled(self, before: float) -> int:
        """Forget deliveries settled (delivered or undelivered) before ``before`` (a time);
        returns how many. Their journal records go at the next compaction."""
        gone = [
            d
            for d in self.deliveries.values()
            if d.state != QUEUED and d.settled_at is not None and d.settled_at < before
        ]
        for delivery in gone:
            del self.deliveries[delivery.delivery_id]
            ids = self._by_job.get(delivery.job_id, [])
            ids.remove(delivery.delivery_id)
            if not ids:
                self._by_job.pop(delivery.job_id, None)
                self._queued_of.pop(delivery.job_id, None)
        return len(gone)

    # -- replay ----------------------------------------------------------------------------
    def restore(self, records: Iterable[dict[str, Any]]) -> int:
        """Rebuild from journal records (the journal itself is not written); returns how many
        records made no sense and were skipped."""
        skipped = 0
        for rec in records:
            kind, delivery_id = rec.get("k"), rec.get("d")
            if kind == "dq" and isinstance(delivery_id, str) and delivery_id not in self.deliveries:
                job_id, text, seq = rec.get("j"), rec.get("t"), rec.get("n")
                if isinstance(job_id, str) and isinstance(text, str) and isinstance(seq, int):
                    sent = rec.get("at")
                    at = float(sent) if isinstance(sent, (int, float)) else time.time()
                    self._add(
                        Delivery(
                            delivery_id=delivery_id, job_id=job_id, seq=seq, text=text, sent_at=at
                        )
                    )
                    continue
            elif kind in ("dd", "du") and isinstance(delivery_id, str):
                delivery = self.deliveries.get(delivery_id)
                # `dd` may follow `du`: a late acknowledgement (see `acked`).
                settles = (QUEUED,) if kind == "du" else (QUEUED, UNDELIVERED)
                if delivery is not None and delivery.state in settles:
                    self._settle(
                        delivery, DELIVERED if kind == "dd" else UNDELIVERED, rec.get("at")
                    )
                    continue
            skipped += 1
        return skipped

    def snapshot(self) -> list[dict[str, Any]]:
        """The live state as records (for compaction): settled deliveries keep only their
        state, not their text."""
        out: list[dict[str, Any]] = []
        for d in sorted(self.deliveries.values(), key=_by_seq):
            text = d.text if d.state != UNDELIVERED else ""
            out.append(
                {
                    "k": "dq",
                    "d": d.delivery_id,
                    "j": d.job_id,
                    "n": d.seq,
                    "t": text,
                    "at": d.sent_at,
                }
            )
            if d.state != QUEUED:
                kind = "dd" if d.state == DELIVERED else "du"
                out.append({"k": kind, "d": d.delivery_id, "at": d.settled_at})
        return out


def _by_seq(delivery: Delivery) -> int:
    return delivery.seq
