"""Inputs files: the rows a definition is mapped over, one clone per row (docs/inputs.md).

Pure and streaming: JSONL, CSV, TSV and text files are read in binary one row at a time with a
bound on a row's size, each row that cannot be parsed failing alone (:class:`RowError`); whole-file
problems are one :class:`~clonefleet.errors.UsageError` before anything starts. Standard library
only; no Ray.
"""

from clonefleet.inputs._format import InputFormat as InputFormat
from clonefleet.inputs._format import input_format as input_format
from clonefleet.inputs._lines import MIB as MIB
from clonefleet.inputs._rows import Row as Row
from clonefleet.inputs._rows import RowError as RowError
from clonefleet.inputs._rows import read_rows as read_rows
from clonefleet.inputs._source import check_source as check_source
from clonefleet.inputs._source import count_and_check_keys as count_and_check_keys
from clonefleet.inputs._source import spool as spool

__all__ = [
    "MIB",
    "InputFormat",
    "Row",
    "RowError",
    "check_source",
    "count_and_check_keys",
    "input_format",
    "read_rows",
    "spool",
]
