"""`clonefleet run --budget-tokens` end to end (its own embedded Ray, the simulated provider):
once the batch's usage passes the budget, running clones are cancelled and queued ones never
start; both end `cancelled` with stop reason `budget`."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(180)

SCRIPT = """\
clones:
  0:
    - {tool: progress_update, args: {summary: quick}}
    - {tool: exit_tool, args: {success: true, summary: done early}}
default:
  - {tool: progress_update, args: {summary: one}}
  - {tool: progress_update, args: {summary: two}}
  - {hang: true}
"""


def test_a_small_token_budget_stops_the_batch_and_run_exits_1(cli_run, tmp_path):
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    out = cli_run(
        "run",
        "general-purpose",
        "--prompt",
        "look around",
        "--count",
        "6",
        "--max-concurrency",
        "2",
        "--budget-tokens",
        "400",
        "--sim-script",
        str(script),
        "--json",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr
    records = {r["clone_index"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert sorted(records) == list(range(6))
    stopped = [r for r in records.values() if r["stop_reason"] == "budget"]
    assert stopped, records
    for r in stopped:
        assert (r["status"], r["outcome"], r["result"]) == ("cancelled", "cancelled", None)
        assert r["error"] == "Error: subagent run was cancelled: its batch passed its budget"
    # Every clone but the quick one hangs: only the budget ends them, and the queued ones end
    # without a single model turn.
    assert all(r["stop_reason"] in ("budget", "completed") for r in records.values())
    assert {i for i, r in records.items() if r["stop_reason"] == "completed"} <= {0}
    assert any(r["turns"] == 0 for r in stopped)
    spent = sum(r["usage"]["total_tokens"] for r in records.values())
    assert spent > 400


def test_a_dollar_budget_without_prices_is_refused_before_anything_starts(cli_run, tmp_path):
    out = cli_run(
        "run", "general-purpose", "--prompt", "x", "--budget-usd", "0.5", cwd=tmp_path, timeout=60
    )
    assert out.returncode == 2
    assert "--budget-usd needs a price for every model" in out.stderr
    assert "sim-small" in out.stderr


def test_the_fleet_pages_listings_and_events_over_ray_with_usage_totals(fleet, monkeypatch):
    from clonefleet import fleet as _fleet

    batch = fleet.spawn("general-purpose", "page {{ clone.index }}", count=25, budget_tokens=10**9)
    assert fleet.job_block([batch.batch_id], timeout_seconds=90)["done"]
    pages, cursor = [], None
    while True:
        page = fleet.list_jobs(batch=batch.batch_id, cursor=cursor, limit=10)
        pages.append([j["job_id"] for j in page["jobs"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [j for p in pages for j in p] == list(batch.job_ids)
    monkeypatch.setattr(_fleet, "LIST_PAGE", 7)  # the whole listing in 4 replies
    whole = fleet.list_jobs(batch=batch.batch_id)
    assert [j["job_id"] for j in whole["jobs"]] == list(batch.job_ids)
    assert whole["next_cursor"] is None
    totals = fleet.totals(batch.batch_id)
    view = totals["batches"][batch.batch_id]
    assert view["total_tokens"] == sum(j["usage"]["total_tokens"] for j in whole["jobs"]) > 0
    assert view["budget"]["passed"] is False and view["jobs"] == 25
    assert totals["fleet"]["total_tokens"] >= view["total_tokens"]
    first = fleet.events(batch.batch_id, limit=4)
    assert len(first["events"]) == 4
    rest = list(fleet.history(batch.batch_id, cursor=first["cursor"], page=6))
    assert len(first["events"]) + len(rest) == len(list(fleet.history(batch.batch_id)))
