"""The count and key pass of an inputs file (``clonefleet.inputs.count_and_check_keys``) on a
1,000,000-row JSONL of small objects, with and without a key, and reading every row.

Writes the file in a temporary folder (removed after) and prints one JSON object: seconds per
pass, and the peak of Python's allocations (tracemalloc) in a keyed pass of its own.

    PYTHONPATH=src python benchmarks/inputs_count.py [ROWS]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from clonefleet.inputs import count_and_check_keys, read_rows


def main(rows: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rows.jsonl"
        with path.open("w", encoding="utf-8") as out:
            for index in range(rows):
                out.write(f'{{"id": "row-{index}", "path": "src/file_{index}.py", "n": {index}}}\n')
        result: dict[str, float | int] = {"rows": rows, "bytes": path.stat().st_size}
        start = time.perf_counter()
        count = count_and_check_keys(path, "jsonl", key=None, limit=None, max_count=rows)
        result["count_without_key_s"] = round(time.perf_counter() - start, 3)
        assert count == rows
        start = time.perf_counter()
        count = count_and_check_keys(path, "jsonl", key="id", limit=None, max_count=rows)
        result["count_with_key_s"] = round(time.perf_counter() - start, 3)
        assert count == rows
        tracemalloc.start()  # a pass of its own: tracing slows it several times over
        count_and_check_keys(path, "jsonl", key="id", limit=None, max_count=rows)
        result["count_with_key_peak_mib"] = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
        tracemalloc.stop()
        start = time.perf_counter()
        read = sum(1 for _row in read_rows(path, "jsonl", key="id"))
        result["read_rows_s"] = round(time.perf_counter() - start, 3)
        assert read == rows
    print(json.dumps(result))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
