"""ResultsIndex: which keys a results file says are done, read in one bounded pass."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.errors import UsageError
from clonefleet.results import KeyState, ResultsIndex
from clonefleet.vocab import run_record

pytestmark = pytest.mark.timeout(60)


def record(key: str | None, status: str = "completed", outcome: str | None = "success") -> dict:
    """A run record as ``run --out`` writes it, with the row's ``key``."""
    source = SimpleNamespace(
        job_id="sa_0000abcd",
        batch_id="b_0000abcd",
        agent="reviewer",
        clone_index=0,
        status=status,
        stop_reason=status,
        outcome=outcome,
        result={"success": outcome == "success", "summary": "done"},
        salvaged=False,
        nonconforming=False,
        concerns=(),
        warnings=(),
        error=None if status == "completed" else "Error: subagent run failed",
        model="sim-small",
        turns=1,
        usage={"input_tokens": 10, "output_tokens": 2},
        cause=None,
        key=key,
    )
    return {**run_record(source), "key": key}


def line(rec: dict[str, Any]) -> str:
    return json.dumps(rec) + "\n"


def write(path: Path, *parts: str | bytes) -> Path:
    path.write_bytes(b"".join(p.encode() if isinstance(p, str) else p for p in parts))
    return path


def test_missing_and_empty_files_are_empty_indexes(tmp_path: Path) -> None:
    missing = ResultsIndex.read(tmp_path / "none.jsonl")
    empty = ResultsIndex.read(write(tmp_path / "empty.jsonl"))
    for index in (missing, empty):
        assert len(index) == 0 and index.torn_offset is None and index.report() is None
        assert not index.skip("a") and not index.skip("a", retry_failed=True)


def test_states_and_skip(tmp_path: Path) -> None:
    path = write(
        tmp_path / "r.jsonl",
        line(record("ok")),
        line(record("bad", "failed", "failure")),
        line(record("gave-up", "completed", "failure")),
        line(record("stopped", "cancelled", "cancelled")),
    )
    index = ResultsIndex.read(path)
    assert index.state("ok") is KeyState.SUCCEEDED
    assert [index.state(k) for k in ("bad", "gave-up", "stopped")] == [KeyState.FAILED] * 3
    assert index.state("never") is None
    assert index.skip("ok") and index.skip("ok", retry_failed=True)
    assert index.skip("bad") and not index.skip("bad", retry_failed=True)
    assert not index.skip("never")
    assert index.counts() == {KeyState.SUCCEEDED: 1, KeyState.FAILED: 3}
    assert index.keys() == ["ok", "bad", "gave-up", "stopped"]


def test_latest_record_of_a_key_wins(tmp_path: Path) -> None:
    path = write(
        tmp_path / "r.jsonl",
        line(record("a", "failed", "failure")),
        line(record("b")),
        line(record("a")),
        line(record("b", "failed", "failure")),
    )
    index = ResultsIndex.read(path)
    assert index.state("a") is KeyState.SUCCEEDED
    assert index.state("b") is KeyState.FAILED


def test_records_without_a_key_or_not_terminal_count_for_nothing(tmp_path: Path) -> None:
    no_key = record(None)
    del no_key["key"]
    path = write(
        tmp_path / "r.jsonl",
        line(no_key),
        line(record(None)),
        line(record("run", "running", None)),
        line(record("k")),
    )
    index = ResultsIndex.read(path)
    assert index.keys() == ["k"] and index.unkeyed == 2 and index.bad_count == 0


def test_a_torn_last_line_is_ignored_and_remembered(tmp_path: Path) -> None:
    whole = line(record("a")) + line(record("b"))
    torn = line(record("c"))[:-20]
    path = write(tmp_path / "r.jsonl", whole, torn)
    index = ResultsIndex.read(path)
    assert index.keys() == ["a", "b"]
    assert index.torn_offset == len(whole.encode()) and index.bad_count == 0
    assert "torn last line" in (index.report() or "")


def test_a_whole_last_line_without_a_line_break_is_a_record(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", line(record("a")), line(record("b"))[:-1])
    index = ResultsIndex.read(path)
    assert index.keys() == ["a", "b"] and index.torn_offset is None and index.needs_newline


def test_bad_middle_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = write(
        tmp_path / "r.jsonl",
        line(record("a")),
        "{not json\n",
        "[1, 2]\n",
        b"\xff\xfe\n",
        line({"key": 7, "status": "completed", "outcome": "success"}),
        line({"key": "x"}),
        "\n",
        line(record("b")),
    )
    index = ResultsIndex.read(path)
    assert index.keys() == ["a", "b"] and index.torn_offset is None
    assert index.bad_count == 5
    assert [b.line for b in index.bad_lines] == [2, 3, 4, 5, 6]
    assert "not JSON" in index.bad_lines[0].reason
    assert "not a JSON object" in index.bad_lines[1].reason
    assert "not a string" in index.bad_lines[3].reason
    report = index.report() or ""
    assert "5 bad lines" in report and "line 2:" in report and "and 2 more" in report
    assert str(path) in report


def test_an_overlong_line_is_skipped_with_bounded_memory(tmp_path: Path) -> None:
    big = record("big")
    big["result"] = {"summary": "x" * 5000}
    path = write(tmp_path / "r.jsonl", line(record("a")), line(big), line(record("b")))
    index = ResultsIndex.read(path, limit=1000)
    assert index.keys() == ["a", "b"] and index.bad_count == 1
    assert "longer than" in index.bad_lines[0].reason
    torn = write(tmp_path / "t.jsonl", line(record("a")), line(big)[:-1])
    index = ResultsIndex.read(torn, limit=1000)
    assert index.keys() == ["a"] and index.torn_offset == len(line(record("a")).encode())


def test_unicode_keys(tmp_path: Path) -> None:
    keys = ["naïve/ファイル.py", "emoji 🎉", "tab\tand\nnewline", "\u202etrick"]
    path = write(tmp_path / "r.jsonl", *(line(record(k)) for k in keys))
    assert ResultsIndex.read(path).keys() == keys


def test_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        ResultsIndex.read(tmp_path)


def test_a_fifo_has_nothing_to_resume(tmp_path: Path) -> None:
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    index = ResultsIndex.read(fifo)  # not opened: a FIFO would block, and has no past
    assert len(index) == 0 and index.size == 0


def test_the_index_holds_keys_only(tmp_path: Path) -> None:
    import tracemalloc

    n = 20_000
    path = tmp_path / "r.jsonl"
    with path.open("w") as f:
        for i in range(n):
            f.write(line(record(f"row-{i:06d}", *(("failed", "failure") if i % 7 else ()))))
    tracemalloc.start()
    try:
        index = ResultsIndex.read(path)
        current, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index) == n
    assert current < 200 * n  # a key string and a dict slot each; no records


FUZZ = settings(max_examples=60, deadline=None, database=None)
FUZZ = settings(FUZZ, suppress_health_check=[HealthCheck.function_scoped_fixture])

EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "ü"]),
        st.sampled_from(
            [("completed", "success"), ("failed", "failure"), ("completed", "failure")]
        ),
    ),
    max_size=30,
)


@FUZZ
@given(events=EVENTS, cut=st.integers(min_value=0, max_value=400))
def test_property_latest_wins_and_any_cut_of_the_tail_is_torn(
    tmp_path: Path, events: list[tuple[str, tuple[str, str]]], cut: int
) -> None:
    """Whatever the records, the index says the latest state of each key; cutting the last
    record anywhere leaves the earlier ones, and the torn tail starts at its line."""
    body = "".join(line(record(k, s, o)) for k, (s, o) in events)
    path = write(tmp_path / "p.jsonl", body)
    index = ResultsIndex.read(path)
    want: dict[str, bool] = {}
    for k, (s, o) in events:
        want[k] = s == "completed" and o == "success"
    assert {k: index.state(k) is KeyState.SUCCEEDED for k in index.keys()} == want
    if not events:
        return
    last = line(record("z"))
    cut = cut % len(last)  # 0 .. len-1: the newline is never kept
    write(path, body, last[:cut])
    index = ResultsIndex.read(path)
    assert set(index.keys()) == set(want) and index.bad_count == 0
    if cut and last[:cut].strip():
        whole_json = cut == len(last) - 1
        assert index.torn_offset == (None if whole_json else len(body.encode()))
