"""What ``clonefleet run`` shows while its batch runs.

:func:`watch` reads the batch's events page by page and keeps a :class:`Tally` of them; a view
shows it: on a terminal :class:`LiveView` (redrawn at most every :data:`REFRESH_S`), elsewhere
:class:`PlainView` (a line every :data:`PLAIN_EVERY_S`), and :class:`ExecLines` writes the
``exec: progress`` lines. Records are written as each job ends; the end-of-run summary is
:mod:`clonefleet.cli.summary`'s. Text from clones is shown as plain text with control
characters escaped, never read as markup. See docs/cli.md, "``clonefleet run``".
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from clonefleet.config import printable
from clonefleet.errors import ClonefleetError
from clonefleet.vocab import EventType, succeeded

__all__ = [
    "Counts",
    "ExecLines",
    "LiveView",
    "PlainView",
    "ProgressNote",
    "RateLimitPoll",
    "RowsTally",
    "RowsView",
    "Tally",
    "View",
    "Watcher",
    "failure_line",
    "rate_limit_line",
    "render_live",
    "scope_label",
    "shown_scopes",
    "watch",
]

ROLLING_LINES = 6
"""Latest progress lines the live panel shows."""
REFRESH_S = 0.25
"""Least time between two redraws of the live display (at most 4 a second, however many
events arrive), and between two writes of buffered ``exec: progress`` lines."""
PLAIN_EVERY_S = 2.0
"""Least time between two plain progress lines (stderr not a terminal)."""
FAILURES_SHOWN = 50
"""Failures printed as they happen; later ones are only counted (the summary lists them)."""
RATE_WINDOW_S = 20.0
"""Span over which the completion rate (and so the ETA) is measured."""
PAGE_WAIT_S = 0.5
"""How long one read of events waits for the next event: the display is redrawn at least this
often while nothing happens."""
RATE_LIMITS_EVERY_S = 2.0
"""Least time between two reads of the fleet's rate limits for the live display."""
SCOPES_SHOWN = 8
"""Rate-limit lines the live display shows (the rest are counted in one more line)."""

Clock = Callable[[], float]


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` made printable, on one line, at most ``limit`` characters."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressNote:
    """One ``progress_update`` of one clone."""

    job_id: str
    clone_index: int
    progress: dict[str, Any]
    """The tool's arguments (``summary``)."""

    @property
    def line(self) -> str:
        """``#17 sa_1a2b3c4d: reading files`` (printable, one line)."""
        summary = self.progress.get("summary")
        text = summary if isinstance(summary, str) else json.dumps(self.progress, default=str)
        return f"#{self.clone_index} {self.job_id}: {_one_line(text)}"

    @property
    def exec_line(self) -> str:
        """``exec: progress {"job_id": ..., "clone_index": ..., "summary": ...}``."""
        named = {"job_id": self.job_id, "clone_index": self.clone_index}
        return "exec: progress " + json.dumps({**named, **self.progress}, default=str)


def failure_line(record: dict[str, Any], detail: str | None = None, limit: int = 300) -> str:
    """``#3 sa_1a2b3c4d failed (failed): Error: subagent run failed; <detail>``, one line
    (``row k7 sa_1a2b3c4d failed ...`` for a record with a row's key)."""
    status, reason = record["status"], record["stop_reason"]
    head = f"#{record['clone_index']} {record['job_id']} {status}"
    if record.get("key") is not None or record.get("job_id") is None:  # a row of --inputs
        row = "a row" if record.get("key") is None else f"row {_one_line(str(record['key']), 80)}"
        job = f" {record['job_id']}" if record.get("job_id") else ""  # none: it did not run
        head = f"{row}{job} {status}"
    if reason and reason != status:
        head += f" ({reason})"
    what = record["error"] or f"outcome {record['outcome']}"
    if not record["error"] and isinstance(record["result"], dict):
        what += f": {record['result'].get('summary', '')}"
    if detail:
        what += f"; {detail}"
    return f"{head}: {_one_line(what, limit)}"


class Rate:
    """Jobs ended per second over the last :data:`RATE_WINDOW_S`, and the time left."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def sample(self, done: int) -> None:
        now = self._clock()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()

    def per_s(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else None

    def eta_s(self, left: int) -> float | None:
        rate = self.per_s()
        if left == 0:
            return 0.0
        return left / rate if rate else None


def clock_text(seconds: float | None) -> str:
    """``1:02:03``, ``2:03`` or ``-`` for unknown."""
    if seconds is None:
        return "-"
    whole = int(seconds + 0.5)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


# -- rate limits -------------------------------------------------------------------------
def scope_label(row: dict[str, Any]) -> str:
    """``provider/model`` of a rate-limit row (docs/json.md, "Rate limits"), or the provider
    alone for a provider-wide scope; printable."""
    provider = printable(str(row.get("provider") or row.get("scope") or "?"))
    model = row.get("model")
    return f"{provider}/{printable(str(model))}" if model else provider


def _per_minute(now: Any, limit: Any, unit: str) -> str:
    """``1,102 of 1,140 rpm``, or ``1,102 rpm`` with no limit."""
    text = f"{float(now or 0):,.0f}"
    return f"{text} of {float(limit):,.0f} {unit}" if limit is not None else f"{text} {unit}"


def rate_limit_line(row: dict[str, Any]) -> str:
    """One scope on one line: ``p/sim-small  1,102 of 1,140 rpm (headers) · 12 waiting · 3 ×
    429 (1 last min)``; tokens under a limit, slots in flight and a pause only when they say
    something (the tokens of every scope are in ``jobs list``)."""
    rates = [_per_minute(row.get("rpm_now"), row.get("rpm_limit"), "rpm")]
    if row.get("tpm_limit") is not None:
        rates.append(_per_minute(row.get("tpm_now"), row.get("tpm_limit"), "tpm"))
    head = ", ".join(rates)
    source = row.get("source")
    if source and source != "none":
        head += f" ({printable(str(source))})"
    parts = [head]
    in_flight, most = int(row.get("in_flight") or 0), row.get("max_in_flight")
    if most is not None:
        parts.append(f"{in_flight:,} of {int(most):,} in flight")
    elif in_flight:
        parts.append(f"{in_flight:,} in flight")
    if row.get("waiting"):
        parts.append(f"{int(row['waiting']):,} waiting")
    refused = int(row.get("rate_limited") or 0)
    if refused:
        recent = int(row.get("rate_limited_last_min") or 0)
        parts.append(f"{refused:,} × 429" + (f" ({recent:,} last min)" if recent else ""))
    if row.get("paused_s"):
        parts.append(f"paused {float(row['paused_s']):.1f}s")
    return f"{scope_label(row)}  " + " · ".join(parts)


def shown_scopes(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scopes the live display shows: those with a limit in force, a probing window,
    requests waiting or refusals (an open scope nothing limits says nothing)."""
    return [
        r
        for r in rows
        if any(r.get(k) is not None for k in ("rpm_limit", "tpm_limit", "max_in_flight"))
        or r.get("waiting")
        or r.get("rate_limited")
    ]


def _refusal_label(event: dict[str, Any]) -> str:
    """Whom a ``rate_limited`` event's refusal came from: ``provider/model``."""
    return scope_label({"provider": event.get("provider"), "model": event.get("model")})


class Tally:
    """A batch's counts as its events arrive: started, ended, failed; the latest progress
    lines; each job's record and the detail of its ``error`` event."""

    def __init__(
        self, job_ids: Sequence[str], *, batch_id: str = "", clock: Clock = time.monotonic
    ) -> None:
        self.batch_id, self.job_ids = batch_id, tuple(job_ids)
        self.index = {job: i for i, job in enumerate(self.job_ids)}
        self.clock, self.started_at = clock, clock()
        self.ended_at: float | None = None
        """When the watch ended (all jobs ended, or it was interrupted)."""
        self.running: set[str] = set()
        self.records: dict[str, dict[str, Any]] = {}
        self.failed = 0
        self.details: dict[str, str] = {}
        self.latest: deque[ProgressNote] = deque(maxlen=ROLLING_LINES)
        self.rate = Rate(clock)
        self.rate.sample(0)
        self.limits: list[dict[str, Any]] = []
        """The fleet's rate-limit rows as last read (docs/json.md, "Rate limits")."""
        self.rate_limited: Counter[str] = Counter()
        """The batch's requests a provider refused for its rate, by ``provider/model``."""
        self.waiting: set[str] = set()
        """Jobs whose clone host waits for a node (``host_pending``; docs/cluster.md)."""

    @property
    def total(self) -> int:
        return len(self.job_ids)

    @property
    def done(self) -> int:
        return len(self.records)

    @property
    def all_ended(self) -> bool:
        """Whether every job of the batch has its record (records of other jobs do not count)."""
        return self.done >= self.total and all(job in self.records for job in self.job_ids)

    @property
    def queued(self) -> int:
        return max(self.total - self.done - len(self.running) - len(self.waiting), 0)

    @property
    def elapsed_s(self) -> float:
        end = self.clock() if self.ended_at is None else self.ended_at
        return end - self.started_at

    def ordered_records(self) -> list[dict[str, Any]]:
        """The records so far, in clone order."""
        return [self.records[j] for j in self.job_ids if j in self.records]

    def counts_text(self, sep: str = ", ") -> str:
        """``running 5, queued 0, failed 1, 3.2/s, ETA 0:04, elapsed 0:12`` (with ``waiting for
        a node N`` after ``queued`` while hosts wait for the cluster to grow)."""
        rate = self.rate.per_s()
        waiting = (f"waiting for a node {len(self.waiting):,}",) if self.waiting else ()
        parts = (
            f"running {len(self.running):,}",
            f"queued {self.queued:,}",
            *waiting,
            f"failed {self.failed:,}",
            f"{'-' if rate is None else f'{rate:,.1f}'}/s",
            f"ETA {clock_text(self.rate.eta_s(self.total - self.done))}",
            f"elapsed {clock_text(self.elapsed_s)}",
        )
        return sep.join(parts)


class Counts(Protocol):
    """What a plain progress line is made of: a :class:`Tally`, or a :class:`RowsTally`."""

    clock: Clock

    @property
    def done(self) -> int: ...

    @property
    def total(self) -> int: ...

    def counts_text(self, sep: str = ", ") -> str: ...


class RowsTally:
    """An ``--inputs`` run's counts as its rows end: rows done and failed, the rate and the
    time left (nothing kept per row)."""

    def __init__(self, total: int, clock: Clock = time.monotonic) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.clock, self.started_at = clock, clock()
        self.rate = Rate(clock)
        self.rate.sample(0)
        self._sampled = self.started_at

    def ended(self, ok: bool) -> None:
        """Count one row that ended."""
        self.done += 1
        self.failed += not ok
        now = self.clock()
        if now - self._sampled >= REFRESH_S or self.done == self.total:
            self._sampled = now
            self.rate.sample(self.done)

    def counts_text(self, sep: str = ", ") -> str:
        """``failed 1, 3.2/s, ETA 0:04, elapsed 0:12``."""
        rate = self.rate.per_s()
        return sep.join(
            (
                f"failed {self.failed:,}",
                f"{'-' if rate is None else f'{rate:,.1f}'}/s",
                f"ETA {clock_text(self.rate.eta_s(self.total - self.done))}",
                f"elapsed {clock_text(self.clock() - self.started_at)}",
            )
        )


class View(Protocol):
    """Something that shows a batch as it runs."""

    def progress(self, note: ProgressNote) -> None: ...

    def failure(self, record: dict[str, Any], detail: str | None) -> None: ...

    def flush(self, tally: Tally, *, final: bool = False) -> None:
        """Show what changed (called after each page of events; may do nothing yet)."""

    def close(self) -> None: ...


# -- the views ---------------------------------------------------------------------------
MORE_FAILURES = "further failures are only counted; the summary lists them"


class ExecLines:
    """``exec: progress {...}`` lines, written in one piece per flush."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._lines: list[str] = []
        self._last = -math.inf

    def progress(self, note: ProgressNote) -> None:
        self._lines.append(note.exec_line)

    def failure(self, record: dict[str, Any], detail: str | None) -> None:
        pass

    def flush(self, tally: Tally, *, final: bool = False) -> None:
        now = tally.clock()
        if self._lines and (final or now - self._last >= REFRESH_S):
            self._last = now
            text = "\n".join(self._lines) + "\n"
            self._lines.clear()
            self._write(text)

    def close(self) -> None:
        pass


class _FailureFeed:
    """Failure lines waiting to be shown: the first :data:`FAILURES_SHOWN`, then one note."""

    def __init__(self) -> None:
        self.pending: list[str] = []
        self._seen = 0

    def add(self, record: dict[str, Any], detail: str | None) -> None:
        self._seen += 1
        if self._seen <= FAILURES_SHOWN:
            self.pending.append(failure_line(record, detail))
        elif self._seen == FAILURES_SHOWN + 1:
            self.pending.append(MORE_FAILURES)

    def take(self) -> list[str]:
        out, self.pending = self.pending, []
        return out


class PlainView:
    """For a stderr that is not a terminal: each failure as it happens, and
    ``clonefleet: 3/8 done, running 5, queued 0, failed 0, ...`` every few seconds."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._failures = _FailureFeed()
        self._last = -math.inf

    def progress(self, note: ProgressNote) -> None:
        pass

    def failure(self, record: dict[str, Any], detail: str | None) -> None:
        self._failures.add(record, detail)

    def flush(self, tally: Counts, *, final: bool = False) -> None:
        lines = [f"clonefleet: failed {line}" for line in self._failures.take()]
        now = tally.clock()
        if final or now - self._last >= PLAIN_EVERY_S:
            self._last = now
            done = f"{tally.done:,}/{tally.total:,} done"
            lines.append(f"clonefleet: {done}, {tally.counts_text(', ')}")
        if lines:
            self._stream.write("\n".join(lines) + "\n")
            self._stream.flush()

    def close(self) -> None:
        pass


def render_live(tally: Tally, *, final: bool = False) -> RenderableType:
    """The live region: the rolling panel of the latest progress lines over the progress bar
    (the bar alone once the batch has ended)."""
    bar = _bar(tally)
    if final:
        return bar
    notes = list(tally.latest)
    lines: list[RenderableType] = [
        Text.assemble(
            (f"#{n.clone_index} ", "cyan"),
            (f"{n.job_id}", "dim"),
            n.line[len(f"#{n.clone_index} {n.job_id}") :],
            no_wrap=True,
            overflow="ellipsis",
        )
        for n in notes
    ] or [Text("waiting for the first progress update", style="dim")]
    panel = Panel(
        Group(*lines),
        title="latest progress",
        title_align="left",
        height=ROLLING_LINES + 2,
        border_style="dim",
    )
    return Group(panel, *_scope_lines(tally.limits), bar)


def _scope_lines(rows: Sequence[dict[str, Any]]) -> list[RenderableType]:
    """The live display's rate-limit lines: at most :data:`SCOPES_SHOWN`, then a count."""
    shown = shown_scopes(rows)
    out: list[RenderableType] = []
    for row in shown[:SCOPES_SHOWN]:
        line = Text(rate_limit_line(row), no_wrap=True, overflow="ellipsis")
        line.stylize("bold", 0, len(scope_label(row)))
        line.highlight_regex(r"[\d,]+ × 429", "bold red")
        out.append(line)
    if len(shown) > SCOPES_SHOWN:
        out.append(Text(f"{len(shown) - SCOPES_SHOWN:,} more rate-limited scopes", style="dim"))
    return out


def _bar(tally: Tally) -> RenderableType:
    done, total = tally.done, tally.total
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_column(no_wrap=True, justify="right")
    percent = done * 100 // total if total else 100
    grid.add_row(
        Text("jobs", style="bold"),
        ProgressBar(total=max(total, 1), completed=done, finished_style="green"),
        Text(f"{done:,}/{total:,} done {percent}%"),
    )
    counts = Text(tally.counts_text(" · "), no_wrap=True, overflow="ellipsis")
    if tally.failed:
        counts.highlight_regex(r"failed [\d,]+", "bold red")
    return Group(grid, counts)


class LiveView:
    """The live display on a terminal: one ``rich`` live region, redrawn at most every
    :data:`REFRESH_S`; failure lines (and ``--progress-lines``) are printed above it, so
    nothing scrolls it away."""

    def __init__(self, console: Console, tally: Tally) -> None:
        self.console = console
        self._tally = tally
        self._failures = _FailureFeed()
        self._final = False
        self._last = -math.inf
        # stdout is sent above the region only when it is a terminal too: piped `--json`
        # records must stay on stdout.
        self._live = Live(
            self,
            console=self.console,
            auto_refresh=False,
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=True,
        )
        self._live.start(refresh=True)

    def __rich__(self) -> RenderableType:
        return render_live(self._tally, final=self._final)

    def console_write(self, text: str) -> None:
        """Print plain ``text`` above the live region (no markup, no wrapping)."""
        self.console.out(text.rstrip("\n"), highlight=False)

    def progress(self, note: ProgressNote) -> None:
        pass  # the panel reads the tally's latest notes when it is drawn

    def failure(self, record: dict[str, Any], detail: str | None) -> None:
        self._failures.add(record, detail)

    def flush(self, tally: Tally, *, final: bool = False) -> None:
        now = tally.clock()
        if not final and now - self._last < REFRESH_S:
            return
        self._last, self._final = now, final
        lines = self._failures.take()
        if lines:  # one print, one redraw
            self.console.print(
                Group(*(Text(f"failed {line}", style="red", overflow="fold") for line in lines))
            )
        self._live.refresh()

    def close(self) -> None:
        self._live.stop()


class RowsView:
    """What an ``--inputs`` run shows on stderr as its rows end (docs/inputs.md): with
    ``live``, a bar over the rows' total (done of total, failed, elapsed, time left) with
    each failure printed above it; otherwise the plain lines of :class:`PlainView` (each
    failure as it ends, a progress line every :data:`PLAIN_EVERY_S`). Either way the first
    :data:`FAILURES_SHOWN` failures are printed, then only counted."""

    def __init__(
        self, total: int, *, live: bool, stream: TextIO | None = None, clock: Clock = time.monotonic
    ) -> None:
        self.stream = stream or sys.stderr
        self.tally = RowsTally(total, clock)
        self._failures = _FailureFeed()
        self._plain: PlainView | None = None
        self._bar: Any = None
        if not live:
            self._plain = PlainView(self.stream)
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("rows"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(file=self.stream, highlight=False),
        )
        self._task = self._bar.add_task("rows", total=total, failed=0)
        self._bar.start()

    def ended(self, record: dict[str, Any]) -> None:
        """Show that one more row ended with ``record``."""
        ok = succeeded(record)
        self.tally.ended(ok)
        if self._plain is not None:
            if not ok:
                self._plain.failure(record, None)
            self._plain.flush(self.tally, final=self.tally.done == self.tally.total)
            return
        if not ok:
            self._failures.add(record, None)
            for line in self._failures.take():
                self._bar.console.print(Text(f"failed {line}", style="red", overflow="fold"))
        self._bar.update(self._task, advance=1, failed=self.tally.failed)

    def close(self) -> None:
        if self._plain is not None and self.tally.done < self.tally.total:
            self._plain.flush(self.tally, final=True)  # ended early: where it got to
        if self._bar is not None:
            self._bar.stop()


# -- following a batch -------------------------------------------------------------------
def _pages(
    fleet: Any, target: str, all_ended: Callable[[], bool] = lambda: False
) -> Iterator[list[dict[str, Any]]]:
    """The target's lifecycle events page by page until all its jobs have ended (an empty page
    at least every :data:`PAGE_WAIT_S`), as :meth:`Fleet.follow` reads them.

    ``all_ended`` (asked after each page is used) says when the caller has seen every job end:
    then one last page is read without waiting, instead of waiting out a whole empty page.
    """
    cursor = 0
    while True:
        page = fleet.events(target, cursor=cursor, level="lifecycle", wait_s=PAGE_WAIT_S)
        cursor = page["cursor"]
        yield page["events"]
        if all_ended() or (not page["events"] and fleet.remaining([target]) == 0):
            yield fleet.events(target, cursor=cursor, level="lifecycle")["events"]
            return


class RateLimitPoll:
    """Reads the fleet's rate limits into a :class:`Tally` at most every ``every_s`` (one call
    on the scheduler, however often the display is redrawn); a failed read keeps the rows
    read before."""

    def __init__(
        self,
        read: Callable[[], list[dict[str, Any]]],
        clock: Clock = time.monotonic,
        every_s: float = RATE_LIMITS_EVERY_S,
    ) -> None:
        self._read, self._clock, self._every_s = read, clock, every_s
        self._last = -math.inf

    def __call__(self, tally: Tally) -> None:
        now = self._clock()
        if now - self._last < self._every_s:
            return
        self._last = now
        try:
            rows = self._read()
        except ClonefleetError:
            return  # shown again with the next good read
        tally.limits = [r for r in rows if isinstance(r, dict)]


class Watcher:
    """Feeds events into a :class:`Tally`, its views and the record writers; ``poll`` (a
    :class:`RateLimitPoll`) refreshes the tally's rate limits before each redraw."""

    def __init__(
        self,
        tally: Tally,
        views: Sequence[View],
        writers: Sequence[Callable[[dict[str, Any]], None]] = (),
        poll: Callable[[Tally], None] | None = None,
    ) -> None:
        self.tally, self.views, self.writers = tally, tuple(views), tuple(writers)
        self.poll = poll

    def apply(self, env: dict[str, Any]) -> None:
        event, job = env["event"], env["subagent_run_id"]
        kind, tally = event["type"], self.tally
        if kind == EventType.PROGRESS:
            progress = event.get("progress")
            note = ProgressNote(
                job_id=job,
                clone_index=tally.index.get(job, -1),
                progress=progress if isinstance(progress, dict) else {"summary": progress},
            )
            tally.latest.append(note)
            for view in self.views:
                view.progress(note)
        elif kind == EventType.STARTED and job not in tally.records:
            tally.running.add(job)  # once, though a restarted clone starts again
            tally.waiting.discard(job)
        elif kind == EventType.HOST_PENDING and job not in tally.records:
            tally.waiting.add(job)
        elif kind == EventType.ERROR:
            tally.details[job] = _one_line(str(event.get("detail") or ""), 500)
        elif kind == EventType.RATE_LIMITED:
            tally.rate_limited[_refusal_label(event)] += 1
        elif kind == EventType.RESULT:
            self._ended(job, event["record"])

    def _ended(self, job: str, record: dict[str, Any]) -> None:
        tally = self.tally
        tally.running.discard(job)
        tally.waiting.discard(job)
        tally.records[job] = record
        for write in self.writers:
            write(record)
        if not succeeded(record):
            tally.failed += 1
            for view in self.views:
                view.failure(record, tally.details.get(job))

    def page(self, events: list[dict[str, Any]]) -> None:
        for env in events:
            self.apply(env)
        self.tally.rate.sample(self.tally.done)
        if self.poll is not None:
            self.poll(self.tally)
        for view in self.views:
            view.flush(self.tally)

    def close(self) -> None:
        self.tally.ended_at = self.tally.clock()
        for view in self.views:
            view.flush(self.tally, final=True)
        for view in self.views:
            view.close()


def watch(
    fleet: Any,
    batch: Any,
    *,
    as_json: bool = False,
    progress_lines: bool = False,
    writers: Sequence[Callable[[dict[str, Any]], None]] = (),
    stream: TextIO | None = None,
) -> Tally:
    """Follow ``batch`` on ``fleet`` until every job has ended; returns its tally.

    ``stream`` (default stderr) gets the live display when it is a terminal, else plain lines
    (not with ``as_json``); ``exec: progress`` lines go there when it is not a terminal or
    with ``progress_lines``. With ``as_json`` each record is printed to stdout as it ends;
    ``writers`` get each record too (``--out``).
    """
    stream = stream or sys.stderr
    tally = Tally(batch.job_ids, batch_id=batch.batch_id)
    views: list[View] = []
    poll = None
    if stream.isatty():
        live = LiveView(Console(file=stream, highlight=False), tally)
        # Lines first: each flush prints them above the region, then the region is redrawn.
        views = [ExecLines(live.console_write), live] if progress_lines else [live]
        read = getattr(fleet, "rate_limits", None)
        poll = RateLimitPoll(read, tally.clock) if callable(read) else None
    else:
        views.append(ExecLines(lambda text: _write(stream, text)))
        if not as_json:
            views.append(PlainView(stream))
    if as_json:
        writers = (_print_record, *writers)
    watcher = Watcher(tally, views, writers, poll)
    try:
        for events in _pages(fleet, batch.batch_id, lambda: tally.all_ended):
            watcher.page(events)
    finally:
        watcher.close()
    return tally


def _write(stream: TextIO, text: str) -> None:
    stream.write(text)
    stream.flush()


def _print_record(record: dict[str, Any]) -> None:
    # sys.stdout looked up now: above the live display when stdout is its terminal.
    _write(sys.stdout, json.dumps(record) + "\n")
