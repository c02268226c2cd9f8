"""Choosing the format of an inputs file: by name, by extension, by sniffing standard input."""

from __future__ import annotations

from pathlib import Path

import pytest

from clonefleet.errors import UsageError
from clonefleet.inputs import InputFormat, input_format

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("rows.jsonl", InputFormat.JSONL),
        ("rows.ndjson", InputFormat.JSONL),
        ("ROWS.JSONL", InputFormat.JSONL),
        ("table.csv", InputFormat.CSV),
        ("table.tsv", InputFormat.TSV),
        ("table.tab", InputFormat.TSV),
        ("lines.txt", InputFormat.TEXT),
        ("files", InputFormat.TEXT),
        ("data.json", InputFormat.TEXT),
        ("dir.d/list", InputFormat.TEXT),
    ],
)
def test_the_extension_decides(name: str, expected: InputFormat) -> None:
    assert input_format(name) is expected
    assert input_format(Path(name)) is expected


def test_an_explicit_format_wins_over_the_extension() -> None:
    assert input_format("rows.jsonl", "csv") is InputFormat.CSV
    assert input_format("rows.txt", " TSV ") is InputFormat.TSV
    assert input_format("-", "text") is InputFormat.TEXT


def test_an_unknown_explicit_format_names_the_four() -> None:
    with pytest.raises(UsageError) as caught:
        input_format("rows.jsonl", "json")
    message = str(caught.value)
    assert "'json'" in message
    assert all(name in message for name in ("jsonl", "csv", "tsv", "text"))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"a": 1}\n', InputFormat.JSONL),
        (b'\n  \n\r\n  {"a": 1}\n', InputFormat.JSONL),
        (b"\xef\xbb\xbf{}\n", InputFormat.JSONL),
        (b"a,b\n1,2\n", InputFormat.TEXT),
        (b"[1, 2]\n", InputFormat.TEXT),
        (b"", InputFormat.TEXT),
        (b"\n\n", InputFormat.TEXT),
    ],
)
def test_standard_input_is_sniffed_from_its_spooled_copy(
    tmp_path: Path, content: bytes, expected: InputFormat
) -> None:
    spooled = tmp_path / "stdin.spool"
    spooled.write_bytes(content)
    assert input_format("-", content=spooled) is expected
