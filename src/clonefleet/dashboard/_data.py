"""What the dashboard reads from the fleet, and the JSON views it makes of it.

Every read of the scheduler goes through the few blocking functions here (``read_*``), so a
change in what :class:`~clonefleet.Fleet` offers is adapted in this one module; the rest are pure
functions on a :class:`Snapshot`. This module does not know about HTTP or the event loop: the
server runs the ``read_*`` functions in worker threads.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Unpack

from clonefleet.control import (
    EventPage,
    EventQuery,
    JobFilter,
    JobListing,
    JobStatus,
    RunRecord,
    Target,
)
from clonefleet.errors import ClonefleetError, UsageError
from clonefleet.vocab import RUN_RECORD_FIELDS, JobState

__all__ = [
    "DataSource",
    "Snapshot",
    "check_job_id",
    "jobs_page",
    "overview",
    "rate_row",
    "read_events",
    "read_job",
    "read_rate_limits",
    "read_snapshot",
]

MAX_JOBS = 100_000
"""Jobs a snapshot holds; past it the newest batches' jobs are kept and ``truncated`` is set."""
MAX_BATCHES = 200
"""Batches the overview lists (newest first)."""
MAX_PAGE = 500
"""The largest ``limit`` of a job page."""
DEFAULT_PAGE = 100
MAX_EVENTS = 200
"""Events one events page returns (the rest come with the next cursor)."""
TEXT_LIMIT = 2_000
"""Characters kept of any one string shown (errors, progress, event fields)."""
RESULT_LIMIT = 20_000
"""Characters kept of a finished job's result, as text."""
STATES = tuple(s.value for s in JobState)
_JOB_ID = re.compile(r"sa_[0-9a-f]{8}")
_TOKENS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
"""The usage counters shown (the cache's two are parts of ``input_tokens``; absent = 0)."""
_DETAIL_ONLY = frozenset({"result", "salvaged", "nonconforming", "concerns", "warnings", "cause"})
"""Run-record fields only a job's detail shows."""
_ROW_FIELDS = tuple(f for f in RUN_RECORD_FIELDS if f not in _DETAIL_ONLY) + (
    "display_name",
    "parent",
    "created_at",
    "started_at",
    "ended_at",
)
ENDED = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class DataSource(Protocol):
    """The part of :class:`~clonefleet.Fleet` the dashboard reads (a ``Fleet`` is one).

    The calls block; each must fail within its own deadline (a ``Fleet`` does). A source may
    also offer ``rate_limits()`` (a ``Fleet`` does); without it the rate-limit panel is empty.
    """

    def list_jobs(self, **filters: Unpack[JobFilter]) -> JobListing: ...

    def job_status(self, job_id: str) -> JobStatus: ...

    def job_result(self, job_id: str) -> RunRecord: ...

    def events(self, target: Target = None, **query: Unpack[EventQuery]) -> EventPage: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The fleet's jobs as read at one moment, with the views made of them."""

    jobs: tuple[dict[str, Any], ...]
    """Table rows (clipped), newest batch first, then by clone index."""
    batches: tuple[dict[str, Any], ...]
    """One summary per batch, newest first (at most :data:`MAX_BATCHES`)."""
    usage: dict[str, Any]
    """Totals over every job: tokens, cost when known, jobs by status."""
    capacity: dict[str, Any]
    agents: tuple[str, ...]
    """Definition names that have jobs, sorted (the agent filter's choices)."""
    fetched_at: float
    """Unix seconds."""
    truncated: bool = False
    """More than :data:`MAX_JOBS` jobs: the oldest batches were left out."""
    rate_limits: tuple[dict[str, Any], ...] = ()
    """The fleet's rate limits, one row per provider and model scope (:func:`rate_row`)."""
    keyed: bool = False
    """Some job has a dataset row key (its batch was mapped over ``--inputs``): the job table
    shows a key column."""


def clip(value: Any, limit: int = TEXT_LIMIT, depth: int = 6) -> Any:
    """``value`` made safe to send: strings cut to ``limit`` characters, containers to 100
    entries, nesting to ``depth`` levels; anything that is not JSON becomes its ``str``."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + f"… ({len(value) - limit} more)"
    if depth <= 0:
        return "…"
    if isinstance(value, Mapping):
        items = list(value.items())[:100]
        return {str(k)[:100]: clip(v, limit, depth - 1) for k, v in items}
    if isinstance(value, list | tuple):
        return [clip(v, limit, depth - 1) for v in value[:100]]
    return clip(str(value), limit, depth)


def _row(job: Mapping[str, Any]) -> dict[str, Any]:
    row = {name: clip(job.get(name)) for name in _ROW_FIELDS}
    usage = job.get("usage") or {}
    row["usage"] = {k: int(usage.get(k) or 0) for k in _TOKENS}
    progress = job.get("progress")
    summary = progress.get("summary") if isinstance(progress, Mapping) else progress
    row["progress"] = clip(summary if summary is None else str(summary), 300)
    row["cost_usd"] = _number(job.get("cost_usd"))
    return row


def _batches(
    rows: Iterable[dict[str, Any]], totals: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """One summary per batch: counts by status, tokens, cost and budget (the scheduler's
    totals where it gave them, else summed here), first start and last end."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        b = out.get(r["batch_id"])
        if b is None:
            b = out[r["batch_id"]] = {
                "batch_id": r["batch_id"],
                "agent": r["agent"],
                "parent": r["parent"],
                "total": 0,
                "counts": dict.fromkeys(STATES, 0),
                "usage": dict.fromkeys(_TOKENS, 0),
                "cost_usd": None,
                "budget": None,
                "created_at": r["created_at"],
                "ended_at": None,
                "done": False,
            }
        b["total"] += 1
        if r["cost_usd"] is not None:
            b["cost_usd"] = (b["cost_usd"] or 0.0) + r["cost_usd"]
        b["counts"][r["status"]] = b["counts"].get(r["status"], 0) + 1
        for k in _TOKENS:
            b["usage"][k] += r["usage"][k]
        b["created_at"] = min(b["created_at"] or 0.0, r["created_at"] or 0.0)
        b["ended_at"] = max(b["ended_at"] or 0.0, r["ended_at"] or 0.0)
    for b in out.values():
        ended = sum(b["counts"][s] for s in ENDED)
        b["done"] = ended == b["total"]
        b["ended_at"] = b["ended_at"] if b["done"] else None
        given = totals.get(b["batch_id"])
        if isinstance(given, Mapping):
            b["usage"].update({k: int(given.get(k) or 0) for k in _TOKENS})
            b["cost_usd"] = _number(given.get("cost_usd"))
            b["budget"] = clip(given.get("budget"))
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _usage(rows: Iterable[dict[str, Any]], fleet: Any) -> dict[str, Any]:
    """Totals over the fleet: the scheduler's (``fleet``) where it gave them, else summed here;
    jobs by status."""
    totals: dict[str, Any] = {"jobs": 0, **dict.fromkeys(_TOKENS, 0), "cost_usd": None}
    totals["unpriced_tokens"] = None
    totals["by_status"] = dict.fromkeys(STATES, 0)
    for r in rows:
        totals["jobs"] += 1
        totals["by_status"][r["status"]] = totals["by_status"].get(r["status"], 0) + 1
        for k in _TOKENS:
            totals[k] += r["usage"][k]
        if r["cost_usd"] is not None:
            totals["cost_usd"] = (totals["cost_usd"] or 0.0) + r["cost_usd"]
    if isinstance(fleet, Mapping):
        totals.update({k: int(fleet.get(k) or 0) for k in (*_TOKENS, "unpriced_tokens")})
        totals["cost_usd"] = _number(fleet.get("cost_usd"))
    return totals


MAX_SCOPES = 200
"""Rate-limit rows a snapshot keeps."""
_RATE_NUMBERS = (
    "rpm_limit",
    "tpm_limit",
    "max_in_flight",
    "rpm_now",
    "tpm_now",
    "in_flight",
    "waiting",
    "rate_limited",
    "rate_limited_last_min",
    "paused_s",
)


def rate_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A rate-limit row (docs/json.md, "Rate limits") made safe to send: its names clipped,
    its numbers numbers (or ``null``), and ``label``: ``provider/model``, or the provider."""
    provider, model = clip(row.get("provider"), 200), clip(row.get("model"), 200)
    scope = clip(row.get("scope"), 400)
    out: dict[str, Any] = {
        "scope": scope,
        "provider": provider,
        "model": model,
        "label": f"{provider}/{model}" if model else str(provider or scope or "?"),
        "source": clip(row.get("source"), 40),
    }
    out.update({k: _number(row.get(k)) for k in _RATE_NUMBERS})
    return out


def read_rate_limits(source: object) -> tuple[dict[str, Any], ...]:
    """The source's rate-limit rows (``Fleet.rate_limits``; blocking); none from a source
    without them or when the read fails (the job table is shown all the same)."""
    read = getattr(source, "rate_limits", None)
    if not callable(read):
        return ()
    try:
        rows = read()
    except ClonefleetError:
        return ()
    return tuple(rate_row(r) for r in list(rows)[:MAX_SCOPES] if isinstance(r, Mapping))


def read_snapshot(source: DataSource, clock: Callable[[], float] = time.time) -> Snapshot:
    """Read every job once and build the views (blocking: run it off the event loop).

    Raises:
        ClonefleetError: what the source raises (``ClusterError`` when the scheduler does not
            answer, ``SchedulerUnavailable`` while it restarts).
    """
    listing = source.list_jobs()
    rows = [_row(j) for j in listing["jobs"]]
    # Usage totals (with cost and budgets) came with paged listings; a source without them
    # (an older scheduler, a journal) gets sums of its jobs' usage instead.
    given: Mapping[str, Any] = listing
    totals: Mapping[str, Any] = given.get("totals") or {}
    batches = _batches(rows, totals.get("batches") or {})
    newest = sorted(batches.values(), key=lambda b: (-(b["created_at"] or 0.0), b["batch_id"]))
    order = {b["batch_id"]: i for i, b in enumerate(newest)}
    rows.sort(key=lambda r: (order[r["batch_id"]], r["clone_index"] or 0))
    truncated = len(rows) > MAX_JOBS
    return Snapshot(
        jobs=tuple(rows[:MAX_JOBS]),
        batches=tuple(newest[:MAX_BATCHES]),
        usage=_usage(rows, totals.get("fleet")),
        capacity=dict(listing["capacity"]),
        agents=tuple(sorted({r["agent"] for r in rows if r["agent"]})),
        fetched_at=clock(),
        truncated=truncated,
        rate_limits=read_rate_limits(source),
        keyed=any(r["key"] is not None for r in rows),
    )


def overview(snap: Snapshot) -> dict[str, Any]:
    """What every page shows: batches, usage totals, capacity, the agent names and the rate
    limits."""
    return {
        "batches": list(snap.batches),
        "usage": snap.usage,
        "capacity": snap.capacity,
        "agents": list(snap.agents),
        "rate_limits": list(snap.rate_limits),
        "fetched_at": snap.fetched_at,
        "truncated": snap.truncated,
    }


def _whole(text: str | None, name: str, default: int, low: int, high: int) -> int:
    if text in (None, ""):
        return default
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise UsageError(f"`{name}` must be a whole number from {low} to {high}")
    return int(text)


def jobs_page(snap: Snapshot, query: Mapping[str, str]) -> dict[str, Any]:
    """One page of the job table: ``status``, ``agent``, ``batch`` and ``key`` filter (empty =
    any), ``cursor`` is where the last page ended, ``limit`` at most :data:`MAX_PAGE`;
    ``keyed`` says whether any job of the fleet has a row key (the table's key column).

    Raises:
        UsageError: an unknown status, or a cursor or limit that is not a whole number in range.
    """
    status, agent, batch, key = (query.get(k) or None for k in ("status", "agent", "batch", "key"))
    if status is not None and status not in STATES:
        raise UsageError(f"unknown status {status[:40]!r}; use one of {', '.join(STATES)}")
    cursor = _whole(query.get("cursor"), "cursor", 0, 0, MAX_JOBS)
    limit = _whole(query.get("limit"), "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    matched = [
        r
        for r in snap.jobs
        if (status is None or r["status"] == status)
        and (agent is None or r["agent"] == agent)
        and (batch is None or r["batch_id"] == batch)
        and (key is None or r["key"] == key)
    ]
    page = matched[cursor : cursor + limit]
    after = cursor + len(page)
    return {
        "jobs": page,
        "total": len(matched),
        "next_cursor": str(after) if after < len(matched) else None,
        "fetched_at": snap.fetched_at,
        "keyed": snap.keyed,
    }


def check_job_id(job_id: str) -> str:
    """``job_id`` when it looks like one (``sa_`` + 8 hex digits).

    Raises:
        UsageError: it does not.
    """
    if not _JOB_ID.fullmatch(job_id):
        raise UsageError("a job id is `sa_` and 8 lowercase hex digits")
    return job_id


def read_job(source: DataSource, job_id: str) -> dict[str, Any]:
    """A job's status view and, once it has ended, its result as text (blocking).

    Raises:
        UnknownJobError: no such job.
        ClonefleetError: what the source raises.
    """
    status = source.job_status(check_job_id(job_id))
    out: dict[str, Any] = {"job": clip(status), "result": None}
    if status.get("status") in ENDED:
        result = source.job_result(job_id).get("result")
        if result is not None:
            text = result if isinstance(result, str) else json.dumps(result, indent=2, default=str)
            out["result"] = clip(text, RESULT_LIMIT)
    return out


def _event_row(env: Mapping[str, Any]) -> dict[str, Any]:
    """An envelope as a flat row: the innermost job's names and its event's fields."""
    inner, depth = env, 0
    while inner.get("event", {}).get("type") == "subagent_event" and depth < 32:
        inner, depth = inner["event"], depth + 1
    event = inner.get("event") or {}
    fields = {k: v for k, v in event.items() if k not in ("type", "ts")}
    return {
        "seq": env.get("seq"),
        "job_id": inner.get("subagent_run_id"),
        "key": clip(inner.get("key"), 200),
        "display_name": clip(inner.get("display_name"), 200),
        "type": clip(event.get("type"), 100),
        "ts": event.get("ts"),
        "fields": clip(fields),
    }


def read_events(
    source: DataSource, job_id: str, cursor: str | None, level: str | None = None
) -> dict[str, Any]:
    """A job's events (and its descendants') after ``cursor``, at most :data:`MAX_EVENTS`
    (blocking). Returns ``{events: [row, ...], cursor: next}``.

    Raises:
        UsageError: a bad cursor or level.
        UnknownJobError: no such job.
    """
    start = _whole(cursor, "cursor", 0, 0, 2**53)
    page = source.events(check_job_id(job_id), cursor=start, level=level or "all", limit=MAX_EVENTS)
    envelopes = page["events"][:MAX_EVENTS]
    if len(envelopes) < len(page["events"]):
        # The page was cut here: go on after the last event shown (the log's cursor semantics).
        next_cursor = int(envelopes[-1]["seq"]) + 1
    else:
        next_cursor = int(page["cursor"])
    return {"events": [_event_row(e) for e in envelopes], "cursor": str(next_cursor)}
