"""Results files keyed by row (``--out``, JSONL or CSV): reading what an earlier run wrote, to
skip the rows already done (:class:`ResultsIndex`), and appending records safely
(:class:`ResultsWriter`, with :class:`CsvResults` for CSV). Pure: files only, no Ray, no fleet.
See docs/inputs.md, "Results files and resuming".
"""

from __future__ import annotations

from clonefleet.results._csv import CsvResults as CsvResults
from clonefleet.results._index import BAD_LINES_KEPT as BAD_LINES_KEPT
from clonefleet.results._index import BadLine as BadLine
from clonefleet.results._index import KeyState as KeyState
from clonefleet.results._index import ResultsIndex as ResultsIndex
from clonefleet.results._index import is_csv as is_csv
from clonefleet.results._scan import MAX_RECORD_BYTES as MAX_RECORD_BYTES
from clonefleet.results._writer import SYNC_EVERY_S as SYNC_EVERY_S
from clonefleet.results._writer import ResultsWriter as ResultsWriter

__all__ = [
    "BAD_LINES_KEPT",
    "MAX_RECORD_BYTES",
    "SYNC_EVERY_S",
    "BadLine",
    "CsvResults",
    "KeyState",
    "ResultsIndex",
    "ResultsWriter",
    "is_csv",
]
