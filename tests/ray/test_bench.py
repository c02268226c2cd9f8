"""`clonefleet bench --count 10` end to end: its own embedded Ray, the simulated provider served
on 127.0.0.1 and the asyncio floor (the actor-per-clone baseline is left out to keep it short)."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = pytest.mark.timeout(240)

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def test_bench_count_10_prints_the_table_and_writes_json(cli_run, tmp_path):
    out_json = tmp_path / "bench.json"
    plot = ["--plot", str(tmp_path / "bench.png")] if HAS_MATPLOTLIB else []
    args = ["--count", "10", "--repeat", "1", "--turns", "3", "--latency-ms", "50"]
    out = cli_run(
        "bench", *args, "--baselines", "floor", "--json", str(out_json), *plot,
        cwd=tmp_path,
        timeout=200,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.split()[:2] == ["N", "system"] for line in lines), out.stdout
    rows = {tuple(line.split()[:2]) for line in lines}
    assert {("10", "clonefleet"), ("10", "floor")} <= rows, out.stdout
    assert "bench: N=10 clonefleet 1/1" in out.stderr  # progress, as plain lines off a terminal

    report = json.loads(out_json.read_text())
    assert {"params", "versions", "machine", "startup", "results"} <= set(report)
    assert report["params"]["counts"] == [10] and report["params"]["turns"] == 3
    assert {"clonefleet", "ray", "python", "aiohttp"} <= set(report["versions"])
    assert {"cpus", "memory_mb", "platform", "load_average"} <= set(report["machine"])
    assert report["startup"]["ray_start_s"] > 0
    by_system = {r["system"]: r for r in report["results"]}
    assert set(by_system) == {"clonefleet", "floor"}
    for row in by_system.values():
        assert row["completed"] == row["clones"] == 10, row
        assert row["errors"] == []
        assert row["min_makespan_s"] == pytest.approx(0.15)
        assert row["makespan_s"] >= 0.15
    assert by_system["floor"]["ratio_to_floor"] == 1.0
    assert by_system["clonefleet"]["ratio_to_floor"] > 0
    # Three model requests per clone: the scripted turns reached the server.
    assert by_system["clonefleet"]["requests_per_s"] * by_system["clonefleet"]["makespan_s"] == (
        pytest.approx(30, rel=0.02)
    )
    assert by_system["clonefleet"]["first_request_p50_ms"] is not None
    if HAS_MATPLOTLIB:
        assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_against_a_rate_limit_counts_requests_and_the_least_makespan(cli_run, tmp_path):
    # 6,000 rpm holds 100 requests at once: the 20 of ten 2-turn clones are never refused.
    out_json = tmp_path / "bench.json"
    args = ["--count", "10", "--repeat", "1", "--latency-ms", "20", "--rpm", "6000"]
    out = cli_run(
        "bench", *args, "--tpm", "6000000", "--json", str(out_json), cwd=tmp_path, timeout=200
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "baselines not run" in out.stdout
    report = json.loads(out_json.read_text())
    assert (report["params"]["rpm"], report["params"]["tpm"]) == (6000, 6000000)
    (row,) = report["results"]  # clonefleet only
    assert row["system"] == "clonefleet" and row["completed"] == row["clones"] == 10
    assert (row["requests_sent"], row["rate_limited"], row["rate_limited_share"]) == (20, 0, 0.0)
    assert row["tokens_per_batch"] > 20  # each request costs its words plus max_tokens
    assert row["limit_min_makespan_s"] == pytest.approx(0.2)  # 20 requests at 100 a second
    assert row["ratio_to_limit_min"] == pytest.approx(row["makespan_s"] / 0.2, rel=0.01)
