"""CsvResults and CSV results files: columns from the exit schema, values, resuming a CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.config import Config
from clonefleet.errors import UsageError
from clonefleet.results import CsvResults, KeyState, ResultsIndex, ResultsWriter

pytestmark = pytest.mark.timeout(60)

SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string"},
        "score": {"type": "number"},
        "status": {"type": "string"},  # a payload field named like a fixed column
        "notes": {"type": "array"},
    },
}


def record(key: str | None, result: object, **more: object) -> dict:
    return {
        "key": key,
        "status": "completed",
        "outcome": "success",
        "result": result,
        "error": None,
        "model": "sim-small",
        "usage": {"input_tokens": 1000, "output_tokens": 100},
        **more,
    }


def rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_bytes().decode("utf-8"), newline="")))


def test_columns_follow_the_schema_in_order() -> None:
    out = CsvResults(SCHEMA)
    assert out.columns == (
        "key",
        "status",
        "outcome",
        "verdict",
        "score",
        "result.status",
        "notes",
        "cost_usd",
        "error",
        "result_json",
    )
    assert CsvResults(None).columns == (
        "key",
        "status",
        "outcome",
        "cost_usd",
        "error",
        "result_json",
    )
    assert CsvResults(SCHEMA, include_input=True).columns[-1] == "input"


def test_values_strings_as_is_scalars_and_objects_as_json() -> None:
    out = CsvResults(SCHEMA, include_input=True)
    cells = out.row(
        record(
            "k",
            {
                "verdict": "ok",
                "score": 0.5,
                "status": "done",
                "notes": ["a", {"b": 1}],
                "extra": True,
            },
            cost_usd=0.25,
        ),
        {"path": "a.py"},
    )
    assert cells == [
        "k",
        "completed",
        "success",
        "ok",
        "0.5",
        "done",
        '["a",{"b":1}]',
        "0.25",
        "",
        '{"extra":true}',
        '{"path":"a.py"}',
    ]


def test_a_non_object_result_goes_whole_into_result_json() -> None:
    out = CsvResults(SCHEMA)
    text = out.row(record("k", "just the final text"))
    assert text[3:7] == ["", "", "", ""] and text[-1] == "just the final text"
    assert out.row(record("k", [1, 2]))[-1] == "[1,2]"
    assert out.row(record("k", None, status="failed", error="Error: x"))[-3:] == [
        "",
        "Error: x",
        "",
    ]


def test_cost_from_the_record_or_priced_by_the_config() -> None:
    priced = Config(
        models={
            "sim-small": {
                "provider": "sim",
                "name": "sim-small",
                "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
            }
        }
    )
    assert CsvResults(None).row(record("k", {}))[3] == ""  # no config: no price
    assert float(CsvResults(None, config=priced).row(record("k", {}))[3]) == pytest.approx(
        1000 * 3.0 / 1e6 + 100 * 15.0 / 1e6
    )
    assert CsvResults(None, config=priced).row(record("k", {}, model="other"))[3] == ""
    assert CsvResults(None, config=priced).row(record("k", {}, cost_usd=0.5))[3] == "0.5"


def test_a_csv_file_is_written_with_its_header_once_and_resumed(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    with ResultsWriter(path, exit_schema=SCHEMA) as out:
        out.write(record("a", {"verdict": "ok", "score": 1}))
        out.write(record("b", None, status="failed", outcome="failure", error="Error: e"))
    with ResultsWriter(path, exit_schema=SCHEMA) as again:
        assert not again.write(record("a", {"verdict": "again"}))
        again.write(record("c", {"verdict": 'multi\nline "quoted", comma', "score": 2}))
    text = path.read_text()
    assert text.count("key,status,outcome") == 1
    got = rows(path)
    assert [r["key"] for r in got] == ["a", "b", "c"]
    assert got[2]["verdict"] == 'multi\nline "quoted", comma'
    index = ResultsIndex.read(path)
    assert index.header == CsvResults(SCHEMA).columns
    assert index.state("a") is KeyState.SUCCEEDED and index.state("b") is KeyState.FAILED
    assert index.skip("b") and not index.skip("b", retry_failed=True)
    assert index.state("c") is KeyState.SUCCEEDED and index.bad_count == 0


def test_a_header_that_differs_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    ResultsWriter(path, exit_schema=SCHEMA).close()
    with pytest.raises(UsageError) as err:
        ResultsWriter(path, exit_schema=None)
    assert str(path) in str(err.value) and "line 1" in str(err.value)
    assert "the file has verdict, score, result.status, notes that this run has not" in str(
        err.value
    )
    with pytest.raises(UsageError, match="this run adds input"):
        ResultsWriter(path, exit_schema=SCHEMA, include_input=True).close()


def test_a_csv_without_the_key_columns_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text("name,score\nx,1\n")
    with pytest.raises(UsageError, match=r"line 1: the header has no key, status, outcome"):
        ResultsIndex.read(path)


def test_csv_torn_tail_inside_a_quoted_field_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    with ResultsWriter(path, exit_schema=SCHEMA) as out:
        out.write(record("a", {"verdict": "fine"}))
    size = path.stat().st_size
    with path.open("a") as f:
        f.write('b,completed,success,"half a\nquoted')
    index = ResultsIndex.read(path)
    assert index.keys() == ["a"] and index.torn_offset == size and index.bad_count == 0
    with ResultsWriter(path, exit_schema=SCHEMA) as out:
        out.write(record("b", {"verdict": "whole"}))
    assert [r["verdict"] for r in rows(path)] == ["fine", "whole"]


def test_csv_bad_middle_rows_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text(
        "key,status,outcome,x\na,completed,success,1\nonly,two\n"
        "b,failed,failure,2\n" + "c,completed,success,3\n"
    )
    index = ResultsIndex.read(path)
    assert index.keys() == ["a", "b", "c"] and index.bad_count == 1
    assert index.bad_lines[0].line == 3 and "2 fields" in index.bad_lines[0].reason


def test_a_torn_header_is_written_afresh(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text("key,stat")
    with ResultsWriter(path, exit_schema=None) as out:
        out.write(record("a", {"x": 1}))
    assert path.read_text().splitlines()[0] == "key,status,outcome,cost_usd,error,result_json"
    assert ResultsIndex.read(path).keys() == ["a"]


FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@FUZZ
@given(keys=st.lists(TEXT.filter(bool), unique=True, max_size=8), values=st.lists(TEXT))
def test_property_any_text_round_trips_through_a_csv_file(
    tmp_path: Path, keys: list[str], values: list[str]
) -> None:
    path = tmp_path / "p.csv"
    path.unlink(missing_ok=True)
    with ResultsWriter(path, exit_schema=SCHEMA) as out:
        for i, key in enumerate(keys):
            out.write(record(key, {"verdict": values[i] if i < len(values) else "v"}))
    index = ResultsIndex.read(path)
    assert index.keys() == keys and index.bad_count == 0 and index.torn_offset is None
    assert [r["key"] for r in rows(path)] == keys
