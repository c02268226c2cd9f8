"""The bench's prompt-cache figures: the cached share of input tokens in its rows and table, read
from the batch's job usage only when there is a cache read to count, and ``--system-tokens``,
which puts a batch-wide text ahead of the benched definition's body."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clonefleet.bench import BenchParams, table
from clonefleet.bench._measure import Sample, job_usage
from clonefleet.bench._report import summarise
from clonefleet.bench._run import bench_config, padded_definition
from clonefleet.cli.bench import params_of
from clonefleet.cli.program import build_parser, main
from clonefleet.errors import UsageError
from clonefleet.planning import plan_batch

pytestmark = pytest.mark.timeout(30)


def _sample(tin: int | None, read: int | None) -> Sample:
    return Sample(
        makespan_s=1.0,
        completed=10,
        cpu_s=0.1,
        added_rss_b=0,
        added_pss_b=0,
        requests=20,
        input_tokens=tin,
        cache_read_tokens=read,
    )


def test_a_row_has_the_cached_share_of_input_over_the_repeats():
    params = BenchParams(counts=(10,))
    row = summarise("clonefleet", 10, [_sample(1000, 900), _sample(1000, 950)], params, None)
    assert (row["input_tokens"], row["cache_read_tokens"]) == (2000, 1850)
    assert row["cached_share"] == 0.925
    unknown = summarise("floor", 10, [_sample(1000, 900), _sample(None, None)], params, None)
    assert unknown["cached_share"] is None and unknown["input_tokens"] is None
    none_read = summarise("floor", 10, [_sample(1000, 0)], params, None)
    assert none_read["cached_share"] == 0.0


def test_the_table_has_a_cached_column_before_ok():
    params = BenchParams(counts=(10,))
    rows = [
        summarise("clonefleet", 10, [_sample(1000, 925)], params, None),
        summarise("floor", 10, [_sample(None, None)], params, None),
    ]
    lines = table(rows).splitlines()
    head = lines[0].split()
    assert head[-3:] == ["cached", "%", "ok"]
    assert lines[2].split()[-2:] == ["92.5", "10/10"]
    assert lines[3].split()[-2:] == ["-", "10/10"]


class ListingFleet:
    """A fleet whose listing answers fixed batch totals, counting the calls."""

    def __init__(self, totals: dict[str, Any]) -> None:
        self.totals, self.calls = totals, 0

    def list_jobs(self, **filters: Any) -> dict[str, Any]:
        self.calls += 1
        assert filters == {"batch": "b_1", "limit": 1}
        return {"jobs": [], "totals": {"fleet": {}, "batches": {"b_1": self.totals}}}


def test_job_usage_is_asked_only_when_there_is_a_cache_read_to_count():
    fleet = ListingFleet({"input_tokens": 5000, "cache_read_tokens": 4500})
    no_read = _sample(4000, 0)
    assert job_usage(fleet, "b_1", no_read) is no_read
    assert fleet.calls == 0
    read = job_usage(fleet, "b_1", _sample(4000, 3000))
    assert (read.input_tokens, read.cache_read_tokens) == (5000, 4500)
    unknown = job_usage(fleet, "b_1", _sample(None, None))  # a server of one's own
    assert (unknown.input_tokens, unknown.cache_read_tokens) == (5000, 4500)
    assert fleet.calls == 2


def test_job_usage_keeps_the_servers_counts_when_the_totals_have_no_cache_reads():
    fleet = ListingFleet({"input_tokens": 5000})
    sample = _sample(4000, 3000)
    assert job_usage(fleet, "b_1", sample) == sample


def test_padded_definition_is_the_same_text_every_time_with_about_n_words():
    one, two = padded_definition(2000), padded_definition(2000)
    assert one == two
    padding = one["body"].split("You are clone")[0]
    assert len(padding.split()) == 2000
    assert "{" not in padding and "\n\n" in padding
    assert "exit_tool" in one["body"] and "{{ prompt }}" in one["body"]
    assert len(padded_definition(10)["body"].split("You are clone")[0].split()) == 10


def test_system_tokens_make_a_shared_prefix_of_every_clones_instructions(tmp_path: Path):
    params = BenchParams(system_tokens=1500)
    config = bench_config(params, "http://127.0.0.1:9/v1")
    plan = plan_batch(
        "general-purpose",
        "Summarise file_{{ clone.index }}.py",
        3,
        config=config,
        caller_cwd=tmp_path,
    )
    specs = plan.submission.specs
    shared = {s.instructions for s in specs}
    assert len(shared) == 1  # the same text for every clone
    assert len(shared.pop().split()) >= 1500
    assert len({s.task for s in specs}) == 3
    plain = bench_config(BenchParams(), "http://127.0.0.1:9/v1")
    assert plain.subagents == {}


def test_system_tokens_flag_and_its_bounds(capsys):
    parser = build_parser()
    args = parser.parse_args(["bench", "--system-tokens", "2000"])
    assert params_of(args).system_tokens == 2000
    assert params_of(parser.parse_args(["bench"])).system_tokens == 0
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--system-tokens", "-1"])
    assert exited.value.code == 2
    assert "--system-tokens" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--system-tokens"):
        BenchParams(system_tokens=10**9).check()
