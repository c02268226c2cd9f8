"""The views of ``clonefleet run``'s progress (docs/cli.md): the live display on a terminal,
plain lines elsewhere, and ``exec: progress`` lines.

Each view is fed by :class:`clonefleet.cli.progress.Watcher` and writes at most every
:data:`~clonefleet.cli.progress.REFRESH_S` (plain lines every
:data:`~clonefleet.cli.progress.PLAIN_EVERY_S`), so a batch of 10,000 clones costs a few redraws a
second, not one per event. Text from clones (progress summaries, errors) is shown as plain text
with control characters escaped, never read as markup.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from clonefleet.cli.progress import (
    FAILURES_SHOWN,
    PLAIN_EVERY_S,
    REFRESH_S,
    ROLLING_LINES,
    ProgressNote,
    Tally,
    failure_line,
)

__all__ = ["ExecLines", "LiveView", "PlainView", "render_live"]

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

    def flush(self, tally: Tally, *, final: bool = False) -> None:
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
    return Group(panel, bar)


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
