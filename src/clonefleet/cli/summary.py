"""The end of ``clonefleet run`` (docs/cli.md): the summary for people, and the ``--out`` file.

The summary counts the batch as a whole (by status, outcome, stop reason and model; turns,
tokens, the share of input read from the prompt cache, cost and the requests providers refused
for their rate), counts the failures by cause (``12 failed: HTTP 401 invalid_api_key on model
x``), lists the first failures with their errors and names a command that lists the rest;
the per-job table is printed only for small batches or on request. :class:`RecordFile` appends
one ``run --json`` record per line as each job ends.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from clonefleet.cli.progress import failure_line
from clonefleet.config import Config, printable, usage_cost
from clonefleet.errors import UsageError
from clonefleet.vocab import succeeded

__all__ = [
    "CAUSES_KEPT",
    "CAUSES_LISTED",
    "FAILURES_LISTED",
    "FailureSpill",
    "TABLE_UP_TO",
    "RecordFile",
    "RunEnd",
    "RunTotals",
    "cache_share",
    "cause_lines",
    "keep_failures",
    "refusals_text",
    "summary",
]

FAILURES_LISTED = 20
"""Failures the summary lists with their errors."""
TABLE_UP_TO = 50
"""Batches up to this size get the per-job table without ``--table``."""
OUT_MODE = 0o644


class RecordFile:
    """``--out FILE.jsonl``: one ``run --json`` record per line, appended as each job ends.

    Each record is one ``write`` of a whole line on a file opened with ``O_APPEND``, so a run
    that is interrupted leaves only complete lines; :meth:`close` syncs the file to disk. A
    failed write is reported once on stderr; the run goes on and ``error`` says what failed.

    Raises:
        UsageError: ``path`` is a directory or cannot be opened for appending.
    """

    def __init__(self, path: str) -> None:
        self.path, self.written = path, 0
        self.error: str | None = None
        """What went wrong writing the file (``None`` while all is well)."""
        self._fd: int | None = None
        if Path(path).is_dir():
            raise UsageError(
                f"--out {printable(path)} is a directory; name a file in it, such as "
                f"{printable(str(Path(path) / 'records.jsonl'))}"
            )
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        try:
            # O_NONBLOCK only for the open itself: a FIFO with no reader fails (ENXIO)
            # instead of hanging the command.
            fd = os.open(path, flags | os.O_NONBLOCK, OUT_MODE)
            os.set_blocking(fd, True)
        except OSError as exc:
            raise UsageError(
                f"cannot open --out {printable(path)} for writing: {exc.strerror or exc}"
            ) from None
        self._fd = fd

    def write(self, record: Mapping[str, Any]) -> None:
        if self._fd is None or self.error is not None:
            return
        data = (json.dumps(record, default=str) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as exc:
            self.error = f"writing --out {printable(self.path)} failed: {exc.strerror or exc}"
            sys.stderr.write(
                f"clonefleet: error: {self.error}; the run goes on and the file keeps the "
                f"{self.written} records written before\n"
            )
            sys.stderr.flush()
            return
        self.written += 1

    def close(self) -> None:
        """Sync to disk and close (twice is harmless)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fsync(fd)
        except OSError:
            pass  # the lines are written; a file system that cannot sync keeps them anyway
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd:
    """What the summary of one run is made of."""

    records: Sequence[dict[str, Any]]
    """The run records of the jobs that ended, in clone order."""
    total: int
    """Jobs in the batch."""
    batch_id: str
    elapsed_s: float
    """Wall time of the command, Ray's start included."""
    ran_s: float | None = None
    """Time from the batch's submission to its end."""
    details: Mapping[str, str] = field(default_factory=dict)
    """Why each non-completed job ended (its ``error`` event), by job id."""
    rate_limited: Mapping[str, int] = field(default_factory=dict)
    """Requests of the batch a provider refused for its rate (``rate_limited`` events), by
    ``provider/model``."""
    out_path: str | None = None
    """The ``--out`` file, if any."""
    embedded: bool = True
    """The batch ran on an embedded Ray instance (gone once the command ends)."""
    address: str | None = None
    """The cluster's address to name in a ``jobs list`` command (``None``: the recorded one)."""
    totals: RunTotals | None = None
    """The counts of every record that ended, built as each ended (``--inputs``); ``None``:
    counted from :attr:`records`, which are then every record."""
    unit: str = "jobs"
    """What the batch is counted in: ``jobs``, or ``rows`` for an ``--inputs`` run."""
    skipped: int = 0
    """Rows skipped because ``--out`` had their record already (``--inputs``)."""
    skipped_failed: int = 0
    """Of those, the rows whose record there failed (rerun with ``--retry-failed``)."""

    def counted(self) -> RunTotals:
        """The run's counts: :attr:`totals`, or those of :attr:`records`."""
        if self.totals is not None:
            return self.totals
        return RunTotals.of(self.records, self.details)


def _counted(counts: Counter[str]) -> str:
    """``5 completed, 2 failed``: most frequent first, then by name."""
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n:,} {printable(name)}" for name, n in ordered) or "-"


_PRICED = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
"""The usage counters a cost is made of (docs/json.md)."""
CAUSES_KEPT = 1000
"""Distinct causes of failure counted one by one; failures of further causes are counted
together (so a run of a million distinct errors keeps a bounded count)."""


def _name(value: Any) -> str:
    return "none" if value is None else str(value)


class RunTotals:
    """What the summary counts, built one record at a time without keeping the records: the
    records by status, outcome, stop reason and model, turns, tokens (and each model's priced
    tokens, for the cost), the failures by status and by cause (:data:`CAUSES_KEPT` causes,
    the rest together) and the first ``listed`` failures with the detail of their ``error``
    event. Its memory is bounded whatever the number of records."""

    def __init__(self, listed: int = FAILURES_LISTED) -> None:
        self.ended = 0
        self.by: dict[str, Counter[str]] = {
            name: Counter() for name in ("status", "outcome", "stop_reason", "model")
        }
        self.turns = 0
        self.tokens = Counter[str]()
        self.priced: dict[Any, Counter[str]] = {}
        """Each model's usage counters that a cost is made of."""
        self.failed = 0
        self.failed_statuses = Counter[str]()
        self.causes = Counter[str]()
        self.other_causes = 0
        """Failures of causes past :data:`CAUSES_KEPT` distinct ones."""
        self.listed = listed
        self.first_failures: list[tuple[dict[str, Any], str | None]] = []
        """The first ``listed`` failures to be added, with the detail of each."""

    @classmethod
    def of(
        cls, records: Sequence[dict[str, Any]], details: Mapping[str, str] | None = None
    ) -> RunTotals:
        """The counts of ``records`` (failures listed in their order), each failure's detail
        looked up in ``details`` by job id."""
        totals = cls()
        for r in records:
            totals.add(r, (details or {}).get(str(r.get("job_id"))))
        return totals

    def add(self, record: dict[str, Any], detail: str | None = None) -> None:
        """Count one record that ended (``detail``: why it ended, from its ``error`` event)."""
        self.ended += 1
        for name, counts in self.by.items():
            counts[_name(record.get(name))] += 1
        self.turns += int(record.get("turns") or 0)
        usage = record.get("usage") or {}
        self.tokens.update({k: int(v) for k, v in usage.items() if isinstance(v, int | float)})
        model = self.priced.setdefault(record.get("model"), Counter())
        for key in _PRICED:
            model[key] += int(usage.get(key) or 0)
        if succeeded(record):
            return
        self.failed += 1
        self.failed_statuses[str(record["status"])] += 1
        cause = record.get("cause")
        if isinstance(cause, Mapping) and record.get("status") == "failed":
            what = str(cause.get("summary") or "unknown")
            if what in self.causes or len(self.causes) < CAUSES_KEPT:
                self.causes[what] += 1
            else:
                self.other_causes += 1
        if len(self.first_failures) < self.listed:
            self.first_failures.append((record, detail))


def cache_share(read: int, tin: int) -> str:
    """``92%``: the share of ``tin`` input tokens that were ``read`` from the prompt cache
    (``<1%`` for some, ``>99%`` for nearly all)."""
    share = read / tin if tin > 0 else 0.0
    if 0 < share < 0.005:
        return "<1%"
    if 0.995 <= share < 1:
        return ">99%"
    return f"{share:.0%}"


def _cost(priced: Mapping[Any, Counter[str]], config: Config) -> str | None:
    """The cost of the batch's usage, each model's priced tokens (cache reads and writes at
    their own prices), or ``None`` when no model it used has a price."""
    known, unpriced = 0.0, []
    for model, tokens in priced.items():
        cost = usage_cost(config, model, tokens)
        if cost is None:
            unpriced.append(str(model))
        else:
            known += cost
    if len(unpriced) == len(priced):
        return None
    text = f"${known:,.4f}" if known < 1 else f"${known:,.2f}"
    if unpriced:
        text += f" (not counted: models without a price: {printable(', '.join(sorted(unpriced)))})"
    return text


def _totals(end: RunEnd, totals: RunTotals, config: Config) -> list[RenderableType]:
    rows = [
        ("status", _counted(totals.by["status"])),
        ("outcome", _counted(totals.by["outcome"])),
        ("stop reason", _counted(totals.by["stop_reason"])),
        ("model", _counted(totals.by["model"])),
    ]
    one = end.unit[:-1]
    per_job = f" ({totals.turns / totals.ended:.1f} per {one})" if totals.ended else ""
    rows.append(("turns", f"{totals.turns:,}{per_job}"))
    tokens = totals.tokens
    rows.append(
        (
            "tokens",
            f"in {tokens['input_tokens']:,} · out {tokens['output_tokens']:,}"
            f" · total {tokens['total_tokens']:,}",
        )
    )
    read = tokens["cache_read_tokens"]
    if read:
        rows.append(
            (
                "cached",
                f"{cache_share(read, tokens['input_tokens'])} of input · read {read:,}"
                f" · written {tokens['cache_write_tokens']:,}",
            )
        )
    cost = _cost(totals.priced, config)
    if cost is not None:
        rows.append(("cost", cost))
    refused = refusals_text(end.rate_limited)
    if refused:
        rows.append(("429s", refused))
    if end.ran_s and totals.ended:
        rows.append(("rate", f"{totals.ended / end.ran_s:,.1f} {end.unit}/s"))
    if end.skipped:
        skipped = f"{end.skipped:,} already done in {printable(end.out_path or '--out')}"
        if end.skipped_failed:
            skipped += f" ({end.skipped_failed:,} of them failed: --retry-failed runs them)"
        rows.append(("skipped", skipped))
    if end.out_path is not None:
        rows.append(("records", f"in {printable(end.out_path)}"))
    return [Text.assemble((f"{key:<12}", "bold"), " ", value) for key, value in rows]


def refusals_text(counts: Mapping[str, int]) -> str:
    """``12 on p/sim-small, 3 on p/sim-large``: refusals for rate by ``provider/model``, most
    first (empty when there were none)."""
    ordered = sorted(((n, k) for k, n in counts.items() if n), key=lambda nk: (-nk[0], nk[1]))
    return ", ".join(f"{n:,} on {printable(name)}" for n, name in ordered)


def _rest_command(end: RunEnd, totals: RunTotals, kept: Path | None) -> str:
    """A command that lists every failure of the batch."""
    if end.out_path is not None:
        return 'jq -c \'select(.status != "completed" or .outcome != "success")\' ' + shlex.quote(
            end.out_path
        )
    if not end.embedded:
        where = f" --address {shlex.quote(end.address)}" if end.address else ""
        statuses = sorted(totals.failed_statuses)
        return "; ".join(
            f"clonefleet jobs list --batch {end.batch_id} --status {s}{where}" for s in statuses
        )
    if kept is not None:
        return f"jq -c . {shlex.quote(str(kept))}"
    return "(rerun with --out FILE.jsonl to keep every record)"


class FailureSpill:
    """The failed records of an embedded run without ``--out``, once there are more than the
    summary lists: the first :data:`FAILURES_LISTED` are held, and with one more they and every
    later one are written to a new file in the temporary folder (readable by its owner only),
    one JSON line each, so that nothing but that many records is ever held."""

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        self._held: list[dict[str, Any]] = []
        self._file: Any = None
        self.path: Path | None = None
        """The file, once written (``None`` while the failures fit the summary, or when it
        could not be written)."""
        self._broken = False

    def add(self, record: dict[str, Any]) -> None:
        """Keep one failed record."""
        if self._broken:
            return
        if self._file is None and len(self._held) < FAILURES_LISTED:
            self._held.append(record)
            return
        try:
            if self._file is None:
                fd, name = tempfile.mkstemp(prefix=f"clonefleet-{self.batch_id}-", suffix=".jsonl")
                self._file, self.path = os.fdopen(fd, "w"), Path(name)
                self._file.writelines(json.dumps(r, default=str) + "\n" for r in self._held)
                self._held = []
            self._file.write(json.dumps(record, default=str) + "\n")
        except OSError:
            self._broken, self.path = True, None

    def close(self) -> Path | None:
        """Close the file; returns its path (``None``: none was written)."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                self.path = None
            self._file = None
        return self.path


def keep_failures(end: RunEnd) -> Path | None:
    """When more failures than the summary lists end an embedded run without ``--out``, their
    records are kept in a new file in the temporary folder (:class:`FailureSpill`)."""
    if end.out_path is not None or not end.embedded:
        return None
    spill = FailureSpill(end.batch_id)
    for r in end.records:
        if not succeeded(r):
            spill.add(r)
    return spill.close()


CAUSES_LISTED = 10
"""Distinct causes of failure the summary counts (the rest are counted together)."""


def cause_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """``12 failed: HTTP 401 invalid_api_key on model x``: the failed jobs that carry a
    ``cause`` (docs/json.md), counted by its ``summary``, most first, then by text."""
    totals = RunTotals()
    for r in records:
        if not succeeded(r):
            totals.add(dict(r))
    return _cause_lines(totals)


def _cause_lines(totals: RunTotals) -> list[str]:
    ordered = sorted(totals.causes.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"{n:,} failed: {printable(what)}" for what, n in ordered[:CAUSES_LISTED]]
    rest = sum(n for _, n in ordered[CAUSES_LISTED:]) + totals.other_causes
    if rest:
        others = f"{len(ordered) - CAUSES_LISTED} " if not totals.other_causes else "many "
        lines.append(f"{rest:,} failed: {others}other causes")
    return lines


def _failures(end: RunEnd, totals: RunTotals, kept: Path | None) -> list[RenderableType]:
    if not totals.failed:
        return [Text("failures: none", style="green")]
    causes = [Text.assemble((f"{'cause':<12}", "bold"), " ", x) for x in _cause_lines(totals)]
    first = totals.first_failures
    head = f"failures: {totals.failed:,}"
    if totals.failed > len(first):
        order = "by clone index" if end.totals is None else "to end"
        head += f" (the first {len(first)} {order})"
    out: list[RenderableType] = [*causes, Text(head, style="bold red")]
    lines = [Text(failure_line(r, detail, 240)) for r, detail in first]
    out += [Padding(line, (0, 0, 0, 2)) for line in lines]
    rest = totals.failed - len(first)
    if rest:
        # A command to copy: never folded or cut (print_summary prints it whole).
        out.append(Text(f"  {rest:,} more: {_rest_command(end, totals, kept)}", no_wrap=True))
    return out


def print_summary(console: Console, parts: list[RenderableType]) -> None:
    """Print :func:`summary`'s parts; a line that must not be folded (a command to copy, marked
    ``no_wrap``) is printed whole on one line, however narrow the console."""
    for part in parts:
        console.print(part, soft_wrap=isinstance(part, Text) and bool(part.no_wrap))


_COLUMNS = ("job", "clone", "status", "outcome", "model", "turns", "result / error")
KEY_COLUMN = "key"
"""The first column of a table of records that carry a row's key (``--inputs``)."""


def _cells(r: dict[str, Any], keyed: bool = False) -> tuple[str, ...]:
    result = r["result"].get("summary") if isinstance(r["result"], dict) else r["result"]
    shown = r["error"] or ("" if result is None else result)
    key = (printable(str(r.get("key")))[:60],) if keyed else ()
    return (
        *key,
        "-" if r["job_id"] is None else str(r["job_id"]),  # a row that did not run
        "-" if r["clone_index"] is None else str(r["clone_index"]),
        str(r["status"]),
        str(r["outcome"]),
        printable(str(r["model"])),
        str(r["turns"]),
        printable(" ".join(str(shown).split()))[:200],
    )


def job_table(records: Sequence[dict[str, Any]]) -> RenderableType:
    """One row per job: id, clone index, status, outcome, model, turns, result or error (and
    first the row's key, for records that carry one). Past :data:`TABLE_UP_TO` rows, plain
    aligned columns: a boxed table of 10,000 rows would take seconds to lay out."""
    keyed = any(r.get("key") is not None for r in records)
    columns = (KEY_COLUMN, *_COLUMNS) if keyed else _COLUMNS
    rows = [_cells(r, keyed) for r in records]
    if len(rows) > TABLE_UP_TO:
        widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns[:-1])]
        lines = [
            "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
            for row in (columns, *rows)
        ]
        text = Text("\n".join(lines), no_wrap=True, overflow="ellipsis")
        text.stylize("bold", 0, len(lines[0]))
        return text
    table = Table()
    for col in columns[:-1]:
        table.add_column(col, no_wrap=True)
    table.add_column(columns[-1], no_wrap=True, overflow="ellipsis", max_width=80)
    for row in rows:
        table.add_row(*row[:-1], Text(row[-1]))
    return table


def summary(
    end: RunEnd, config: Config, *, table: bool = False, kept: Path | None = None
) -> list[RenderableType]:
    """What is printed once the batch has ended: the per-job table, the totals and the
    failures. ``kept`` is the file :func:`keep_failures` (or a :class:`FailureSpill`) wrote.

    The table is that of :attr:`RunEnd.records`: for a counted run with ``table`` or for
    :data:`TABLE_UP_TO` jobs or fewer; for a run counted as it went (:attr:`RunEnd.totals`)
    whenever it kept records (docs/inputs.md)."""
    totals = end.counted()
    out: list[RenderableType] = []
    shown = (
        bool(end.records) if end.totals is not None else table or len(end.records) <= TABLE_UP_TO
    )
    if shown:
        out.append(job_table(end.records))
    unit = end.unit if end.total != 1 else end.unit[:-1]
    jobs = f"{totals.ended:,} {unit}"
    if totals.ended < end.total:
        jobs = f"{totals.ended:,} of {end.total:,} {unit} ended"
    ran = "" if end.ran_s is None else f", {end.ran_s:.1f}s after submission"
    batch = f" (batch {end.batch_id})" if end.batch_id else ""  # none: no row was submitted
    out.append(Text(f"{jobs} in {end.elapsed_s:.1f}s{ran}{batch}", style="bold"))
    out.extend(_totals(end, totals, config))
    out.extend(_failures(end, totals, kept))
    return out
