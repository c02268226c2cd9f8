"""What ``clonefleet bench`` shows while it runs: a rich progress bar on a terminal, plain
``bench: ...`` lines otherwise (both on stderr)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["ProgressDisplay"]


class ProgressDisplay:
    """A progress callback (``display(text, steps_done)``) over ``total`` batches.

    Args:
        total: batches the run makes at most.
        stream: where to write (default: stderr); a bar only when it is a terminal.
    """

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._bar: Any = None
        if self._stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=Console(file=self._stream),
                transient=True,
            )
            self._task = self._bar.add_task("bench", total=total)

    def __enter__(self) -> ProgressDisplay:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, text: str, steps_done: int) -> None:
        if self._bar is None:
            self._stream.write(f"bench: {text}\n")
            self._stream.flush()
            return
        if steps_done:  # a line kept above the bar for each batch and skip
            self._bar.console.print(f"bench: {text}", markup=False, highlight=False)
        self._bar.update(self._task, description=text, advance=steps_done)
