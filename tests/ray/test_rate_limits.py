"""Fleet-wide admission over Ray against `clonefleet provider serve` enforcing a rate limit:
batches on several clone hosts share one limit learned from the headers, or a configured one,
every job succeeds, and a refused request waits rather than fails (docs/rate-limits.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from tests.ray.test_scripted_runs import provider_serve

pytestmark = [pytest.mark.timeout(300)]

TWO_TURNS = """
default:
  - {tool: progress_update, args: {summary: turn 1}}
  - {tool: exit_tool, args: {success: true, summary: done}}
"""


def _config(tmp_path: Path, port: int, provider_extra: str = "") -> Path:
    cfg = tmp_path / f"cfg-{port}.yaml"
    cfg.write_text(
        f"""version: 1
providers:
  local: {{kind: openai, base_url: "http://127.0.0.1:{port}/v1"{provider_extra}}}
models:
  m: {{provider: local, name: sim-small}}
model_groups:
  default: [m]
limits:
  clones_per_actor: 8
admission:
  initial_in_flight: 8  # under the server's burst of 10
"""
    )
    return cfg


def _stats(port: int) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/sim/stats", timeout=5).json()
    return stats


def _scope(port: int, model: str | None = "sim-small") -> dict[str, Any]:
    handle = ray.get_actor("admission", namespace="clonefleet")
    rows = ray.get(handle.snapshot.remote(), timeout=30)
    (row,) = [r for r in rows if f":{port}/" in r["scope"] and r["model"] == model]
    return row


def _run_batches(cfg: Path, cwd: Path, batches: int, count: int) -> tuple[list[dict], float]:
    from clonefleet import Fleet

    fleet = Fleet(config=cfg, cwd=cwd)
    began = time.monotonic()
    ids = [
        j for b in range(batches) for j in fleet.spawn("general-purpose", f"b{b}", count).job_ids
    ]
    assert fleet.remaining(ids, wait_seconds=200) == 0
    took = time.monotonic() - began
    return [dict(fleet.job_result(j)) for j in ids], took


def test_two_batches_on_several_hosts_share_one_limit_learned_from_the_headers(
    ray_cluster, tmp_path
):
    (tmp_path / "two.yaml").write_text(TWO_TURNS)
    with provider_serve("--rpm", "600", "--script", "two.yaml", cwd=tmp_path) as port:
        records, took = _run_batches(_config(tmp_path, port), tmp_path, batches=2, count=16)
        stats, scope = _stats(port), _scope(port)
    assert [r["status"] for r in records] == ["completed"] * 32
    assert {r["model"] for r in records} == {"m"}
    answered = stats["requests"] - stats["rate_limited"]
    assert answered == 64
    # 600 a minute is 10 a second with a burst of 10: 64 requests need at least 5.4 s. The
    # limiter followed 95% of it, so the provider refused hardly any.
    assert took >= 5.0
    assert stats["rate_limited"] <= 3, stats
    assert scope["source"] == "headers" and scope["rpm_limit"] == pytest.approx(570.0)
    assert scope["rate_limited"] == stats["rate_limited"]


def test_a_configured_limit_holds_against_a_server_that_announces_none(ray_cluster, tmp_path):
    (tmp_path / "two.yaml").write_text(TWO_TURNS)
    with provider_serve("--script", "two.yaml", cwd=tmp_path) as port:
        cfg = _config(tmp_path, port, ", rpm: 300")
        records, took = _run_batches(cfg, tmp_path, batches=1, count=12)
        stats, scope = _stats(port), _scope(port, model=None)
    assert [r["status"] for r in records] == ["completed"] * 12
    assert stats["requests"] == 24 and stats["rate_limited"] == 0
    # 300 a minute, never exceeded in any minute: a burst of 2.5 and then under 5 a second.
    first, last = stats["first_at"], stats["last_ok_at"]
    assert last - first >= (24 - 3) / 5.0 - 0.5
    assert took < 30
    assert scope["source"] == "config" and scope["rpm_limit"] == 300.0
