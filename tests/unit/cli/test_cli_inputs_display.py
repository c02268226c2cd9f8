"""What `clonefleet run --inputs` shows: the rows' plain lines or bar as they end, and a
summary counted one record at a time, like a counted run's, with nothing kept per row (no
Ray)."""

from __future__ import annotations

import io
import json
import stat
import types
from typing import Any

import pytest
from rich.console import Console

from clonefleet.cli.progress import (
    FAILURES_SHOWN,
    MORE_FAILURES,
    PLAIN_EVERY_S,
    RowsView,
    failure_line,
)
from clonefleet.cli.run import TABLE_ROWS_MAX, _table_rows
from clonefleet.cli.summary import (
    CAUSES_KEPT,
    FAILURES_LISTED,
    TABLE_UP_TO,
    FailureSpill,
    RunEnd,
    RunTotals,
    print_summary,
    summary,
)
from clonefleet.config import Config
from clonefleet.errors import UsageError
from clonefleet.feed import failed_record
from clonefleet.testing import FakeClock

pytestmark = pytest.mark.timeout(60)


def row_record(i: int, *, ok: bool = True, **fields: Any) -> dict[str, Any]:
    out = {
        "job_id": f"sa_{i:08x}",
        "batch_id": "b_00000001",
        "key": f"k{i}",
        "clone_index": i,
        "status": "completed" if ok else "failed",
        "stop_reason": "completed" if ok else "failed",
        "outcome": "success" if ok else "failure",
        "result": {"success": True, "summary": f"row {i} done"} if ok else None,
        "error": None if ok else f"Error: row {i} failed",
        "model": "sim-small",
        "turns": 2,
        "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110},
    }
    return {**out, **fields}


def render(parts: list[Any]) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=200, record=True)
    print_summary(console, parts)
    return console.export_text()


def rows_end(totals: RunTotals, **kw: Any) -> RunEnd:
    options: dict[str, Any] = {
        "records": (),
        "total": totals.ended,
        "batch_id": "b_00000001",
        "elapsed_s": 10.0,
        "ran_s": 8.0,
        "totals": totals,
        "unit": "rows",
    }
    return RunEnd(**{**options, **kw})


def test_totals_counted_as_records_end_say_what_the_records_would():
    """The summary of totals built one record at a time has the counts of a counted run's."""
    records = [row_record(i, ok=i % 7 != 3) for i in range(40)]
    totals = RunTotals()
    for r in records:
        totals.add(r)
    counted = render(
        summary(RunEnd(records=records, total=40, batch_id="b_1", elapsed_s=1.0), Config())
    )
    fed = render(summary(rows_end(totals), Config()))
    for label in ("status ", "outcome ", "stop reason ", "model ", "tokens ", "cause "):
        mine = [line for line in fed.splitlines() if line.startswith(label)]
        assert mine == [line for line in counted.splitlines() if line.startswith(label)]
    assert "turns        80 (2.0 per row)" in fed
    assert "40 rows in 10.0s, 8.0s after submission (batch b_00000001)" in fed
    assert "rate         5.0 rows/s" in fed
    assert "failures: 6" in fed and "row k3 sa_00000003 failed: Error: row 3 failed" in fed


def test_rows_summary_counts_the_skipped_rows_apart_and_names_the_records_file():
    totals = RunTotals()
    for i in range(3):
        totals.add(row_record(i))
    end = rows_end(totals, total=5, out_path="out.jsonl", skipped=120, skipped_failed=4)
    text = render(summary(end, Config()))
    assert "3 of 5 rows ended in 10.0s" in text
    assert (
        "skipped      120 already done in out.jsonl (4 of them failed: --retry-failed runs them)"
        in text
    )
    assert "records      in out.jsonl" in text
    assert "failures: none" in text
    assert "┃ job" not in text  # no records kept: no table


def test_a_million_failures_keep_a_bounded_count():
    """Distinct causes past CAUSES_KEPT and failures past those listed are only counted."""
    totals = RunTotals()
    n = CAUSES_KEPT + 500
    for i in range(n):
        cause = {"summary": f"HTTP 500 error {i}"}
        totals.add(row_record(i, ok=False, cause=cause))
    assert len(totals.causes) == CAUSES_KEPT and totals.other_causes == 500
    assert len(totals.first_failures) == FAILURES_LISTED and totals.failed == n
    text = render(summary(rows_end(totals, out_path="o.jsonl"), Config()))
    assert f"failures: {n:,} (the first {FAILURES_LISTED} to end)" in text
    assert f"{n - 10:,} failed: many other causes" in text
    assert f"{n - FAILURES_LISTED:,} more: jq -c" in text


def test_a_row_that_did_not_run_is_named_by_its_key_or_as_a_row():
    keyed = failed_record("k7", "inputs file d.jsonl: line 7: not valid JSON", agent="a")
    assert failure_line(keyed).startswith("row k7 failed (abnormal): inputs file d.jsonl: line 7")
    unkeyed = failed_record(None, "inputs file d.jsonl: line 8: not valid JSON", agent="a")
    assert failure_line(unkeyed).startswith("a row failed (abnormal): inputs file d.jsonl")
    assert failure_line(row_record(4, ok=False)).startswith("row k4 sa_00000004 failed: Error")


def test_failure_spill_writes_a_file_only_past_the_failures_listed(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    few = FailureSpill("b_1")
    for i in range(FAILURES_LISTED):
        few.add(row_record(i, ok=False))
    assert few.close() is None and not list(tmp_path.iterdir())
    many = FailureSpill("b_2")
    for i in range(FAILURES_LISTED + 5):
        many.add(row_record(i, ok=False))
    path = many.close()
    assert path is not None and path.parent == tmp_path
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == [
        f"k{i}" for i in range(FAILURES_LISTED + 5)
    ]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = render(
        summary(rows_end(RunTotals.of([row_record(0, ok=False)] * 25)), Config(), kept=path)
    )
    assert f"5 more: jq -c . {path}" in text


def test_plain_rows_view_prints_failures_then_counts_and_a_line_every_few_seconds():
    clock, stream = FakeClock(), io.StringIO()
    total = FAILURES_SHOWN + 10
    view = RowsView(total, live=False, stream=stream, clock=clock)
    for i in range(total):
        view.ended(row_record(i, ok=False))
        clock.advance(PLAIN_EVERY_S / 4)
    view.close()
    lines = stream.getvalue().splitlines()
    failed = [line for line in lines if line.startswith("clonefleet: failed row")]
    assert len(failed) == FAILURES_SHOWN
    assert failed[0] == "clonefleet: failed row k0 sa_00000000 failed: Error: row 0 failed"
    assert f"clonefleet: failed {MORE_FAILURES}" in lines
    done = [line for line in lines if " done, " in line]
    assert done[-1].startswith(f"clonefleet: {total}/{total} done, failed {total}, ")
    assert len(done) == total // 4 + 1  # one every PLAIN_EVERY_S, and the last once


def test_plain_rows_view_of_a_run_cut_short_says_where_it_got_to():
    stream = io.StringIO()
    view = RowsView(10, live=False, stream=stream, clock=FakeClock())
    view.ended(row_record(0))
    view.close()
    assert stream.getvalue().splitlines()[-1].startswith("clonefleet: 1/10 done, failed 0")


def test_live_rows_view_prints_failures_above_the_bar():
    stream = io.StringIO()
    view = RowsView(3, live=True, stream=stream, clock=FakeClock())
    view.ended(row_record(0))
    view.ended(row_record(1, ok=False))
    view.close()
    assert "failed row k1 sa_00000001 failed: Error: row 1 failed" in stream.getvalue()
    assert view.tally.done == 3 - 1 and view.tally.failed == 1


def _args(**kw: Any) -> Any:
    return types.SimpleNamespace(**{"json": False, "table": False, **kw})


def _prepared(to_run: int) -> Any:
    return types.SimpleNamespace(to_run=to_run, name="rows.jsonl")


def test_the_per_row_table_keeps_records_only_for_a_bounded_number_of_rows():
    assert _table_rows(_args(), _prepared(TABLE_UP_TO)) == []
    assert _table_rows(_args(), _prepared(TABLE_UP_TO + 1)) is None
    assert _table_rows(_args(table=True), _prepared(TABLE_ROWS_MAX)) == []
    assert _table_rows(_args(json=True, table=True), _prepared(5)) is None
    with pytest.raises(
        UsageError, match=r"at most 10,000 rows with --inputs.*1,000,000 to run.*--out"
    ):
        _table_rows(_args(table=True), _prepared(1_000_000))


def test_run_refuses_table_on_a_big_inputs_file_before_ray_starts(tmp_path, monkeypatch, capsys):
    from clonefleet.cli import program as cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "rows.txt").write_text("".join(f"r{i}\n" for i in range(TABLE_ROWS_MAX + 1)))
    (tmp_path / "config.yaml").write_text("limits:\n  max_count: 20000\n")
    argv = ["run", "general-purpose", "--prompt", "{{ input }}", "--inputs", "rows.txt", "--table"]
    argv += ["--config", str(tmp_path / "config.yaml")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--table keeps every row's record" in err and "10,001 to run" in err
