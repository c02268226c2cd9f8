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
    "CAUSES_LISTED",
    "FAILURES_LISTED",
    "TABLE_UP_TO",
    "RecordFile",
    "RunEnd",
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


def _counted(values: Sequence[Any]) -> str:
    """``5 completed, 2 failed``: most frequent first, then by name."""
    counts = Counter("none" if v is None else str(v) for v in values)
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n:,} {printable(name)}" for name, n in ordered) or "-"


_PRICED = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
"""The usage counters a cost is made of (docs/json.md)."""


def cache_share(read: int, tin: int) -> str:
    """``92%``: the share of ``tin`` input tokens that were ``read`` from the prompt cache
    (``<1%`` for some, ``>99%`` for nearly all)."""
    share = read / tin if tin > 0 else 0.0
    if 0 < share < 0.005:
        return "<1%"
    if 0.995 <= share < 1:
        return ">99%"
    return f"{share:.0%}"


def _cost(records: Sequence[dict[str, Any]], config: Config) -> str | None:
    """The cost of the batch's usage (cache reads and writes at their own prices), or ``None``
    when no model it used has a price."""
    by_model: dict[Any, Counter[str]] = {}
    for r in records:
        usage = r.get("usage") or {}
        tokens = by_model.setdefault(r.get("model"), Counter())
        for key in _PRICED:
            tokens[key] += int(usage.get(key) or 0)
    known, unpriced = 0.0, []
    for model, tokens in by_model.items():
        cost = usage_cost(config, model, tokens)
        if cost is None:
            unpriced.append(str(model))
        else:
            known += cost
    if len(unpriced) == len(by_model):
        return None
    text = f"${known:,.4f}" if known < 1 else f"${known:,.2f}"
    if unpriced:
        text += f" (not counted: models without a price: {printable(', '.join(sorted(unpriced)))})"
    return text


def _totals(end: RunEnd, config: Config) -> list[RenderableType]:
    records = end.records
    rows = [
        ("status", _counted([r["status"] for r in records])),
        ("outcome", _counted([r["outcome"] for r in records])),
        ("stop reason", _counted([r["stop_reason"] for r in records])),
        ("model", _counted([r["model"] for r in records])),
    ]
    turns = sum(int(r.get("turns") or 0) for r in records)
    per_job = f" ({turns / len(records):.1f} per job)" if records else ""
    rows.append(("turns", f"{turns:,}{per_job}"))
    tokens = Counter[str]()
    for r in records:
        tokens.update({k: int(v) for k, v in (r.get("usage") or {}).items()})
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
    cost = _cost(records, config)
    if cost is not None:
        rows.append(("cost", cost))
    refused = refusals_text(end.rate_limited)
    if refused:
        rows.append(("429s", refused))
    return [Text.assemble((f"{key:<12}", "bold"), " ", value) for key, value in rows]


def refusals_text(counts: Mapping[str, int]) -> str:
    """``12 on p/sim-small, 3 on p/sim-large``: refusals for rate by ``provider/model``, most
    first (empty when there were none)."""
    ordered = sorted(((n, k) for k, n in counts.items() if n), key=lambda nk: (-nk[0], nk[1]))
    return ", ".join(f"{n:,} on {printable(name)}" for n, name in ordered)


def _rest_command(end: RunEnd, failures: Sequence[dict[str, Any]], kept: Path | None) -> str:
    """A command that lists every failure of the batch."""
    if end.out_path is not None:
        return 'jq -c \'select(.status != "completed" or .outcome != "success")\' ' + shlex.quote(
            end.out_path
        )
    if not end.embedded:
        where = f" --address {shlex.quote(end.address)}" if end.address else ""
        statuses = sorted({str(r["status"]) for r in failures})
        return "; ".join(
            f"clonefleet jobs list --batch {end.batch_id} --status {s}{where}" for s in statuses
        )
    if kept is not None:
        return f"jq -c . {shlex.quote(str(kept))}"
    return "(rerun with --out FILE.jsonl to keep every record)"


def keep_failures(end: RunEnd) -> Path | None:
    """When more failures than the summary lists end an embedded run without ``--out``, their
    records are kept in a new file in the temporary folder (readable by its owner only)."""
    failures = [r for r in end.records if not succeeded(r)]
    if len(failures) <= FAILURES_LISTED or end.out_path is not None or not end.embedded:
        return None
    try:
        fd, name = tempfile.mkstemp(prefix=f"clonefleet-{end.batch_id}-", suffix=".jsonl")
        with os.fdopen(fd, "w") as f:
            f.writelines(json.dumps(r, default=str) + "\n" for r in failures)
    except OSError:
        return None
    return Path(name)


CAUSES_LISTED = 10
"""Distinct causes of failure the summary counts (the rest are counted together)."""


def cause_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """``12 failed: HTTP 401 invalid_api_key on model x``: the failed jobs that carry a
    ``cause`` (docs/json.md), counted by its ``summary``, most first, then by text."""
    counts = Counter(
        str(r["cause"].get("summary") or "unknown")
        for r in records
        if isinstance(r.get("cause"), Mapping) and r.get("status") == "failed"
    )
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"{n:,} failed: {printable(what)}" for what, n in ordered[:CAUSES_LISTED]]
    rest = sum(n for _, n in ordered[CAUSES_LISTED:])
    if rest:
        lines.append(f"{rest:,} failed: {len(ordered) - CAUSES_LISTED} other causes")
    return lines


def _failures(end: RunEnd, kept: Path | None) -> list[RenderableType]:
    failures = [r for r in end.records if not succeeded(r)]
    if not failures:
        return [Text("failures: none", style="green")]
    causes = [Text.assemble((f"{'cause':<12}", "bold"), " ", x) for x in cause_lines(failures)]
    first = failures[:FAILURES_LISTED]
    head = f"failures: {len(failures):,}"
    if len(failures) > len(first):
        head += f" (the first {len(first)} by clone index)"
    out: list[RenderableType] = [*causes, Text(head, style="bold red")]
    lines = [Text(failure_line(r, end.details.get(r["job_id"]), 240)) for r in first]
    out += [Padding(line, (0, 0, 0, 2)) for line in lines]
    rest = len(failures) - len(first)
    if rest:
        # A command to copy: never folded or cut (print_summary prints it whole).
        out.append(Text(f"  {rest:,} more: {_rest_command(end, failures, kept)}", no_wrap=True))
    return out


def print_summary(console: Console, parts: list[RenderableType]) -> None:
    """Print :func:`summary`'s parts; a line that must not be folded (a command to copy, marked
    ``no_wrap``) is printed whole on one line, however narrow the console."""
    for part in parts:
        console.print(part, soft_wrap=isinstance(part, Text) and bool(part.no_wrap))


_COLUMNS = ("job", "clone", "status", "outcome", "model", "turns", "result / error")


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    result = r["result"].get("summary") if isinstance(r["result"], dict) else r["result"]
    shown = r["error"] or ("" if result is None else result)
    return (
        str(r["job_id"]),
        str(r["clone_index"]),
        str(r["status"]),
        str(r["outcome"]),
        printable(str(r["model"])),
        str(r["turns"]),
        printable(" ".join(str(shown).split()))[:200],
    )


def job_table(records: Sequence[dict[str, Any]]) -> RenderableType:
    """One row per job: id, clone index, status, outcome, model, turns, result or error. Past
    :data:`TABLE_UP_TO` rows, plain aligned columns: a boxed table of 10,000 rows would take
    seconds to lay out."""
    rows = [_cells(r) for r in records]
    if len(rows) > TABLE_UP_TO:
        widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(_COLUMNS[:-1])]
        lines = [
            "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
            for row in (_COLUMNS, *rows)
        ]
        text = Text("\n".join(lines), no_wrap=True, overflow="ellipsis")
        text.stylize("bold", 0, len(lines[0]))
        return text
    table = Table()
    for col in _COLUMNS[:-1]:
        table.add_column(col, no_wrap=True)
    table.add_column(_COLUMNS[-1], no_wrap=True, overflow="ellipsis", max_width=80)
    for row in rows:
        table.add_row(*row[:-1], Text(row[-1]))
    return table


def summary(
    end: RunEnd, config: Config, *, table: bool = False, kept: Path | None = None
) -> list[RenderableType]:
    """What is printed once the batch has ended: the per-job table (with ``table`` or for
    :data:`TABLE_UP_TO` jobs or fewer), the totals and the failures. ``kept`` is the file
    :func:`keep_failures` wrote."""
    out: list[RenderableType] = []
    if table or len(end.records) <= TABLE_UP_TO:
        out.append(job_table(end.records))
    jobs = f"{len(end.records):,} jobs"
    if len(end.records) < end.total:
        jobs = f"{len(end.records):,} of {end.total:,} jobs ended"
    ran = "" if end.ran_s is None else f", {end.ran_s:.1f}s after submission"
    out.append(Text(f"{jobs} in {end.elapsed_s:.1f}s{ran} (batch {end.batch_id})", style="bold"))
    out.extend(_totals(end, config))
    out.extend(_failures(end, kept))
    return out
