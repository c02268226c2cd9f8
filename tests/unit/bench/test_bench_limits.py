"""`clonefleet bench` against a rate limit, without Ray or a server: the least makespan a limit
allows, the row's limit fields and columns, the server's limit arguments, the config the bench
gives clonefleet, and the argument checks."""

from __future__ import annotations

import pytest

from clonefleet.bench import BenchParams, steps, table
from clonefleet.bench._measure import Sample
from clonefleet.bench._report import summarise
from clonefleet.bench._run import bench_config, server_limits
from clonefleet.bench._server import limit_args, parse_limits
from clonefleet.bench._stats import batch_tokens, limit_min_makespan_s
from clonefleet.cli.bench import limits_line
from clonefleet.cli.program import main
from clonefleet.errors import UsageError
from clonefleet.providers import SimLimits

pytestmark = pytest.mark.timeout(20)


def test_the_request_limit_allows_2n_requests_at_rpm_over_60_a_second():
    # Two turns a clone, N=60, 1,200 rpm: 120 requests at 20 a second.
    assert limit_min_makespan_s(120, 1200, None, None) == 6.0
    assert limit_min_makespan_s(2000, 1200, None, 1e9) == 100.0  # tokens count only with tpm


def test_the_longer_of_the_request_and_token_limits_binds():
    # 120 requests of 118 tokens: at 70,800 tpm, 1,180 tokens a second, 12 s; rpm allows 6 s.
    assert limit_min_makespan_s(120, 1200, 70_800, 120 * 118) == pytest.approx(12.0)
    # A loose tpm leaves the request limit in force.
    assert limit_min_makespan_s(120, 1200, 10_000_000, 120 * 118) == 6.0
    # tpm alone.
    assert limit_min_makespan_s(10, None, 600, 100) == 10.0


def test_no_limit_or_unknown_tokens_give_no_minimum():
    assert limit_min_makespan_s(120, None, None, None) is None
    assert limit_min_makespan_s(120, None, 600, None) is None
    assert limit_min_makespan_s(120, 600, 600, None) == 12.0  # rpm still counts


def test_batch_tokens_charge_the_unanswered_requests_at_the_answered_ones_cost():
    assert batch_tokens(120, 1200, 120) == 1200
    assert batch_tokens(120, 600, 60) == 1200  # half the clones failed before their share
    assert batch_tokens(120, None, 60) is None
    assert batch_tokens(120, 0, 0) is None


def _sample(makespan_s: float, n: int, *, refused: int, tokens: int, answered: int) -> Sample:
    return Sample(
        makespan_s=makespan_s,
        completed=n,
        cpu_s=0.1,
        added_rss_b=0,
        added_pss_b=0,
        requests=answered + refused,
        rate_limited=refused,
        answered=answered,
        tokens=tokens,
    )


def test_a_row_against_a_limit_counts_requests_429s_and_its_ratio_to_the_minimum():
    params = BenchParams(counts=(60,), turns=2, rpm=1200, tpm=70_800)
    runs = [
        _sample(13.2, 60, refused=2, tokens=120 * 118, answered=120),
        _sample(12.6, 60, refused=0, tokens=120 * 118, answered=120),
    ]
    row = summarise("clonefleet", 60, runs, params, None)
    assert (row["requests_sent"], row["rate_limited"]) == (242, 2)
    assert row["rate_limited_share"] == round(2 / 242, 4)
    assert row["tokens_per_batch"] == 120 * 118
    assert row["limit_min_makespan_s"] == 12.0
    assert row["ratio_to_limit_min"] == round(12.9 / 12.0, 3)
    assert (row["completed"], row["clones"]) == (120, 120)


def test_a_row_without_a_limit_has_no_limit_fields_and_the_table_no_limit_columns():
    params = BenchParams(counts=(10,))
    runs = [_sample(1.0, 10, refused=0, tokens=0, answered=20)]
    row = summarise("clonefleet", 10, runs, params, None)
    assert "limit_min_makespan_s" not in row
    assert "429s" not in table([row]).splitlines()[0].split()


def test_the_table_adds_the_limit_columns_for_rows_against_a_limit():
    params = BenchParams(counts=(60,), rpm=1200)
    runs = [_sample(6.6, 60, refused=3, tokens=0, answered=120)]
    lines = table([summarise("clonefleet", 60, runs, params, None)]).splitlines()
    assert " ".join(lines[0].split()).endswith("sent 429s 429 % limit min s x limit min")
    cells = lines[2].split()
    assert cells[-5:] == ["123", "3", "2.4", "6.000", "1.10"]


def test_server_limits_travel_to_the_server_process_and_back():
    for limits in (
        SimLimits(rpm=1200),
        SimLimits(rpm=1200, tpm=70_800, burst=5, headers=False),
        SimLimits(tpm=600),
    ):
        assert parse_limits(limit_args(limits)) == limits
    assert limit_args(None) == [] and parse_limits([]) is None


def test_the_bench_sets_the_servers_limits_and_clonefleets_own():
    params = BenchParams(rpm=1200, burst=4, limit_headers=False, client_rpm=1100, client_tpm=9000)
    assert server_limits(params) == SimLimits(rpm=1200, burst=4, headers=False)
    assert server_limits(BenchParams()) is None
    provider = bench_config(params, "http://127.0.0.1:9/v1").providers["srv"]
    assert (provider.rpm, provider.tpm) == (1100, 9000)
    assert bench_config(BenchParams(), "http://127.0.0.1:9/v1").providers["srv"].rpm is None


def test_against_a_limit_the_baselines_are_not_run():
    limited = BenchParams(counts=(10, 100), repeat=3, rpm=1200)
    assert limited.limited and limited.measured_baselines == ()
    assert steps(limited) == 6
    assert BenchParams().measured_baselines == ("floor", "actor-per-clone")
    line = limits_line({"rpm": 1200, "tpm": None, "limit_headers": False, "client_rpm": 1100})
    assert "server rpm 1200, limit headers off" in line
    assert "clonefleet's config rpm 1100" in line and "baselines not run" in line
    assert limits_line({"rpm": None, "tpm": None}) == ""


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (BenchParams(burst=5), "--burst needs --rpm"),
        (BenchParams(tpm=600, burst=5), "--burst needs --rpm"),
        (BenchParams(limit_headers=False), "--no-limit-headers needs --rpm or --tpm"),
        (BenchParams(rpm=60, base_url="http://127.0.0.1:9/v1"), "with --base-url"),
        (BenchParams(rpm=0), "--rpm takes a whole number"),
        (BenchParams(client_tpm=0), "--client-tpm takes a whole number"),
    ],
)
def test_limits_that_do_not_fit_are_usage_errors(params, message):
    with pytest.raises(UsageError, match=message):
        params.check()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "--burst", "5"], "--burst needs --rpm"),
        (["bench", "--no-limit-headers"], "--no-limit-headers needs --rpm or --tpm"),
        (["bench", "--rpm", "60", "--base-url", "http://127.0.0.1:9/v1"], "--base-url"),
    ],
)
def test_bench_limit_arguments_that_do_not_fit_exit_2_saying_why(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--rpm", "--tpm", "--burst", "--client-rpm", "--client-tpm"])
def test_limit_arguments_take_whole_numbers_of_1_or_more(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", flag, "0"])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err
