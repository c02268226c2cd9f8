"""The end of `clonefleet run`: the summary and the `--out` file (no Ray)."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from clonefleet.cli import program as cli
from clonefleet.cli.summary import (
    FAILURES_LISTED,
    TABLE_UP_TO,
    RecordFile,
    RunEnd,
    keep_failures,
    print_summary,
    summary,
)
from clonefleet.config import Config
from clonefleet.errors import UsageError

pytestmark = pytest.mark.timeout(20)


def record(i: int, *, ok: bool = True, **fields: Any) -> dict[str, Any]:
    out = {
        "job_id": f"sa_{i:08x}",
        "batch_id": "b_00000001",
        "agent": "general-purpose",
        "clone_index": i,
        "status": "completed" if ok else "failed",
        "stop_reason": "completed" if ok else "failed",
        "outcome": "success" if ok else "failure",
        "result": {"success": True, "summary": f"clone {i} done"} if ok else None,
        "salvaged": False,
        "nonconforming": False,
        "concerns": [],
        "warnings": [],
        "error": None if ok else "Error: subagent run failed",
        "model": "sim-small" if i % 2 else "sim-large",
        "turns": 2,
        "usage": {"input_tokens": 1000, "output_tokens": 100, "total_tokens": 1100},
    }
    return {**out, **fields}


def render(parts: list[Any], width: int = 120) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=width, record=True)
    print_summary(console, parts)
    return console.export_text()


def end_of(records: list[dict[str, Any]], **kw: Any) -> RunEnd:
    options: dict[str, Any] = {
        "total": len(records),
        "batch_id": "b_00000001",
        "elapsed_s": 12.34,
        "ran_s": 8.0,
    }
    return RunEnd(records=records, **{**options, **kw})


def test_summary_counts_the_batch_as_a_whole():
    records = [record(i) for i in range(60)]
    records[5] = record(5, ok=False, stop_reason="budget", error="Error: budget spent")
    records[7] = record(7, status="cancelled", stop_reason="cancelled", outcome="cancelled")
    text = render(summary(end_of(records, total=64), Config()))
    assert "60 of 64 jobs ended in 12.3s, 8.0s after submission (batch b_00000001)" in text
    assert "status       58 completed, 1 cancelled, 1 failed" in text
    assert "outcome      58 success, 1 cancelled, 1 failure" in text
    assert "stop reason  58 completed, 1 budget, 1 cancelled" in text
    assert "model        30 sim-large, 30 sim-small" in text
    assert "turns        120 (2.0 per job)" in text
    assert "tokens       in 60,000 · out 6,000 · total 66,000" in text
    assert "cost" not in text  # no prices configured
    assert "sa_0000000a" not in text  # more than TABLE_UP_TO jobs: no per-job table
    assert "failures: 2" in text


def test_summary_prices_the_usage_of_priced_models():
    config = Config(
        models={
            "sim-small": {
                "provider": "sim",
                "name": "sim-small",
                "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
            }
        }
    )
    small = [record(i) for i in range(1, 8, 2)]  # 4 jobs: 4,000 in, 400 out
    text = render(summary(end_of(small), config))
    assert "cost         $0.0180" in text
    text = render(summary(end_of([record(i) for i in range(8)]), config))
    assert "cost         $0.0180 (not counted: models without a price: sim-large)" in text


def test_failures_list_the_first_twenty_and_a_command_for_the_rest(tmp_path):
    records = [record(i, ok=i % 3 != 0) for i in range(90)]  # 30 failures
    details = {"sa_00000003": "every candidate model failed (sim-small: HTTP 401)"}
    out = str(tmp_path / "my records.jsonl")
    text = render(summary(end_of(records, details=details, out_path=out), Config()), width=200)
    assert "failures: 30 (the first 20 by clone index)" in text
    assert "  #0 sa_00000000 failed: Error: subagent run failed" in text
    assert (
        "  #3 sa_00000003 failed: Error: subagent run failed; every candidate model failed "
        "(sim-small: HTTP 401)"
    ) in text
    assert f"#{3 * (FAILURES_LISTED - 1)} " in text and f"#{3 * FAILURES_LISTED} " not in text
    assert (
        f"  10 more: jq -c 'select(.status != \"completed\" or .outcome != \"success\")' '{out}'"
    ) in text


def test_the_command_for_the_rest_is_one_line_however_narrow_the_console(tmp_path):
    records = [record(i, ok=False) for i in range(25)]
    out = str(tmp_path / ("deep" * 30) / "records.jsonl")
    text = render(summary(end_of(records, out_path=out), Config()), width=60)
    command = f'  5 more: jq -c \'select(.status != "completed" or .outcome != "success")\' {out}'
    assert command in text.splitlines()


def test_failures_on_a_cluster_name_a_jobs_list_command():
    records = [record(i, ok=False) for i in range(25)]
    records[0] = record(0, status="cancelled", stop_reason="cancelled", outcome="cancelled")
    end = end_of(records, embedded=False, address="10.0.0.5:6379")
    text = render(summary(end, Config()), width=250)
    assert (
        "5 more: clonefleet jobs list --batch b_00000001 --status cancelled --address "
        "10.0.0.5:6379; clonefleet jobs list --batch b_00000001 --status failed --address "
        "10.0.0.5:6379"
    ) in text


def test_failures_of_an_embedded_run_are_kept_in_a_private_file():
    records = [record(i, ok=i >= 5) for i in range(30)]
    assert keep_failures(end_of(records)) is None  # 5 failures: all listed
    records = [record(i, ok=i >= 25) for i in range(30)]
    kept = keep_failures(end_of(records))
    assert kept is not None
    try:
        lines = [json.loads(line) for line in kept.read_text().splitlines()]
        assert [r["clone_index"] for r in lines] == list(range(25))
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        text = render(summary(end_of(records), Config(), kept=kept), width=200)
        assert f"5 more: jq -c . {kept}" in text
    finally:
        kept.unlink()
    assert keep_failures(end_of(records, out_path="x.jsonl")) is None


def test_per_job_table_for_small_batches_or_on_request():
    small = [record(i) for i in range(TABLE_UP_TO)]
    text = render(summary(end_of(small), Config()))
    assert text.count("sa_000000") == TABLE_UP_TO and "clone 49 done" in text
    assert "failures: none" in text
    big = [record(i) for i in range(TABLE_UP_TO + 1)]
    assert "sa_000000" not in render(summary(end_of(big), Config()))
    text = render(summary(end_of(big), Config(), table=True))
    assert text.count("sa_000000") == TABLE_UP_TO + 1
    lines = text.splitlines()  # past TABLE_UP_TO rows: plain aligned columns
    assert lines[0].split() == [
        "job",
        "clone",
        "status",
        "outcome",
        "model",
        "turns",
        "result",
        "/",
        "error",
    ]
    assert lines[51].split() == [
        "sa_00000032",
        "50",
        "completed",
        "success",
        "sim-large",
        "2",
        "clone",
        "50",
        "done",
    ]
    assert len({line.index("completed") for line in lines[1:52]}) == 1


def test_table_cells_show_clone_text_as_typed():
    rec = record(0, result={"success": True, "summary": "[bold]x[/] \x1b[2J"})
    text = render(summary(end_of([rec]), Config()))
    assert "[bold]x[/] \\x1b[2J" in text


# -- --out ----------------------------------------------------------------------------------------
def test_record_file_appends_one_whole_line_per_record(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"earlier": 1}\n')
    sink = RecordFile(str(path))
    for i in range(3):
        sink.write(record(i))
    sink.close()
    sink.close()  # twice is harmless
    sink.write(record(9))  # after close: nothing
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"earlier": 1}
    assert [json.loads(line)["clone_index"] for line in lines[1:]] == [0, 1, 2]
    assert sink.written == 3 and sink.error is None


def test_record_file_refuses_a_directory_and_a_fifo_without_reader(tmp_path):
    with pytest.raises(UsageError, match="is a directory; name a file in it"):
        RecordFile(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="cannot open --out"):
        RecordFile(str(fifo))  # would otherwise wait for a reader forever
    with pytest.raises(UsageError, match="cannot open --out"):
        RecordFile(str(tmp_path / "missing" / "out.jsonl"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_record_file_reports_a_failed_write_once_and_goes_on(capsys):
    sink = RecordFile("/dev/full")
    sink.write(record(0))
    sink.write(record(1))
    sink.close()
    assert sink.error is not None and "No space left" in sink.error
    assert capsys.readouterr().err.count("clonefleet: error: writing --out /dev/full") == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--out", "{dir}"], "is a directory"),
        (["--detach", "--out", "{dir}/x.jsonl"], "not with --detach"),
        (["--detach", "--table"], "not with --detach"),
    ],
)
def test_run_refuses_a_bad_out_before_ray_starts(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # --detach needs an address
    argv = ["run", "general-purpose", "--prompt", "x", *(f.format(dir=tmp_path) for f in flags)]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("*.jsonl"))


def test_summary_says_how_much_input_the_cache_gave_and_prices_it_so():
    config = Config(
        models={
            "sim-small": {
                "provider": "sim",
                "name": "sim-small",
                "price": {
                    "input_per_mtok": 3.0,
                    "output_per_mtok": 15.0,
                    "cached_input_per_mtok": 0.3,
                    "cache_write_per_mtok": 3.75,
                },
            }
        }
    )
    usage = {
        "input_tokens": 1000,
        "output_tokens": 100,
        "total_tokens": 1100,
        "cache_read_tokens": 920,
        "cache_write_tokens": 50,
    }
    small = [record(i, usage=usage) for i in range(1, 8, 2)]  # 4 jobs on sim-small
    text = render(summary(end_of(small), config))
    assert "cached       92% of input · read 3,680 · written 200" in text
    # 4 x (30 plain x $3 + 100 out x $15 + 920 read x $0.30 + 50 written x $3.75) per million
    assert "cost         $0.0082" in text
    # Nothing read from the cache: no such line.
    text = render(summary(end_of([record(i) for i in range(1, 8, 2)]), config))
    assert "cached" not in text and "cost         $0.0180" in text
