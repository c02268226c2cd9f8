"""An --inputs run prepared before Ray starts: spooling a FIFO, counting, skipping the keys
--out has done, and the first slice's render checked (real planning, no Ray)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clonefleet.config import Config
from clonefleet.errors import ClonefleetError, UsageError
from clonefleet.feed import InputsRequest, InputsRun
from clonefleet.inputs import Row, RowError
from clonefleet.planning import plan_batch

pytestmark = pytest.mark.timeout(60)

CONFIG = Config()


def planner(tmp_path: Path, prompt: str = "Say {{ input.x }}") -> Any:
    def plan(rows: Any, batch_id: str | None, first: int = 0) -> Any:
        return plan_batch(
            "general-purpose", prompt, config=CONFIG, caller_cwd=tmp_path, rows=rows,
            batch_id=batch_id,
        )  # fmt: skip

    return plan


def rows_file(tmp_path: Path, n: int = 5) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": f"k{i}", "x": i}) + "\n" for i in range(n)))
    return data


def prepare(
    tmp_path: Path, prompt: str = "Say {{ input.x }}", count_later: bool = False, **req: Any
) -> InputsRun:
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(exist_ok=True)
    return InputsRun(
        InputsRequest(**req), planner(tmp_path, prompt), agent="general-purpose",
        config=CONFIG, spool_dir=spool_dir, count_later=count_later,
    )  # fmt: skip


def record(key: str, ok: bool) -> str:
    out = {"key": key, "status": "completed" if ok else "failed"}
    out["outcome"] = "success" if ok else "failure"
    return json.dumps(out) + "\n"


def test_a_fifo_is_spooled_then_counted_and_read(tmp_path):
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    lines = "".join(json.dumps({"x": i}) + "\n" for i in range(4))

    def feed() -> None:
        with open(fifo, "w") as f:
            f.write(lines)

    writer = threading.Thread(target=feed)
    writer.start()
    run = prepare(tmp_path, inputs=str(fifo), inputs_format="jsonl")
    writer.join(5)
    assert run.total == run.to_run == 4 and run.path != str(fifo)
    assert [r.data for r in run.rows() if isinstance(r, Row)] == [{"x": i} for i in range(4)]
    run.close()


def test_rows_done_in_out_are_skipped_and_failed_ones_counted(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(record("k0", True) + record("k1", False))
    data = str(rows_file(tmp_path))
    run = prepare(tmp_path, inputs=data, key="id", out=str(out))
    assert run.total == 5 and run.to_run == 3
    assert [r.key for r in run.rows()] == ["k2", "k3", "k4"]
    assert run.skipped == 2 and run.skipped_failed == 1
    run.close()
    again = prepare(tmp_path, inputs=data, key="id", out=str(out), retry_failed=True)
    assert [r.key for r in again.rows()] == ["k1", "k2", "k3", "k4"]
    assert again.skipped_failed == 0
    # Only rows without any record are collected from an earlier run's batch: a failed one is
    # run anew under --retry-failed.
    assert [k for k in ("k0", "k1", "k2") if again.unrecorded(k)] == ["k2"]
    again.close()
    fresh = prepare(tmp_path, inputs=data, key="id")
    assert fresh.unrecorded("k0") and fresh.unrecorded("k1")
    fresh.close()


def test_a_first_slice_that_renders_no_row_stops_the_run_before_out_is_opened(tmp_path):
    out = tmp_path / "out.jsonl"
    data = str(rows_file(tmp_path))
    with pytest.raises(ClonefleetError, match="path"):
        prepare(tmp_path, "Say {{ input.path }}", inputs=data, out=str(out))
    assert not out.exists()


def test_one_row_that_renders_is_enough_to_start(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"y": 1}\n{"x": 2}\n')
    run = prepare(tmp_path, inputs=str(data))
    assert run.to_run == 2
    run.close()


def test_a_csv_out_of_another_shape_is_refused(tmp_path):
    out = tmp_path / "out.csv"
    out.write_text("key,status,outcome,other\r\n")
    with pytest.raises(UsageError, match="out.csv"):
        prepare(tmp_path, inputs=str(rows_file(tmp_path)), out=str(out))


def test_a_bad_row_is_handed_on_as_a_row_error(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"x": 1}\nnot json\n')
    run = prepare(tmp_path, inputs=str(data))
    errors = [r for r in run.rows() if isinstance(r, RowError)]
    assert len(errors) == 1 and errors[0].line == 2
    run.close()


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 30), limit=st.none() | st.integers(1, 40), done=st.sets(st.integers(0, 29)))
def test_rows_to_run_are_the_limited_rows_less_those_done(tmp_path_factory, n, limit, done):
    tmp_path = tmp_path_factory.mktemp("case")
    out = tmp_path / "out.jsonl"
    out.write_text("".join(record(f"k{i}", True) for i in sorted(done)))
    run = prepare(tmp_path, inputs=str(rows_file(tmp_path, n)), key="id", limit=limit, out=str(out))
    taken = range(min(n, limit or n))
    expected = [f"k{i}" for i in taken if i not in done]
    assert run.to_run == len(expected) and [r.key for r in run.rows()] == expected
    run.close()


def test_counted_later_a_duplicate_key_is_raised_by_wait_counted_and_the_count_kept(tmp_path):
    data = rows_file(tmp_path, 300)
    with data.open("a") as f:
        f.write(json.dumps({"id": "k7", "x": 7}) + "\n")
    run = prepare(tmp_path, inputs=str(data), key="id", count_later=True)
    with pytest.raises(UsageError, match="k7"):
        run.wait_counted()
    assert run.counted
    run.wait_counted()  # said once

    ok = prepare(tmp_path, inputs=str(rows_file(tmp_path, 300)), key="id", count_later=True)
    assert ok.to_run == ok.total == 300 and ok.counted


def test_counted_later_a_first_slice_that_renders_no_row_is_still_said_at_once(tmp_path):
    with pytest.raises(ClonefleetError):
        prepare(
            tmp_path, "{{ input.missing.deep }}", inputs=str(rows_file(tmp_path)), count_later=True
        )


def test_with_records_in_out_the_rows_are_counted_at_once_even_when_asked_later(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(record("k0", True))
    run = prepare(
        tmp_path, inputs=str(rows_file(tmp_path)), key="id", out=str(out), count_later=True
    )
    assert run.counted and run.to_run == 4 and run.total == 5
    run.close()
