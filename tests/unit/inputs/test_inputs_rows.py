"""Reading the rows of an inputs file: every format, bad rows failing alone, keys, bounds, limits.

Files are real files in ``tmp_path`` (a FIFO is fed by a thread); a 100 MB line is written in
1 MiB pieces and read under tracemalloc to show it never sits in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.errors import UsageError
from clonefleet.inputs import MIB, Row, RowError, read_rows

pytestmark = pytest.mark.timeout(60)


def write(tmp_path: Path, name: str, content: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def rows_of(path: Path, fmt: str, **options: Any) -> list[Row | RowError]:
    return list(read_rows(path, fmt, **options))


# JSONL


def test_jsonl_rows_are_objects_numbered_by_line_and_blank_lines_are_not_rows(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "rows.jsonl", '{"a": 1}\n\n   \n{"b": [1, "x"]}\r\n\n{"c": null}')
    assert rows_of(path, "jsonl") == [
        Row(1, "1", {"a": 1}),
        Row(4, "4", {"b": [1, "x"]}),
        Row(6, "6", {"c": None}),
    ]


def test_a_malformed_json_line_fails_alone(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", '{"a": 1}\n{"a": \n{"a": 3}\n')
    rows = rows_of(path, "jsonl")
    assert rows[0] == Row(1, "1", {"a": 1})
    assert rows[2] == Row(3, "3", {"a": 3})
    bad = rows[1]
    assert isinstance(bad, RowError)
    assert (bad.line, bad.key) == (2, "2")
    assert bad.reason.startswith("not valid JSON: Expecting value at column")
    assert bad.message.startswith("line 2: not valid JSON: ")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("[1, 2]", "an array, not a JSON object"),
        ('"text"', "a string, not a JSON object"),
        ("12", "a number, not a JSON object"),
        ("null", "null, not a JSON object"),
        ("true", "a boolean, not a JSON object"),
        ('{"a": NaN}', "not valid JSON: NaN is not a JSON value"),
        ('{"a": -Infinity}', "not valid JSON: -Infinity is not a JSON value"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),
    ],
)
def test_a_line_that_is_not_a_json_object_says_what_it_is(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = write(tmp_path, "rows.jsonl", f'{{"ok": 1}}\n{line}\n')
    assert rows_of(path, "jsonl") == [Row(1, "1", {"ok": 1}), RowError(2, "2", reason)]


def test_invalid_utf8_fails_that_row_alone(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", b'{"a": "x"}\n{"a": "\xff"}\n{"a": "\xc3\xa9"}\n')
    assert rows_of(path, "jsonl") == [
        Row(1, "1", {"a": "x"}),
        RowError(2, "2", "not valid UTF-8 (byte 0xff at column 8)"),
        Row(3, "3", {"a": "é"}),
    ]


def test_a_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", b'\xef\xbb\xbf{"a": 1}\n')
    assert rows_of(path, "jsonl") == [Row(1, "1", {"a": 1})]


# keys


def test_a_key_field_keys_the_rows_and_numbers_are_their_json_text(tmp_path: Path) -> None:
    lines = ['{"id": "a-1"}', '{"id": 7}', '{"id": 2.5}', '{"id": 10000000000000000000001}']
    path = write(tmp_path, "rows.jsonl", "\n".join(lines))
    keys = [row.key for row in rows_of(path, "jsonl", key="id")]
    assert keys == ["a-1", "7", "2.5", "10000000000000000000001"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"other": 1}', "no key field 'id'"),
        ('{"id": null}', "the key field 'id' is null, not a string or number"),
        ('{"id": ""}', "the key field 'id' is empty"),
        ('{"id": true}', "the key field 'id' is a boolean, not a string or number"),
        ('{"id": [1]}', "the key field 'id' is an array, not a string or number"),
        ('{"id": {"a": 1}}', "the key field 'id' is an object, not a string or number"),
    ],
)
def test_a_row_without_a_usable_key_fails_alone_naming_the_field(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = write(tmp_path, "rows.jsonl", f'{{"id": "first"}}\n{line}\n{{"id": "last"}}\n')
    rows = rows_of(path, "jsonl", key="id")
    assert rows[1] == RowError(2, None, reason)
    assert [row.key for row in (rows[0], rows[2])] == ["first", "last"]


def test_a_key_for_text_rows_is_a_usage_error_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "lines.txt", "a\nb\n")
    with pytest.raises(UsageError, match="text rows have no fields") as caught:
        read_rows(path, "text", key="id")
    assert str(path) in str(caught.value)


def test_a_key_that_is_not_a_csv_column_is_a_usage_error_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "table.csv", "name,path\nx,y\n")
    with pytest.raises(UsageError) as caught:
        read_rows(path, "csv", key="id", name="table.csv")
    message = str(caught.value)
    assert "table.csv" in message
    assert "'id' is not a column" in message
    assert "line 1: name, path" in message


# CSV and TSV


def test_csv_rows_are_dicts_and_quoted_newlines_keep_the_starting_line(tmp_path: Path) -> None:
    content = 'id,text\n1,"two\nlines"\n\n2,"say ""hi"""\r\n3,"a\r\nb\r\nc",\n4,end\n'
    path = write(tmp_path, "table.csv", content)
    assert rows_of(path, "csv", key="id") == [
        Row(2, "1", {"id": "1", "text": "two\nlines"}),
        Row(5, "2", {"id": "2", "text": 'say "hi"'}),
        RowError(6, None, "3 fields, the header has 2"),
        Row(9, "4", {"id": "4", "text": "end"}),
    ]


def test_a_csv_record_with_the_wrong_number_of_fields_fails_alone(tmp_path: Path) -> None:
    path = write(tmp_path, "table.csv", "a,b,c,d\n1,2,3,4\n1,2,3\n5\n1,2,3,4\n")
    rows = rows_of(path, "csv")
    assert rows[1] == RowError(3, "3", "3 fields, the header has 4")
    assert rows[2] == RowError(4, "4", "1 field, the header has 4")
    assert rows[1].message == "line 3: 3 fields, the header has 4"
    assert rows[3] == Row(5, "5", {"a": "1", "b": "2", "c": "3", "d": "4"})


def test_tsv_rows_split_on_tabs(tmp_path: Path) -> None:
    path = write(tmp_path, "table.tsv", "\ufeffname\tnote\nx, y\tz\n")
    assert rows_of(path, "tsv", key="name") == [Row(2, "x, y", {"name": "x, y", "note": "z"})]


def test_a_csv_header_that_repeats_a_column_is_a_usage_error(tmp_path: Path) -> None:
    path = write(tmp_path, "table.csv", "\n\na,b,a\n1,2,3\n")
    with pytest.raises(UsageError, match=r"line 3: the column 'a' is twice in the header"):
        read_rows(path, "csv")


def test_a_csv_header_that_cannot_be_read_is_a_usage_error(tmp_path: Path) -> None:
    path = write(tmp_path, "table.csv", b"a,\xff\n1,2\n")
    with pytest.raises(UsageError, match=r"table.csv: line 1: the header is not valid UTF-8"):
        read_rows(path, "csv")


def test_invalid_utf8_in_a_csv_record_fails_that_record_alone(tmp_path: Path) -> None:
    path = write(tmp_path, "table.csv", b'a,b\n1,"x\n\xfe\ny"\n2,z\n')
    assert rows_of(path, "csv") == [
        RowError(2, "2", "not valid UTF-8 (byte 0xfe at column 1)"),
        Row(5, "5", {"a": "2", "b": "z"}),
    ]


def test_an_empty_csv_file_has_no_rows(tmp_path: Path) -> None:
    assert rows_of(write(tmp_path, "table.csv", ""), "csv") == []
    assert rows_of(write(tmp_path, "header.csv", "a,b\n\n"), "csv") == []


def test_a_csv_field_may_be_as_long_as_a_row(tmp_path: Path) -> None:
    long = "x" * 300_000
    path = write(tmp_path, "table.csv", f"a,b\n1,{long}\n")
    assert rows_of(path, "csv") == [Row(2, "2", {"a": "1", "b": long})]


# text


def test_text_rows_are_lines_without_their_ending(tmp_path: Path) -> None:
    path = write(tmp_path, "lines.txt", "first\r\n\n  indented \n\t\nlast")
    assert rows_of(path, "text") == [
        Row(1, "1", "first"),
        Row(3, "3", "  indented "),
        Row(5, "5", "last"),
    ]


# bounds


def test_a_row_of_exactly_the_bound_is_read_and_one_byte_more_fails(tmp_path: Path) -> None:
    exact, over = "a" * 20, "b" * 21
    path = write(tmp_path, "lines.txt", f"{exact}\n{over}\n{exact}\r\n{over}\r\n{over}")
    assert rows_of(path, "text", max_row_bytes=20) == [
        Row(1, "1", exact),
        RowError(2, "2", "longer than 20 bytes"),
        Row(3, "3", exact),
        RowError(4, "4", "longer than 20 bytes"),
        RowError(5, "5", "longer than 20 bytes"),
    ]


def test_a_csv_record_longer_than_the_bound_over_several_lines_fails(tmp_path: Path) -> None:
    path = write(tmp_path, "table.csv", 'a,b\n1,"' + "x\n" * 40 + '"\n2,ok\n')
    rows = rows_of(path, "csv", max_row_bytes=50)
    assert rows[0] == RowError(2, "2", "longer than 50 bytes")
    assert rows[1:] == [Row(43, "43", {"a": "2", "b": "ok"})]


def big_line_file(path: Path, megabytes: int) -> Path:
    """A JSONL file whose second line is ``megabytes`` MiB long, written a piece at a time."""
    piece = b"x" * MIB
    with path.open("wb") as out:
        out.write(b'{"n": 1}\n{"big": "')
        for _ in range(megabytes):
            out.write(piece)
        out.write(b'"}\n{"n": 3}\n')
    return path


def test_a_100_mb_line_fails_alone_and_is_never_held_in_memory(tmp_path: Path) -> None:
    path = big_line_file(tmp_path / "big.jsonl", 100)
    tracemalloc.start()
    try:
        rows = rows_of(path, "jsonl")
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == [
        Row(1, "1", {"n": 1}),
        RowError(2, "2", "longer than 1 MiB"),
        Row(3, "3", {"n": 3}),
    ]
    assert peak < 3 * MIB, peak


# limits, closing, files


def test_a_limit_stops_after_that_many_rows_counting_failed_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", '{"a": 1}\nbad\n\n{"a": 3}\n{"a": 4}\n')
    rows = rows_of(path, "jsonl", limit=3)
    assert [row.line for row in rows] == [1, 2, 4]
    assert isinstance(rows[1], RowError)
    with pytest.raises(UsageError, match="at least 1"):
        read_rows(path, "jsonl", limit=0)


def test_a_missing_file_is_a_usage_error_at_once(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="inputs file gone.jsonl: no such file"):
        read_rows(tmp_path / "gone.jsonl", "jsonl", name="gone.jsonl")
    with pytest.raises(UsageError, match="is a directory"):
        read_rows(tmp_path, "jsonl")


def test_closing_the_rows_early_closes_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", '{"a": 1}\n{"a": 2}\n')
    before = len(os.listdir("/proc/self/fd"))
    rows = read_rows(path, "jsonl")
    assert next(rows) == Row(1, "1", {"a": 1})
    rows.close()
    assert len(os.listdir("/proc/self/fd")) == before


@contextlib.contextmanager
def fifo_fed(tmp_path: Path, content: bytes) -> Iterator[Path]:
    """A FIFO in ``tmp_path`` that a thread fills with ``content`` once it is opened."""
    path = tmp_path / "rows.fifo"
    os.mkfifo(path)

    def feed() -> None:
        with path.open("wb") as out:
            for start in range(0, len(content), 4096):
                out.write(content[start : start + 4096])

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_rows_stream_from_a_fifo(tmp_path: Path) -> None:
    content = "".join(json.dumps({"i": i}) + "\n" for i in range(5000)).encode()
    with fifo_fed(tmp_path, content) as path:
        rows = rows_of(path, "jsonl", key="i")
    assert [row.key for row in rows] == [str(i) for i in range(5000)]
    assert rows[-1] == Row(5000, "4999", {"i": 4999})


# the property

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    objects=st.lists(st.dictionaries(st.text(), JSON_VALUES, max_size=4), max_size=20),
    blanks=st.lists(st.sampled_from(["", "  ", "\t", "\r"]), max_size=20),
    crlf=st.booleans(),
)
def test_rows_written_as_jsonl_read_back_equal_in_order_with_their_lines(
    tmp_path: Path, objects: list[dict[str, Any]], blanks: list[str], crlf: bool
) -> None:
    ending = "\r\n" if crlf else "\n"
    lines: list[str] = []
    expected: list[Row] = []
    for index, obj in enumerate(objects):
        if index < len(blanks):
            lines.append(blanks[index])
        lines.append(json.dumps(obj, ensure_ascii=index % 2 == 0))
        expected.append(Row(len(lines), str(len(lines)), obj))
    path = tmp_path / "prop.jsonl"
    path.write_text(ending.join(lines) + ending, encoding="utf-8", newline="")
    assert rows_of(path, "jsonl") == expected
