"""The fleet's rate limits as users see them, over Ray: after a batch against `clonefleet
provider serve --rpm 600`, `Fleet.rate_limits()` has the model's scope with the limit learned
from the headers, and `jobs list` shows it in its table and its JSON (docs/json.md, "Rate
limits")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clonefleet.cli.jobs import rate_limits_table, stream_listing
from clonefleet.cli.progress import rate_limit_line
from tests.ray.test_scripted_runs import provider_serve

pytestmark = [pytest.mark.timeout(300)]

TWO_TURNS = """
default:
  - {tool: progress_update, args: {summary: turn 1}}
  - {tool: exit_tool, args: {success: true, summary: done}}
"""


def _config(tmp_path: Path, port: int) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""version: 1
providers:
  local: {{kind: openai, base_url: "http://127.0.0.1:{port}/v1"}}
models:
  m: {{provider: local, name: sim-small}}
model_groups:
  default: [m]
admission:
  initial_in_flight: 8  # under the server's burst of 10
"""
    )
    return cfg


def _ours(rows: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    """The rows of this test's server (the session's limiter outlives other tests' servers)."""
    return [r for r in rows if f":{port}/" in str(r["scope"])]


def test_the_limit_learned_from_the_headers_is_shown_per_model(ray_cluster, tmp_path, capsys):
    from clonefleet import Fleet

    (tmp_path / "two.yaml").write_text(TWO_TURNS)
    with provider_serve("--rpm", "600", "--script", "two.yaml", cwd=tmp_path) as port:
        fleet = Fleet(config=_config(tmp_path, port), cwd=tmp_path)
        batch = fleet.spawn("general-purpose", "go", 20)
        assert fleet.remaining([batch.batch_id], wait_seconds=120) == 0
        rows = _ours(fleet.rate_limits(), port)
        assert stream_listing(fleet, {"batch": batch.batch_id}, None, None) == 0
        listing = json.loads(capsys.readouterr().out)
    assert [fleet.job_result(j)["status"] for j in batch.job_ids] == ["completed"] * 20
    (scope,) = [r for r in rows if r["model"] == "sim-small"]
    assert scope["provider"] == "local" and scope["source"] == "headers"
    assert scope["rpm_limit"] == pytest.approx(570.0)  # 95% of the 600 the server announced
    assert scope["rpm_now"] >= 40  # 20 clones, 2 requests each, within the minute
    assert len(listing["jobs"]) == 20 and {"capacity", "totals"} <= set(listing)
    (listed,) = [r for r in _ours(listing["rate_limits"], port) if r["model"] == "sim-small"]
    assert listed["source"] == "headers" and listed["rpm_limit"] == pytest.approx(570.0)
    line = rate_limit_line(scope)
    assert line.startswith("local/sim-small  ") and " of 570 rpm" in line and "(headers)" in line
    assert rate_limits_table(rows).row_count == len(rows)
