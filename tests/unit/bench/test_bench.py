"""The arithmetic, report and command line of `clonefleet bench`, without Ray or a server."""

from __future__ import annotations

import importlib.util
import io
import sys

import pytest

from clonefleet.bench import (
    BenchParams,
    ProgressDisplay,
    check_plotting,
    percentile,
    plot,
    ratio,
    spread,
    table,
    turn_script,
)
from clonefleet.bench._measure import Sample
from clonefleet.bench._report import summarise
from clonefleet.cli.program import main
from clonefleet.errors import UsageError
from clonefleet.providers import SimScript

pytestmark = pytest.mark.timeout(20)


def test_percentile_is_nearest_rank_and_none_for_nothing():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 0.0) == 1.0
    assert percentile([], 0.5) is None


def test_spread_is_median_low_and_high():
    assert spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert spread([1.0, 4.0]) == (2.5, 1.0, 4.0)
    assert spread([]) is None


def test_ratio_needs_a_positive_reference():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


def _sample(makespan_s: float, n: int, *, failed: int = 0) -> Sample:
    return Sample(
        makespan_s=makespan_s,
        completed=n - failed,
        cpu_s=0.5,
        added_rss_b=2_000_000,
        added_pss_b=1_000_000,
        first_request_ms=[float(i) for i in range(n)],
        requests=2 * n,
        errors=["failed/error"] * failed,
    )


def test_summarise_takes_the_median_of_repeats_and_the_ratio_to_the_floor():
    params = BenchParams(counts=(10,), turns=2, latency_ms=200.0)
    floor = [_sample(0.4, 10), _sample(0.5, 10), _sample(0.6, 10)]
    runs = [_sample(1.0, 10), _sample(0.8, 10), _sample(1.2, 10, failed=1)]
    row = summarise("clonefleet", 10, runs, params, floor)
    assert (row["makespan_s"], row["makespan_min_s"], row["makespan_max_s"]) == (1.0, 0.8, 1.2)
    assert row["ratio_to_floor"] == 2.0
    assert row["clones_per_s"] == 10.0
    assert row["min_makespan_s"] == 0.4
    assert row["cpu_s_per_clone"] == 0.05
    assert row["added_rss_mb"] == 2.0
    assert row["requests_per_s"] == 20.0
    assert (row["completed"], row["clones"], row["errors"]) == (29, 30, ["failed/error"])
    assert row["first_request_p50_ms"] == 4.0
    assert summarise("clonefleet", 10, runs, params, None)["ratio_to_floor"] is None


def test_table_shows_a_row_per_system_and_the_reason_a_baseline_was_skipped():
    params = BenchParams(counts=(10,))
    rows = [
        summarise("clonefleet", 10, [_sample(1.0, 10)], params, [_sample(0.5, 10)]),
        summarise("floor", 10, [_sample(0.5, 10)], params, [_sample(0.5, 10)]),
        {"n": 10, "system": "actor-per-clone", "skipped": "N > 5 (--actor-max)"},
    ]
    lines = table(rows).splitlines()
    assert lines[0].split()[:3] == ["N", "system", "makespan"]
    assert lines[2].split()[:3] == ["10", "clonefleet", "1.000"]
    assert lines[2].split()[-1] == "10/10"
    assert lines[3].split()[5] == "1.00"  # the floor's ratio to itself
    assert lines[4].split()[:3] == ["10", "actor-per-clone", "skipped:"]
    assert lines[4].endswith("N > 5 (--actor-max)")


@pytest.mark.parametrize("turns", [1, 2, 5])
def test_turn_script_makes_every_clone_request_the_model_turns_times(turns):
    script = SimScript.from_data(turn_script(turns))
    steps = script.steps_for(7)
    assert steps is not None and len(steps) == turns
    assert steps[-1].tool == "exit_tool"
    assert all(s.tool == "progress_update" for s in steps[:-1])


@pytest.mark.parametrize(
    "params",
    [
        BenchParams(counts=()),
        BenchParams(counts=(0,)),
        BenchParams(turns=0),
        BenchParams(repeat=0),
        BenchParams(latency_ms=-1),
        BenchParams(baselines=("slow",)),
    ],
)
def test_bad_parameters_are_usage_errors(params):
    with pytest.raises(UsageError):
        params.check()


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--count", "0"],
        ["bench", "--count", "ten"],
        ["bench", "--baselines", "floor,threads"],
        ["bench", "--turns", "0"],
    ],
)
def test_bad_bench_arguments_exit_2_before_anything_starts(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "bench" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError, match=r"pip install 'clonefleet\[plot\]'"):
        check_plotting()
    # The command says so before starting anything, with exit status 2.
    assert main(["bench", "--count", "1", "--plot", str(tmp_path / "p.png")]) == 2
    assert "clonefleet[plot]" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="the plot extra")
def test_plot_draws_a_png_with_a_line_per_measured_system(tmp_path):
    params = BenchParams(counts=(10, 100))
    floor = {n: [_sample(0.4 + n / 1000, n)] for n in (10, 100)}
    results = [
        summarise(system, n, [_sample(scale * (0.4 + n / 1000), n)], params, floor[n])
        for n in (10, 100)
        for system, scale in (("clonefleet", 1.2), ("floor", 1.0), ("actor-per-clone", 9.0))
    ]
    report = {
        "params": {"turns": 2, "latency_ms": 200.0},
        "machine": {"cpus": 2},
        "results": [*results, {"n": 1000, "system": "actor-per-clone", "skipped": "too big"}],
    }
    out = plot(report, tmp_path / "sub" / "bench.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_plain_lines_off_a_terminal_and_a_bar_on_one():
    plain = io.StringIO()
    with ProgressDisplay(2, plain) as show:
        show("N=10 clonefleet 1/1", 0)
        show("N=10 clonefleet 1/1: 0.5 s", 1)
    assert plain.getvalue().splitlines() == [
        "bench: N=10 clonefleet 1/1",
        "bench: N=10 clonefleet 1/1: 0.5 s",
    ]
    term = _Terminal()
    with ProgressDisplay(2, term) as show:
        show("N=10 actor-per-clone: skipped (too big)", 2)
    assert "bench: N=10 actor-per-clone: skipped (too big)" in term.getvalue()
    assert "2/2" in term.getvalue()


def test_a_server_of_ones_own_has_no_known_minimal_makespan():
    params = BenchParams(counts=(10,), base_url="http://127.0.0.1:9/v1")
    assert summarise("clonefleet", 10, [_sample(1.0, 10)], params, None)["min_makespan_s"] is None
