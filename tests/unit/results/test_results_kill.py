"""A writer killed with SIGKILL mid-stream, then a second writer appending: the file keeps every
complete record, has no torn line in the middle, and its index has exactly the keys written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import clonefleet
from clonefleet.results import KeyState, ResultsIndex, ResultsWriter

pytestmark = pytest.mark.timeout(60)

CHILD = """
import sys, time
from clonefleet.results import ResultsWriter
path, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = ResultsWriter(path, include_input=True)
for i in range(count):
    key = f"k{i:05d}"
    out.write(
        {"key": key, "status": "completed", "outcome": "success",
         "result": {"summary": "x" * size}},
        {"row": i},
    )
time.sleep(60)  # killed before it ends
"""


def kill_mid_stream(path: Path, *, size: int, count: int, after_lines: int) -> None:
    """Start a child writing ``count`` records of about ``size`` bytes to ``path`` and SIGKILL
    it once ``after_lines`` lines are in the file (or after it wrote them all)."""
    src = str(Path(clonefleet.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(size), str(count)], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child.poll() is None:
            if path.exists() and path.read_bytes().count(b"\n") >= after_lines:
                break
            time.sleep(0.005)
        assert child.poll() is None, "the writer ended before it was killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(10)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize(("size", "after_lines"), [(200, 50), (2_000_000, 2)])
def test_a_killed_writer_then_a_second_writer(tmp_path: Path, size: int, after_lines: int) -> None:
    path = tmp_path / "results.jsonl"
    kill_mid_stream(path, size=size, count=400 if size < 1000 else 30, after_lines=after_lines)

    index = ResultsIndex.read(path)
    written = index.keys()
    assert len(written) >= after_lines and index.bad_count == 0
    assert written == [f"k{i:05d}" for i in range(len(written))]  # in order, none lost
    if index.torn_offset is not None:
        assert index.torn_offset == path.read_bytes().rindex(b"\n") + 1

    with ResultsWriter(path, include_input=True) as out:
        assert not out.write({"key": written[0], "status": "completed", "outcome": "success"})
        for i in range(3):
            key = f"after-{i}"
            assert out.write({"key": key, "status": "completed", "outcome": "success"}, i)
        assert out.refused == 1

    data = path.read_bytes()
    assert data.endswith(b"\n")
    records = [json.loads(line) for line in data.splitlines()]  # every line whole
    assert [r["key"] for r in records] == [*written, "after-0", "after-1", "after-2"]
    assert [r["input"] for r in records[: len(written)]] == [
        {"row": i} for i in range(len(written))
    ]
    again = ResultsIndex.read(path)
    assert again.keys() == [*written, "after-0", "after-1", "after-2"]
    assert again.bad_count == 0 and again.torn_offset is None
    assert again.counts() == {KeyState.SUCCEEDED: len(written) + 3, KeyState.FAILED: 0}
