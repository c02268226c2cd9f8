"""Whole-file checks, the count and key pass, and spooling standard input or a FIFO."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.errors import UsageError
from clonefleet.inputs import (
    InputFormat,
    Row,
    check_source,
    count_and_check_keys,
    read_rows,
    spool,
)
from clonefleet.inputs._rows import row_keys
from clonefleet.inputs._source import _count_keyed

pytestmark = pytest.mark.timeout(60)


def write(tmp_path: Path, name: str, content: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@contextlib.contextmanager
def fifo_fed(tmp_path: Path, content: bytes) -> Iterator[Path]:
    """A FIFO in ``tmp_path`` that a thread fills with ``content`` once it is opened."""
    path = tmp_path / "rows.fifo"
    os.mkfifo(path)

    def feed() -> None:
        with path.open("wb") as out:
            out.write(content)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        thread.join(timeout=10)
        assert not thread.is_alive()


# check_source


def test_a_good_file_passes(tmp_path: Path) -> None:
    check_source(write(tmp_path, "rows.jsonl", '\n{"a": 1}\n'), "jsonl")
    check_source(write(tmp_path, "table.csv", "a\n1\n"), "csv")
    check_source(write(tmp_path, "bad.jsonl", "not json\n"), "jsonl")  # a row, failing alone


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^inputs file data.jsonl: no such file$"):
        check_source(tmp_path / "data.jsonl", "jsonl", name="data.jsonl")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory, not a file"):
        check_source(tmp_path, "jsonl")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", "{}\n")
    path.chmod(0)
    with pytest.raises(UsageError, match="cannot be read \\(permission denied\\)"):
        check_source(path, "jsonl")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc")
def test_a_file_whose_read_fails_is_refused_with_the_reason() -> None:
    # reading /proc/self/mem at offset 0 fails with EIO, whoever runs the test
    with pytest.raises(
        UsageError, match=r"^inputs file mem: cannot be read \(Input/output error\)$"
    ):
        check_source("/proc/self/mem", "jsonl", name="mem")


def test_a_binary_file_is_refused_naming_the_line_of_its_first_nul(tmp_path: Path) -> None:
    path = write(tmp_path, "data.csv", b"a,b\n1,2\n3,\x00\x01\x02\n")
    with pytest.raises(UsageError) as caught:
        check_source(path, "csv", name="data.csv")
    message = str(caught.value)
    assert message.startswith("inputs file data.csv: line 3: a NUL byte")
    assert "binary" in message


@pytest.mark.parametrize(
    ("fmt", "content", "says"),
    [
        ("jsonl", "", "is empty"),
        ("jsonl", "\n \n\r\n", "has no rows (only blank lines)"),
        ("text", "\n\n", "has no rows (only blank lines)"),
        ("csv", "id,text\n\n", "has no rows (a header line and at least one record"),
        ("tsv", "id\ttext\n", "has no rows (a header line and at least one record"),
    ],
)
def test_a_file_without_rows_is_refused(tmp_path: Path, fmt: str, content: str, says: str) -> None:
    with pytest.raises(UsageError, match=r"^inputs file in\.data: ") as caught:
        check_source(write(tmp_path, "in.data", content), fmt, name="in.data")
    assert says in str(caught.value)


def test_a_fifo_and_standard_input_are_accepted_unread(tmp_path: Path) -> None:
    path = tmp_path / "rows.fifo"
    os.mkfifo(path)
    check_source(path, "jsonl")  # would block if it opened the FIFO
    check_source("-", "jsonl")


# count_and_check_keys


def test_rows_are_counted_without_blank_lines_and_up_to_the_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", '{"a": 1}\n\n  \nbroken\n{"a": 2}\n' + "x" * 40 + "\n")
    options = {"key": None, "max_count": 100, "max_row_bytes": 30}
    assert count_and_check_keys(path, "jsonl", limit=None, **options) == 4
    assert count_and_check_keys(path, "jsonl", limit=2, **options) == 2
    assert count_and_check_keys(path, "text", limit=None, **options) == 4
    csv_path = write(tmp_path, "t.csv", 'a,b\n1,"x\ny"\n\n2,3,4\n5,6\n')
    assert count_and_check_keys(csv_path, "csv", limit=None, **options) == 3


def test_more_rows_than_max_count_is_a_usage_error_naming_the_setting(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.txt", "".join(f"{i}\n" for i in range(11)))
    assert count_and_check_keys(path, "text", key=None, limit=None, max_count=11) == 11
    assert count_and_check_keys(path, "text", key=None, limit=10, max_count=10) == 10
    with pytest.raises(UsageError) as caught:
        count_and_check_keys(path, "text", key=None, limit=None, max_count=10, name="rows.txt")
    message = str(caught.value)
    assert message.startswith("inputs file rows.txt: more than 10 rows")
    assert "limits.max_count" in message
    assert "--limit" in message
    with pytest.raises(UsageError, match="limits.max_count"):
        count_and_check_keys(path, "text", key=None, limit=11, max_count=10)


def test_two_rows_with_one_key_are_a_usage_error_naming_both_lines(tmp_path: Path) -> None:
    lines = ['{"id": "a"}', "", '{"id": "b"}', "oops", '{"id": 3}', '{"x": 1}', '{"id": "b"}']
    path = write(tmp_path, "rows.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(UsageError) as caught:
        count_and_check_keys(path, "jsonl", key="id", limit=None, max_count=100, name="r.jsonl")
    message = str(caught.value)
    assert message.startswith("inputs file r.jsonl: lines 3 and 7 have the same key 'b'")
    assert "(field 'id')" in message
    # the first five rows (failed rows count) hold no duplicate
    assert count_and_check_keys(path, "jsonl", key="id", limit=5, max_count=100) == 5


def test_a_number_key_and_its_text_are_one_key(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.jsonl", '{"id": 7}\n{"id": "7"}\n')
    with pytest.raises(UsageError, match="lines 1 and 2 have the same key '7'"):
        count_and_check_keys(path, "jsonl", key="id", limit=None, max_count=100)


def test_duplicate_keys_in_csv_name_the_lines_where_records_start(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", 'id,text\nk1,"a\nb"\nk2,c\nk1,d\n')
    with pytest.raises(UsageError, match="lines 2 and 5 have the same key 'k1'"):
        count_and_check_keys(path, "csv", key="id", limit=None, max_count=100)


def test_a_shared_hash_alone_is_no_duplicate(tmp_path: Path) -> None:
    keys = ["a", "b", "c", "b", "d"]
    path = write(tmp_path, "rows.jsonl", "".join(f'{{"id": "{k}"}}\n' for k in keys))
    fmt, shown = InputFormat.JSONL, str(path)

    def same(_key: str) -> int:
        return 0

    assert _count_keyed(path, fmt, "id", 3, 1 << 20, shown, digest=hash) == 3
    assert _count_keyed(path, fmt, "id", 3, 1 << 20, shown, digest=same) == 3
    with pytest.raises(UsageError, match="lines 2 and 4 have the same key 'b'"):
        _count_keyed(path, fmt, "id", 10, 1 << 20, shown, digest=same)
    distinct = write(tmp_path, "distinct.jsonl", "".join(f'{{"id": {i}}}\n' for i in range(50)))
    assert _count_keyed(distinct, fmt, "id", 100, 1 << 20, shown, digest=same) == 50


def test_counting_needs_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        count_and_check_keys(tmp_path / "gone.jsonl", "jsonl", key=None, limit=None, max_count=9)
    path = tmp_path / "rows.fifo"
    os.mkfifo(path)
    with pytest.raises(UsageError, match="spool it to a file first"):
        count_and_check_keys(path, "jsonl", key=None, limit=None, max_count=9)


LINE_PIECES = st.sampled_from(["", " ", "\t", "\r", "a", "{}", "\xff", "é", "xxxxxxxxxx", '"'])


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(st.lists(LINE_PIECES, max_size=4).map("".join), max_size=25),
    final_newline=st.booleans(),
    bom=st.booleans(),
)
def test_the_fast_count_is_the_number_of_rows_read(
    tmp_path: Path, lines: list[str], final_newline: bool, bom: bool
) -> None:
    content = "\n".join(lines) + ("\n" if final_newline and lines else "")
    raw = (b"\xef\xbb\xbf" if bom else b"") + content.encode("utf-8", "surrogateescape")
    path = write(tmp_path, "prop.txt", raw)
    for fmt in ("jsonl", "text"):
        read = len(list(read_rows(path, fmt, max_row_bytes=12)))
        counted = count_and_check_keys(
            path, fmt, key=None, limit=None, max_count=1000, max_row_bytes=12
        )
        assert counted == read


# spool


def test_a_fifo_is_spooled_to_a_file_with_the_same_bytes(tmp_path: Path) -> None:
    content = b"".join(b'{"i": %d}\n' % i for i in range(20_000))
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    with fifo_fed(tmp_path, content) as path:
        spooled = spool(path, spool_dir)
    assert spooled.parent == spool_dir
    assert spooled.read_bytes() == content
    assert count_and_check_keys(spooled, "jsonl", key="i", limit=None, max_count=20_000) == 20_000


def test_a_failed_spool_is_a_usage_error_and_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot make a copy in"):
        spool(write(tmp_path, "rows.jsonl", "{}\n"), tmp_path / "missing")
    with pytest.raises(UsageError, match="no such file"):
        spool(tmp_path / "gone.jsonl", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_standard_input_is_spooled_and_sniffed(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from clonefleet.inputs import input_format, spool\n"
        "copy = spool('-', sys.argv[1])\n"
        "print(copy, input_format('-', content=copy).value)\n"
    )
    content = b'\n{"a": 1}\n{"a": 2}\n'
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        input=content,
        capture_output=True,
        check=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    copy, fmt = done.stdout.decode().split()
    assert Path(copy).read_bytes() == content
    assert fmt == "jsonl"


KEY_LINES = st.sampled_from(
    [
        "",
        "  ",
        '{"id": "a"}',
        '{"id": "b", "x": [1, 2]}',
        '{"id": ""}',
        '{"id": 7}',
        '{"id": "7"}',
        '{"id": -0}',
        '{"id": 2.50}',
        '{"id": 1e400}',
        '{"id": 123456789012345678901234}',
        '{"id": 18446744073709551616}',
        '{"id": true}',
        '{"id": null}',
        '{"id": "\\ud800"}',
        '{"id": "a", "id": "b"}',
        '{"x": 1}',
        '{"id": NaN}',
        "[1]",
        "not json",
        '{"id": "' + "y" * 40 + '"}',
        '\xff{"id": "z"}',
    ]
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(KEY_LINES, max_size=15))
def test_the_key_pass_reads_the_keys_read_rows_gives(tmp_path: Path, lines: list[str]) -> None:
    path = write(tmp_path, "keys.jsonl", "\n".join(lines).encode("utf-8", "surrogateescape"))
    expected = [
        (row.line, row.key if isinstance(row, Row) else None)
        for row in read_rows(path, "jsonl", key="id", max_row_bytes=40)
    ]
    assert list(row_keys(path, InputFormat.JSONL, key="id", max_row_bytes=40)) == expected
