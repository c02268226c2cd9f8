"""An ``--inputs`` run prepared before anything starts: the file checked and counted, the
results file read for resuming, the first rows planned, the results file opened."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from clonefleet.config import Config
from clonefleet.errors import ClonefleetError, DefinitionError
from clonefleet.feed._feeder import FeedClient, Feeder, Planner, slice_for
from clonefleet.feed._inflight import InFlight
from clonefleet.feed._resume import Adopted
from clonefleet.inputs import (
    Row,
    RowError,
    check_source,
    count_and_check_keys,
    input_format,
    read_rows,
    spool,
)
from clonefleet.results import KeyState, ResultsIndex, ResultsWriter

__all__ = ["InputsRequest", "InputsRun"]

STDIN = "-"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputsRequest:
    """What a command line asks of an ``--inputs`` run."""

    inputs: str
    """The inputs file, ``-`` for standard input."""
    inputs_format: str | None = None
    key: str | None = None
    limit: int | None = None
    out: str | None = None
    retry_failed: bool = False
    include_input: bool = False


def _is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


class InputsRun:
    """An ``--inputs`` run, checked before Ray starts (every problem with the request is one
    :class:`~clonefleet.errors.UsageError` or definition error here).

    Args:
        request: the :class:`InputsRequest`.
        plan: the :data:`~clonefleet.feed.Planner` of one part.
        agent: the definition's name.
        config: the config (``limits.max_count``, prices for CSV's ``cost_usd``).
        spool_dir: where standard input or a FIFO is copied (the caller removes it).
        count_later: when ``--out`` has no records (nothing to skip), count the rows and check
            their keys in a background thread, so that the caller can start Ray meanwhile;
            :meth:`wait_counted` (before the first row is submitted) raises what it found.

    Standard input and FIFOs are spooled first; the file is checked, counted (its keys checked
    with a key field), the ``--out`` file read for the keys done, and the first slice of rows to
    run planned (a first slice none of whose rows renders is the error of the run). Then the
    results file is opened (its lock taken, a CSV header checked).
    """

    def __init__(
        self,
        request: InputsRequest,
        plan: Planner,
        *,
        agent: str,
        config: Config,
        spool_dir: str | os.PathLike[str],
        count_later: bool = False,
    ) -> None:
        self.request, self._plan, self.agent = request, plan, agent
        shown = "standard input" if request.inputs == STDIN else request.inputs
        self.name = shown
        path: str = request.inputs
        if path == STDIN or _is_fifo(path):
            path = os.fspath(spool(path, spool_dir, name=shown))
        self.path = path
        self.format = input_format(
            request.inputs,
            request.inputs_format,
            content=path if request.inputs == STDIN else None,
        )
        check_source(path, self.format, name=shown)
        self._max_count = config.limits.max_count
        self.index: ResultsIndex | None = None
        if request.out and Path(request.out).is_file():
            self.index = ResultsIndex.read(request.out)
        self.skipped = 0
        """Rows skipped because ``--out`` has their key done (counted once :meth:`rows` ran)."""
        self.skipped_failed = 0
        """Of those, rows whose record there failed (without ``--retry-failed``)."""
        self._total = self._to_run = 0
        self._counting: threading.Thread | None = None
        self._count_error: BaseException | None = None
        if count_later and (self.index is None or not len(self.index)):
            # Nothing to skip: the rows to run are the file's rows, whose count (and key check)
            # is one pass over the whole file, done while Ray starts (docs/inputs.md).
            schema = self._check_first_slice()
            self._counting = threading.Thread(
                target=self._count_in_background, name="clonefleet-count-inputs", daemon=True
            )
            self._counting.start()
        else:
            self._count()
            schema = self._check_first_slice()
        self.writer: ResultsWriter | None = None
        if request.out:
            self.writer = ResultsWriter(
                request.out,
                index=self.index,
                include_input=request.include_input,
                exit_schema=schema,
                config=config,
            )

    def _count(self) -> None:
        """Count the rows (checking their keys) and those to run."""
        req = self.request
        self._total = count_and_check_keys(
            self.path,
            self.format,
            key=req.key,
            limit=req.limit,
            max_count=self._max_count,
            name=self.name,
        )
        self._to_run = self._count_to_run()

    def _count_in_background(self) -> None:
        try:
            self._count()
        except BaseException as exc:  # raised again by wait_counted, in the caller's thread
            self._count_error = exc

    @property
    def counted(self) -> bool:
        """Whether the rows have been counted and their keys checked (:meth:`wait_counted`)."""
        return self._counting is None

    def wait_counted(self) -> None:
        """Wait for the count begun in the background (``count_later``), if any.

        Raises:
            UsageError: two rows with one key, more rows than ``limits.max_count``, a file
                that cannot be read through: what counting in the foreground raises.
        """
        counting = self._counting
        if counting is None:
            return
        counting.join()
        self._counting = None
        error, self._count_error = self._count_error, None
        if error is not None:
            raise error

    @property
    def total(self) -> int:
        """Rows in the file (up to ``--limit``); waits for the count (:meth:`wait_counted`)."""
        self.wait_counted()
        return self._total

    @property
    def to_run(self) -> int:
        """Rows this run reads into the batch (the total less those already done); waits for
        the count (:meth:`wait_counted`)."""
        self.wait_counted()
        return self._to_run

    def _done(self, key: str | None) -> bool:
        return (
            key is not None
            and self.index is not None
            and self.index.skip(key, self.request.retry_failed)
        )

    def unrecorded(self, key: str) -> bool:
        """Whether ``--out`` has no record of the row ``key`` at all: the rows whose jobs in an
        earlier run's batch are collected rather than run again (a row whose record failed is
        run anew under ``--retry-failed``, not collected)."""
        return self.index is None or self.index.state(key) is None

    def _count_to_run(self) -> int:
        """The rows not done already (one more pass over the file when resuming)."""
        if self.index is None or not len(self.index):
            return self._total
        return sum(1 for _ in self._read(count=False))

    def _read(self, count: bool = True) -> Iterator[Row | RowError]:
        """The file's rows whose key is not done (counting those that are)."""
        req = self.request
        for row in read_rows(self.path, self.format, key=req.key, limit=req.limit, name=self.name):
            if self._done(row.key):
                if count:
                    self.skipped += 1
                    if self.index is not None and row.key is not None:
                        failed = self.index.state(row.key) is KeyState.FAILED
                        self.skipped_failed += failed
                continue
            yield row

    def rows(self) -> Iterator[Row | RowError]:
        """The rows to run, in file order, read lazily."""
        return self._read()

    def _check_first_slice(self) -> dict[str, Any]:
        """Plan the first slice of rows to run (nothing is kept); returns the definition's
        exit schema. Raises when none of those rows renders."""
        head = islice(self._read(count=False), slice_for(1000))
        first = [(r.key, r.data) for r in head if isinstance(r, Row)]
        if not first:
            return {}
        try:
            plan = self._plan(first, None, 0)
        except ClonefleetError as whole:
            plan = None
            for row in first:
                try:
                    plan = self._plan([row], None, 0)
                    break
                except ClonefleetError:
                    continue
            if plan is None:
                raise whole from None
        failures = getattr(plan, "failures", None)
        if failures is not None:  # a plan of rows that fail alone
            if plan.plan is None and failures:
                raise DefinitionError(
                    f"no row of the first {len(first)} renders: {failures[0].reason}"
                )
            plan = plan.plan
        return _exit_schema(plan)

    def feeder(
        self,
        client: FeedClient,
        ahead: int,
        poll_s: float = 0.25,
        *,
        adopted: Adopted | None = None,
        follow: bool = True,
        adaptive: bool = False,
    ) -> Feeder:
        """The :class:`Feeder` of this run's rows (the keys were checked by the count pass),
        collecting the jobs of ``adopted`` for the rows it has; ``follow=False`` only submits
        (a detached run). ``adaptive`` keeps as few of the ``ahead`` rows in flight as keep
        the rate of ends at its highest (:class:`InFlight`)."""
        return Feeder(
            self.rows(),
            self._plan,
            client,
            agent=self.agent,
            ahead=ahead,
            check_keys=False,
            source=f"inputs file {self.name}",
            poll_s=poll_s,
            adopted=adopted,
            follow=follow,
            inflight=InFlight(ahead) if adaptive else None,
        )

    def close(self) -> None:
        """Close the results file (synced to disk)."""
        if self.writer is not None:
            self.writer.close()


def _exit_schema(plan: Any) -> dict[str, Any]:
    """The exit schema of a plan's clones (``{}`` when it has none)."""
    specs: Sequence[Any] = getattr(getattr(plan, "submission", None), "specs", ())
    return dict(specs[0].exit_schema) if specs else {}
