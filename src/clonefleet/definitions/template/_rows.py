"""A dataset row as templates see it: the ``input`` variable of a clone mapped over a row.

A data row (a JSON object, a CSV or TSV line under its header) is a :class:`RowData`: a mapping
whose text is its compact JSON, so ``{{ input }}`` prints the whole row and ``{{ input.path }}``
one field; nested objects and lists print as JSON too. A text row (one line of a plain-text
file) is the string itself. Row values are data: they are never rendered as templates, so a
field holding ``{{ x }}`` prints those braces as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["RowData", "RowList", "row_value"]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


class RowData(dict[str, Any]):
    """A data row (or an object nested in one): a dict whose ``str()`` is its compact JSON.

    In a template, ``input.name`` reads the field ``name`` even where a dict method has that
    name (``input.items`` is the row's ``items`` field when it has one).
    """

    __slots__ = ()

    def __str__(self) -> str:
        return _json(self)


class RowList(list[Any]):
    """A list inside a data row: a list whose ``str()`` is its compact JSON."""

    __slots__ = ()

    def __str__(self) -> str:
        return _json(self)


def row_value(data: Any) -> Any:
    """``data`` as a template's ``input``: mappings become :class:`RowData` and lists
    :class:`RowList`, all the way down (keys become strings); strings, numbers, booleans and
    ``None`` stay as they are."""
    if isinstance(data, Mapping):
        return RowData((str(k), row_value(v)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return RowList(row_value(v) for v in data)
    return data
