"""``--out results.csv``: one CSV row per run record, its columns fixed before the first row."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import Any

from clonefleet.config import Config, usage_cost

__all__ = ["CsvResults"]

LEAD = ("key", "status", "outcome")
TAIL = ("cost_usd", "error")
REST = "result_json"
INPUT = "input"
RESULT_PREFIX = "result."


def _cell(value: Any) -> str:
    """A value as CSV text: strings as they are, ``None`` empty, other scalars as JSON text,
    objects and lists as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


class CsvResults:
    """The CSV form of run records, for a results file named ``*.csv``.

    Columns: ``key``, ``status``, ``outcome``; one per top-level property of the exit schema, in
    the schema's order (named ``result.<name>`` when the name is one of the other columns); then
    ``cost_usd``, ``error``; then ``result_json``, the rest of the payload as JSON (fields the
    schema does not list, or the whole result when it is not an object), empty when there is no
    rest; then ``input``, the row as JSON, with ``include_input``. Rows stream, so the columns
    come from the schema, never from the results.

    ``cost_usd`` is the record's own ``cost_usd`` when it has one, else its usage priced by
    ``config`` (empty when the model has no price or no config is given).
    """

    def __init__(
        self,
        exit_schema: Mapping[str, Any] | None,
        *,
        include_input: bool = False,
        config: Config | None = None,
    ) -> None:
        props = (exit_schema or {}).get("properties")
        self.fields: tuple[str, ...] = tuple(props) if isinstance(props, Mapping) else ()
        """The exit payload's fields that have a column of their own, in order."""
        fixed = {*LEAD, *TAIL, REST, INPUT}
        self.columns: tuple[str, ...] = (
            *LEAD,
            *(RESULT_PREFIX + f if f in fixed else f for f in self.fields),
            *TAIL,
            REST,
            *((INPUT,) if include_input else ()),
        )
        """The header row."""
        self.include_input = include_input
        self._config = config

    def header(self) -> str:
        """The header line, with its line break (CRLF, as RFC 4180 has it)."""
        return self._line(list(self.columns))

    def row(self, record: Mapping[str, Any], row: object = None) -> list[str]:
        """The cells of one run record (``row`` is the input row, for ``include_input``)."""
        result = record.get("result")
        if isinstance(result, Mapping):
            cells = [_cell(result.get(f)) for f in self.fields]
            rest = {k: v for k, v in result.items() if k not in self.fields}
            rest_cell = _cell(rest) if rest else ""
        else:
            cells = [""] * len(self.fields)
            rest_cell = _cell(result)
        return [
            _cell(record.get("key")),
            _cell(record.get("status")),
            _cell(record.get("outcome")),
            *cells,
            _cell(self._cost(record)),
            _cell(record.get("error")),
            rest_cell,
            *((_cell(row),) if self.include_input else ()),
        ]

    def line(self, record: Mapping[str, Any], row: object = None) -> str:
        """One record as a CSV line, with its line break."""
        return self._line(self.row(record, row))

    def _cost(self, record: Mapping[str, Any]) -> Any:
        if "cost_usd" in record:
            return record["cost_usd"]
        usage = record.get("usage")
        if self._config is None or not isinstance(usage, Mapping):
            return None
        model = record.get("model")
        return usage_cost(self._config, model if isinstance(model, str) else None, usage)

    @staticmethod
    def _line(cells: list[str]) -> str:
        out = io.StringIO()
        csv.writer(out, lineterminator="\r\n").writerow(cells)  # RFC 4180; a lone CR is quoted
        return out.getvalue()
