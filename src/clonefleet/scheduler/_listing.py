"""Listing jobs a page at a time: the order of the job table, cursors into it, and one page.

The live scheduler (``_queries.py``) and the journal's offline view (``_offline.py``) both answer
``list_jobs`` with :func:`page_jobs`, so a listing of 100,000 jobs comes a bounded page per reply.
A cursor names where the next page starts in the sequence the listing walks: the whole table
(``j:``), one batch's jobs (``b:``) or one job's children (``p:``); it stays good while jobs are
added and finished batches are evicted, for the life of the scheduler that gave it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Container, Mapping, Sequence

from clonefleet import control as api
from clonefleet.errors import UsageError
from clonefleet.scheduler._state import JobRecord

__all__ = ["MAX_PAGE", "JobOrder", "check_limit", "page_jobs"]

MAX_PAGE = 10_000
"""Most jobs one page holds, whatever ``limit`` asks."""


class JobOrder:
    """Every job id in the order it entered the table, each with a number that never changes
    (so a cursor survives the eviction of jobs before it)."""

    def __init__(self, ids: Sequence[str] = ()) -> None:
        self.ids: list[str] = list(ids)
        self._seqs: list[int] = list(range(len(self.ids)))
        self._next = len(self.ids)
        self._gone = 0

    def add(self, job_id: str) -> None:
        self.ids.append(job_id)
        self._seqs.append(self._next)
        self._next += 1

    def forget(self, count: int, alive: Container[str]) -> None:
        """``count`` jobs left the table; once they are half the order, it drops them."""
        self._gone += count
        if self._gone * 2 <= len(self.ids):
            return
        kept = [(s, j) for s, j in zip(self._seqs, self.ids, strict=True) if j in alive]
        self._seqs, self.ids = [s for s, _ in kept], [j for _, j in kept]
        self._gone = 0

    def position(self, seq: int) -> int:
        return bisect_left(self._seqs, seq)

    def seq_at(self, position: int) -> int:
        return self._seqs[position] if position < len(self._seqs) else self._next


def check_limit(limit: object, most: int = MAX_PAGE) -> int | None:
    """A page size: ``None``, or a whole number of 1 or more (above ``most`` reads as ``most``).

    Raises:
        UsageError: anything else.
    """
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UsageError(f"limit must be a whole number of 1 or more, got {limit!r}")
    return min(limit, most)


def _start(cursor: object, kind: str) -> int:
    if cursor is None:
        return 0
    text = str(cursor)
    head, sep, number = text.partition(":")
    if sep and head == kind and number.isdigit():
        return int(number)
    raise UsageError(
        f"cursor {text[:40]!r} was not given by this listing: pass the `next_cursor` of the "
        "previous page, with the same filters"
    )


def page_jobs(
    jobs: Mapping[str, JobRecord],
    filters: api.JobFilter,
    *,
    order: JobOrder,
    batches: Mapping[str, Sequence[str]],
    children: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[JobRecord], str | None]:
    """The jobs matching ``filters`` after its ``cursor``, at most its ``limit`` of them, and the
    cursor of the next page (``None`` when none is left).

    A batch filter walks only that batch's jobs, a parent filter (given ``children``) only that
    job's children; other listings walk the whole table in ``order``.

    Raises:
        UsageError: a bad ``limit``, or a cursor of another listing.
    """
    limit = check_limit(filters.get("limit"))
    status, batch = filters.get("status"), filters.get("batch")
    agent, parent, key = filters.get("agent"), filters.get("parent"), filters.get("key")
    ids: Sequence[str]
    if batch is not None:
        kind, ids = "b", batches.get(batch, ())
    elif parent is not None and children is not None:
        kind, ids = "p", children.get(parent, ())
    else:
        kind, ids = "j", order.ids
    start = _start(filters.get("cursor"), kind)
    pos = order.position(start) if kind == "j" else start
    rows: list[JobRecord] = []
    end = len(ids)
    while pos < end and (limit is None or len(rows) < limit):
        rec = jobs.get(ids[pos])
        pos += 1
        if (
            rec is not None
            and (status is None or rec.state == status)
            and (batch is None or rec.batch_id == batch)
            and (agent is None or rec.agent == agent)
            and (parent is None or rec.parent == parent)
            and (key is None or rec.key == key)
        ):
            rows.append(rec)
    if pos >= end:
        return rows, None
    return rows, f"{kind}:{order.seq_at(pos) if kind == 'j' else pos}"
