"""ResultsWriter: appending records safely, mending a torn tail, refusing a second success."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from clonefleet.errors import UsageError
from clonefleet.results import KeyState, ResultsIndex, ResultsWriter

pytestmark = pytest.mark.timeout(60)


def record(key: str | None, status: str = "completed", outcome: str | None = "success") -> dict:
    return {
        "job_id": "sa_0000abcd",
        "key": key,
        "status": status,
        "outcome": outcome,
        "result": {"success": outcome == "success", "summary": f"row {key}"},
        "error": None,
    }


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_writes_one_line_per_record_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as out:
        assert out.write(record("a")) and out.write(record("b", "failed", "failure"))
        assert out.write(record(None))
    assert [r["key"] for r in lines(path)] == ["a", "b", None]
    index = ResultsIndex.read(path)
    assert index.state("a") is KeyState.SUCCEEDED and index.state("b") is KeyState.FAILED
    assert out.written == 3 and out.refused == 0


def test_a_second_success_of_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as out:
        out.write(record("a", "failed", "failure"))
        assert out.write(record("a"))  # a retried failure may succeed
        assert not out.write(record("a"))  # but not succeed twice
        assert not out.write(record("a", "failed", "failure"))
    with ResultsWriter(path) as again:  # nor in a later run
        assert not again.write(record("a"))
        assert again.refused == 1
    assert [r["status"] for r in lines(path)] == ["failed", "completed"]


def test_a_torn_tail_is_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    whole = json.dumps(record("a")) + "\n"
    path.write_text(whole + json.dumps(record("b"))[:17])
    with ResultsWriter(path) as out:
        out.write(record("c"))
    assert [r["key"] for r in lines(path)] == ["a", "c"]
    assert path.read_text().startswith(whole)


def test_a_last_line_without_a_line_break_is_ended(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record("a")))
    with ResultsWriter(path) as out:
        assert not out.write(record("a"))
        out.write(record("b"))
    assert [r["key"] for r in lines(path)] == ["a", "b"]


def test_an_index_read_before_the_file_changed_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    index = ResultsIndex.read(path)
    path.write_text(json.dumps(record("a")) + "\n" + '{"key": "b", "sta')
    with ResultsWriter(path, index=index) as out:
        assert not out.write(record("a"))
        out.write(record("b"))
    assert [r["key"] for r in lines(path)] == ["a", "b"]
    assert out.index.state("b") is KeyState.SUCCEEDED


def test_include_input_puts_the_row_in_the_record(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    row = {"path": "src/ファイル.py", "n": 3, "tags": ["x"]}
    with ResultsWriter(path, include_input=True) as out:
        out.write(record("k"), row)
    with ResultsWriter(tmp_path / "plain.jsonl") as plain:
        plain.write(record("k"), row)
    assert lines(path)[0]["input"] == row
    assert "input" not in lines(tmp_path / "plain.jsonl")[0]


def test_unicode_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    keys = ["naïve", "🎉", "a\nb", "\ud800 lone surrogate"]
    with ResultsWriter(path) as out:
        for k in keys:
            out.write(record(k))
    assert ResultsIndex.read(path).keys() == keys
    assert len(path.read_bytes().splitlines()) == len(keys)


def test_a_second_writer_of_one_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path), pytest.raises(UsageError, match="another run") as err:
        ResultsWriter(path)
    assert str(path) in str(err.value)
    ResultsWriter(path).close()  # free again once closed


def test_bad_paths_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        ResultsWriter(tmp_path)
    with pytest.raises(UsageError, match="cannot open results file"):
        ResultsWriter(tmp_path / "no" / "such" / "r.jsonl")
    out = ResultsWriter(tmp_path / "r.jsonl")
    out.close()
    out.close()
    with pytest.raises(UsageError, match="is closed"):
        out.write(record("a"))


def test_syncs_at_most_once_a_second(tmp_path: Path) -> None:
    now = [0.0]
    out = ResultsWriter(tmp_path / "r.jsonl", clock=lambda: now[0])
    for i in range(5):
        out.write(record(f"k{i}"))
    assert out.synced_at == 0.0  # no sync yet within the first second
    now[0] = 1.5
    out.write(record("k5"))
    assert out.synced_at == 1.5
    out.close()


def test_a_fifo_is_written_as_a_stream(tmp_path: Path) -> None:
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 10
    while True:  # until the reader has the FIFO open (no reader: ENXIO, not a hang)
        try:
            out = ResultsWriter(fifo, exit_schema=None)
            break
        except UsageError as exc:
            assert os.strerror(errno.ENXIO) in str(exc) and time.monotonic() < deadline
            time.sleep(0.01)
    out.write(record("a"))
    out.close()
    reader.join(10)
    assert got == [
        b"key,status,outcome,cost_usd,error,result_json\r\n"
        b'a,completed,success,,,"{""success"":true,""summary"":""row a""}"\r\n'
    ]
