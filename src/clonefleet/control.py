"""The job-control API, declared once: :class:`JobControl`.

Everyone who controls jobs speaks this protocol: the scheduler core implements it, the scheduler
actor and a clone's actor-backed control forward it over Ray, :class:`~clonefleet.Fleet` offers
its synchronous twin (same names and parameters), and each job tool of a spawning clone calls one
of its methods (``docs/architecture.md``). This module imports nothing but the standard library,
so every layer may import it.

Ids: a job id is ``sa_`` + 8 hex digits, a batch id ``b_`` + 8 hex digits. Methods taking
``ids`` accept both; a batch id stands for every job of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypedDict, Unpack

__all__ = [
    "BlockResult",
    "Capacity",
    "EventPage",
    "EventQuery",
    "JobControl",
    "JobFilter",
    "JobListing",
    "JobStatus",
    "RunRecord",
    "Seconds",
    "Submitted",
    "Target",
    "UsageTotals",
]

JobStatus = dict[str, Any]
"""A job's status view: ids, ``key``, ``status``, ``outcome``, ``model``, ``turns``, ``usage``,
``progress``, ``parent``, placement and timestamps (``docs/json.md``)."""

RunRecord = dict[str, Any]
"""A finished job's ``run --json`` record: the fields of
:data:`clonefleet.vocab.RUN_RECORD_FIELDS`, in that order."""


Seconds = float | None
"""A length of time in seconds; ``None`` = no limit of that kind."""


Target = str | None
"""A batch or job id whose events to read; ``None`` = every job's."""


class JobFilter(TypedDict, total=False):
    """Filters of :meth:`JobControl.list_jobs`; a filter left out or ``None`` matches every job.
    ``cursor`` and ``limit`` page through the matches."""

    status: str | None
    """A :class:`~clonefleet.vocab.JobState` value."""
    batch: str | None
    """A batch id."""
    agent: str | None
    """A definition name."""
    parent: str | None
    """The job id of the spawning job."""
    key: str | None
    """The key of a job's dataset row (``--inputs``); jobs of counted batches have none."""
    cursor: str | None
    """Where the previous page ended (its ``next_cursor``); ``None`` = from the first job. Pass
    the same filters as that page's listing."""
    limit: int | None
    """Most jobs in the reply (1 to 10,000; more is read as 10,000); ``None`` = every match."""


class EventQuery(TypedDict, total=False):
    """Options of :meth:`JobControl.events`."""

    cursor: int
    """Where the last page ended (default ``0``: from the start)."""
    limit: int
    """Most events in the page (default and most: 5,000)."""
    level: str
    """A key of :data:`clonefleet.vocab.EVENT_LEVELS` (default ``lifecycle``)."""
    wait_s: float
    """When no event is there yet, wait up to this long for one (default ``0``)."""


class Submitted(TypedDict):
    """A batch that was accepted: its id and one job id per clone, in clone order."""

    batch_id: str
    job_ids: list[str]


class BlockResult(TypedDict):
    """The outcome of waiting on jobs."""

    done: bool
    """Every job has reached a terminal state."""
    jobs: list[JobStatus]
    """The status of each job waited on, in the order asked (batch ids expanded)."""


class Capacity(TypedDict):
    """Slots of the fleet: jobs running, the fleet-wide cap (``None`` = none) and jobs queued."""

    running: int
    max_concurrency: int | None
    queued: int


class UsageTotals(TypedDict):
    """Token usage and cost summed per batch and for the fleet (``docs/json.md``)."""

    fleet: dict[str, Any]
    """``input_tokens``, ``output_tokens``, ``total_tokens``, ``cache_read_tokens``,
    ``cache_write_tokens`` (both parts of ``input_tokens``), ``cost_usd`` (cache reads and writes
    at their own prices), ``unpriced_tokens`` of every batch in the table."""
    batches: dict[str, dict[str, Any]]
    """The same per batch, plus ``jobs``, ``budget`` and ``open`` (it may take more parts), for
    each batch with a job in the page (or the batch filtered on)."""


class JobListing(TypedDict):
    """One page of the jobs that matched a listing, the fleet's capacity and usage totals."""

    jobs: list[JobStatus]
    capacity: Capacity
    totals: UsageTotals
    next_cursor: str | None
    """Pass as ``cursor`` for the next page; ``None`` when this page ends the listing."""


class EventPage(TypedDict):
    """Events after a cursor, and the cursor to read on from."""

    events: list[dict[str, Any]]
    """``subagent_event`` envelopes; a descendant's event arrives wrapped once per ancestor."""
    cursor: int


class JobControl(Protocol):
    """What may be asked of the scheduler about jobs.

    Every method may also raise :class:`~clonefleet.errors.ClusterError` when it crosses Ray and
    the scheduler cannot be reached.
    """

    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> Submitted:
        """Start a batch on behalf of a running clone (the ``subagent`` tool).

        The child batch inherits its parent batch's config, simulation script and definitions;
        its launch directory defaults to the parent's and may not leave it.

        A fork spawn (a parent whose subagent provider is ``fork``) runs the parent's own
        definition, one level down as any child, starting from the parent's completed turns
        (``docs/prompt-cache.md``, "Fork spawns").

        Args:
            request: the ``subagent`` tool's arguments: ``prompt``, ``subagent_type``
                (default ``_default``), ``count``, ``model_override``, ``cwd``; for a fork also
                ``fork``: the parent's completed turns as plain messages (``messages``, the
                checkpoint's shape), the tools it shows in full (``visible``) and the model it
                is on (``model``), which the fork tool adds (``subagent_type`` and
                ``model_override`` are then not read).
            parent_job_id: the spawning job; it must be running.

        Returns:
            The new batch's id and job ids.

        Raises:
            UnknownJobError: no such parent job.
            UsageError: parent not running, depth past ``limits.max_depth``, bad count or cwd,
                a malformed ``fork`` part or one from a parent that does not fork.
            DefinitionError: unknown agent or render failure (nothing started).
        """
        ...

    async def job_status(self, job_id: str) -> JobStatus:
        """A job's current status.

        Raises:
            UnknownJobError: no such job.
        """
        ...

    async def job_result(self, job_id: str) -> RunRecord:
        """A finished job's ``run --json`` record.

        Raises:
            UnknownJobError: no such job.
            UsageError: the job has not finished yet.
        """
        ...

    async def job_cancel(self, job_id: str) -> JobStatus:
        """Cancel a job and its descendants; idempotent.

        Returns:
            The job's status right after the request (a running job ends once its clone stops).

        Raises:
            UnknownJobError: no such job.
        """
        ...

    async def cancel_many(self, ids: Sequence[str]) -> int:
        """Cancel jobs (or batches' jobs) and all their descendants; idempotent.

        Queued jobs end ``cancelled`` at once; running ones end once their clones stop.

        Returns:
            How many of the jobs were still running.

        Raises:
            UnknownJobError: an id names no job or batch.
        """
        ...

    async def job_block(
        self, job_ids: Sequence[str], wait_seconds: Seconds = None, timeout_seconds: Seconds = None
    ) -> BlockResult:
        """Wait until every job (or batch's job) is terminal, or the time is up.

        Args:
            job_ids: job or batch ids.
            wait_seconds: wait at most this long (a poll slice).
            timeout_seconds: wait at most this long; the shorter of the two wins, and without
                either the wait ends after an hour.

        Raises:
            UnknownJobError: an id names no job or batch.
        """
        ...

    async def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        """How many of the jobs (or batches' jobs) have not ended, after waiting up to
        ``wait_seconds`` for them to.

        Raises:
            UnknownJobError: an id names no job or batch.
        """
        ...

    async def list_jobs(self, **filters: Unpack[JobFilter]) -> JobListing:
        """Jobs matching every filter given (see :class:`JobFilter`), in the order they were
        submitted, with the fleet's capacity and usage totals; a page of at most ``limit`` of
        them after ``cursor`` when given.

        Raises:
            UsageError: a ``limit`` below 1, or a ``cursor`` this listing did not give.
        """
        ...

    async def expand(self, ids: Sequence[str]) -> list[str]:
        """Job ids, with each batch id replaced by its jobs' ids (in clone order).

        Raises:
            UnknownJobError: an id names no job or batch.
        """
        ...

    async def events(self, target: Target = None, **query: Unpack[EventQuery]) -> EventPage:
        """Events of a batch or job (and its descendants), or of every job, after ``cursor``.

        Args:
            target: a batch or job id; ``None`` for every job.
            query: ``cursor``, ``level``, ``limit`` and ``wait_s`` (see :class:`EventQuery`).

        Raises:
            UnknownJobError: ``target`` names no job or batch.
            UsageError: an unknown level, or a ``limit`` below 1.
        """
        ...
