"""The dashboard server against a fake data source: the page, the JSON API, the live stream,
deadlines and bounds (no Ray; the browser tests are in tests/ray/test_dashboard_browser.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from clonefleet.cli.program import main
from clonefleet.dashboard import (
    Dashboard,
    DashboardOptions,
    DashboardThread,
    Snapshot,
    is_loopback,
    serving,
)
from clonefleet.dashboard._data import read_snapshot
from clonefleet.dashboard._live import BlockingCalls, Live
from clonefleet.errors import SchedulerUnavailable, UnknownJobError, UsageError

pytestmark = pytest.mark.timeout(20)

STATIC = Path(__file__).resolve().parents[3] / "src" / "clonefleet" / "dashboard" / "static"
FAST = DashboardOptions(refresh_s=0.05, call_timeout_s=2.0, heartbeat_s=0.2)


def job(
    job_id: str, batch: str, index: int, status: str, *, agent: str = "general-purpose", **more: Any
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "batch_id": batch,
        "agent": agent,
        "clone_index": index,
        "display_name": f"{agent} #{index}",
        "status": status,
        "outcome": {"completed": "success", "failed": "failure"}.get(status),
        "stop_reason": None,
        "error": None,
        "model": "sim-small",
        "turns": 1,
        "usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12},
        "progress": {"summary": f"clone {index}: working"},
        "parent": None,
        "created_at": 1000.0 + (batch == "b_00000002"),
        "started_at": 1000.5,
        "ended_at": 1001.0 if status in ("completed", "failed") else None,
        **more,
    }


class FakeSource:
    """A fleet in memory: two batches, one failed job, events for one job."""

    def __init__(self) -> None:
        self.jobs = {
            j["job_id"]: j
            for j in [
                job("sa_00000001", "b_00000001", 0, "completed"),
                job("sa_00000002", "b_00000001", 1, "failed", error="Error: subagent run failed"),
                job("sa_00000003", "b_00000002", 0, "running", agent="researcher"),
                job("sa_00000004", "b_00000002", 1, "reserved", agent="researcher"),
            ]
        }
        self.events_of: list[dict[str, Any]] = []
        self.totals: dict[str, Any] | None = None
        self.fail = False
        self.gate: threading.Event | None = None

    def list_jobs(self, **filters: Any) -> dict[str, Any]:
        if self.fail:
            raise SchedulerUnavailable("restarting")
        listing = {
            "jobs": list(self.jobs.values()),
            "capacity": {"running": 1, "max_concurrency": None, "queued": 1},
        }
        if self.totals is not None:
            listing.update(totals=self.totals, next_cursor=None)
        return listing

    def job_status(self, job_id: str) -> dict[str, Any]:
        if self.gate is not None:
            self.gate.wait(10)
        if job_id not in self.jobs:
            raise UnknownJobError(f"no job {job_id}")
        return self.jobs[job_id]

    def job_result(self, job_id: str) -> dict[str, Any]:
        return {**self.jobs[job_id], "result": {"summary": "<b>done</b>"}}

    def events(self, target: str | None = None, **query: Any) -> dict[str, Any]:
        if target not in self.jobs:
            raise UnknownJobError(f"no job {target}")
        cursor = query.get("cursor", 0)
        out = [e for e in self.events_of if e["seq"] >= cursor]
        return {"events": out, "cursor": (out[-1]["seq"] + 1) if out else cursor}


def envelope(seq: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "subagent_event",
        "subagent_run_id": "sa_00000001",
        "display_name": "general-purpose #0",
        "batch_id": "b_00000001",
        "event": {"type": kind, "ts": 1000.0 + seq, **fields},
        "seq": seq,
    }


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeSource, httpx.AsyncClient, Dashboard]]:
    source = FakeSource()
    dashboard = Dashboard(source, FAST)
    async with (
        serving(dashboard, "127.0.0.1", 0) as url,
        httpx.AsyncClient(base_url=url, timeout=5.0) as client,
    ):
        yield source, client, dashboard


async def get_when_ready(client: httpx.AsyncClient, path: str) -> httpx.Response:
    """``path`` once the first snapshot is read (bounded polling, 50 ms steps)."""
    for _ in range(100):
        resp = await client.get(path)
        if resp.status_code != 503:
            return resp
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never became ready: {resp.text}")


async def overviews(client: httpx.AsyncClient) -> AsyncIterator[dict[str, Any]]:
    async with client.stream("GET", "/api/stream") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                yield json.loads(line[6:])


# -- the page --------------------------------------------------------------------------------
async def test_page_and_static_files_are_served_with_a_strict_content_policy(served):
    _, client, _ = served
    page = await client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy and page.headers["x-content-type-options"] == "nosniff"
    script = await client.get("/static/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert (await client.get("/static/style.css")).status_code == 200
    for bad in ("/static/missing.js", "/static/..%2f_server.py", "/static/__init__.py"):
        assert (await client.get(bad)).status_code == 404


def test_page_files_need_no_build_step_and_never_put_data_into_html():
    files = {p.name: p.read_text() for p in STATIC.iterdir()}
    assert set(files) == {"index.html", "app.js", "style.css"}
    script = files["app.js"]
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert unsafe not in script
    for text in files.values():
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
    assert "<script>" not in files["index.html"]  # no inline script (the policy forbids it)


def test_page_files_are_packaged():
    import tomllib

    root = STATIC.parents[3]
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["packages"]["find"]["where"] == ["src"]  # every package under src/ is found
    patterns = tool["package-data"]["clonefleet.dashboard"]
    assert all(any(p.match(pat) for pat in patterns) for p in STATIC.iterdir())


# -- the JSON API ------------------------------------------------------------------------------
async def test_batches_and_usage_sum_the_jobs(served):
    _, client, _ = served
    body = (await get_when_ready(client, "/api/batches")).json()
    assert body["scheduler"] == {"ok": True, "problem": None}
    newest, oldest = body["batches"]
    assert newest["batch_id"] == "b_00000002" and oldest["batch_id"] == "b_00000001"
    assert oldest["counts"] == {
        "reserved": 0,
        "running": 0,
        "completed": 1,
        "failed": 1,
        "cancelled": 0,
    }
    assert oldest["done"] and oldest["ended_at"] == 1001.0 and oldest["total"] == 2
    assert not newest["done"] and newest["ended_at"] is None
    usage = (await client.get("/api/usage")).json()
    assert usage["usage"]["jobs"] == 4 and usage["usage"]["total_tokens"] == 48
    assert usage["usage"]["by_status"]["failed"] == 1 and usage["capacity"]["queued"] == 1


def test_the_schedulers_totals_give_cost_and_budgets():
    source = FakeSource()
    fleet = {"input_tokens": 900, "output_tokens": 100, "total_tokens": 1000}
    source.totals = {
        "fleet": {**fleet, "cost_usd": 0.25, "unpriced_tokens": 0},
        "batches": {
            "b_00000001": {
                **fleet,
                "cost_usd": 0.25,
                "unpriced_tokens": 0,
                "jobs": 2,
                "budget": {"budget_tokens": None, "budget_usd": 1.0, "passed": False},
            }
        },
    }
    snap = read_snapshot(source, clock=lambda: 5.0)
    assert snap.usage["total_tokens"] == 1000 and snap.usage["cost_usd"] == 0.25
    assert snap.usage["jobs"] == 4 and snap.fetched_at == 5.0
    old = next(b for b in snap.batches if b["batch_id"] == "b_00000001")
    assert old["cost_usd"] == 0.25 and old["budget"]["budget_usd"] == 1.0
    new = next(b for b in snap.batches if b["batch_id"] == "b_00000002")
    assert new["cost_usd"] is None and new["budget"] is None and new["usage"]["total_tokens"] == 24


CACHE_KEYS = ("cache_read_tokens", "cache_write_tokens")


async def test_the_json_counts_tokens_read_from_and_written_to_the_cache(served):
    source, client, _ = served
    cached = {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}
    cached.update(cache_read_tokens=8, cache_write_tokens=1)
    source.jobs["sa_00000001"]["usage"] = cached  # the others are records without the keys
    fleet = {"input_tokens": 900, "output_tokens": 100, "total_tokens": 1000}
    fleet.update(cache_read_tokens=600, cache_write_tokens=50)
    source.totals = {
        "fleet": {**fleet, "cost_usd": 0.25, "unpriced_tokens": 0},
        "batches": {"b_00000002": {**fleet, "jobs": 2, "cost_usd": 0.25, "budget": None}},
    }
    await get_when_ready(client, "/api/usage")
    for _ in range(100):  # a snapshot read after the change (bounded polling, 50 ms steps)
        usage = (await client.get("/api/usage")).json()["usage"]
        if usage["cache_read_tokens"]:
            break
        await asyncio.sleep(0.05)
    assert [usage[k] for k in CACHE_KEYS] == [600, 50]  # the scheduler's fleet totals
    batches = {b["batch_id"]: b for b in (await client.get("/api/batches")).json()["batches"]}
    assert [batches["b_00000002"]["usage"][k] for k in CACHE_KEYS] == [600, 50]
    assert [batches["b_00000001"]["usage"][k] for k in CACHE_KEYS] == [8, 1]  # summed here
    rows = {j["job_id"]: j for j in (await client.get("/api/jobs")).json()["jobs"]}
    assert [rows["sa_00000001"]["usage"][k] for k in CACHE_KEYS] == [8, 1]
    assert [rows["sa_00000002"]["usage"][k] for k in CACHE_KEYS] == [0, 0]
    source.totals = None  # a source without totals: summed over the rows
    snap = read_snapshot(source, clock=lambda: 5.0)
    assert [snap.usage[k] for k in CACHE_KEYS] == [8, 1]


def test_a_large_fleet_is_read_less_often():
    calls = BlockingCalls(1, 1.0)
    live = Live(FakeSource(), calls, DashboardOptions(refresh_s=1.0))
    rows = tuple(job(f"sa_{i:08x}", "b_00000001", i, "running") for i in range(10_000))
    snap = Snapshot(jobs=rows, batches=(), usage={}, capacity={}, agents=(), fetched_at=0.0)
    assert live.pause_after(snap) == 5.0
    assert live.pause_after(replace(snap, jobs=rows * 100)) == 30.0
    assert live.pause_after(replace(snap, jobs=rows[:10])) == 1.0
    calls.close()


async def test_job_table_filters_by_status_agent_and_batch_and_pages(served):
    _, client, _ = served
    every = (await get_when_ready(client, "/api/jobs")).json()
    assert [j["job_id"] for j in every["jobs"]] == [
        "sa_00000003",
        "sa_00000004",
        "sa_00000001",
        "sa_00000002",
    ]
    failed = (await client.get("/api/jobs", params={"status": "failed"})).json()
    assert [j["job_id"] for j in failed["jobs"]] == ["sa_00000002"]
    assert failed["jobs"][0]["error"] == "Error: subagent run failed"
    research = (await client.get("/api/jobs", params={"agent": "researcher"})).json()
    assert {j["job_id"] for j in research["jobs"]} == {"sa_00000003", "sa_00000004"}
    one = (await client.get("/api/jobs", params={"batch": "b_00000001", "limit": 1})).json()
    assert [j["job_id"] for j in one["jobs"]] == ["sa_00000001"] and one["total"] == 2
    two = await client.get(
        "/api/jobs", params={"batch": "b_00000001", "cursor": one["next_cursor"]}
    )
    assert [j["job_id"] for j in two.json()["jobs"]] == ["sa_00000002"]
    assert two.json()["next_cursor"] is None
    for bad in ({"status": "exploded"}, {"limit": "0"}, {"limit": "501"}, {"cursor": "-1"}):
        resp = await client.get("/api/jobs", params=bad)
        assert resp.status_code == 400 and resp.json()["error"]


async def test_job_detail_has_the_result_as_text_and_events_page_on(served):
    source, client, _ = served
    source.events_of = [
        envelope(i, "progress", progress={"summary": f"step {i}"}) for i in range(250)
    ]
    # A descendant's event arrives wrapped in the job's envelope: the row names the inner job.
    inner = envelope(250, "started", agent="researcher")
    inner["subagent_run_id"], inner["display_name"] = "sa_00000009", "researcher #0"
    outer = envelope(250, "x")
    outer["event"] = {k: v for k, v in inner.items() if k != "seq"}
    source.events_of.append(outer)
    detail = (await client.get("/api/jobs/sa_00000001")).json()
    assert detail["job"]["status"] == "completed" and "<b>done</b>" in detail["result"]
    first = (await client.get("/api/jobs/sa_00000001/events")).json()
    assert len(first["events"]) == 200 and first["cursor"] == "200"
    assert first["events"][3]["fields"] == {"progress": {"summary": "step 3"}}
    rest = (await client.get("/api/jobs/sa_00000001/events", params={"cursor": "200"})).json()
    assert len(rest["events"]) == 51 and rest["cursor"] == "251"
    assert rest["events"][-1]["job_id"] == "sa_00000009"
    assert rest["events"][-1]["type"] == "started"
    assert (await client.get("/api/jobs/sa_0000000f")).status_code == 404
    assert (await client.get("/api/jobs/nope")).status_code == 400
    assert (await client.get("/api/jobs/sa_00000001/events?cursor=x")).status_code == 400


async def test_model_text_is_clipped_before_it_is_sent(served):
    source, client, _ = served
    source.jobs["sa_00000002"]["error"] = "E" * 50_000
    for _ in range(100):  # the next read of the fleet picks it up
        failed = (await get_when_ready(client, "/api/jobs?status=failed")).json()["jobs"][0]
        if failed["error"].startswith("EEE"):
            break
        await asyncio.sleep(0.05)
    assert 2_000 <= len(failed["error"]) < 2_100 and failed["error"].endswith("more)")


# -- live stream and failures --------------------------------------------------------------------
async def test_stream_sends_the_overview_and_shows_an_unavailable_scheduler(served):
    source, client, _ = served
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        async for message in overviews(client):
            seen.append(message)
            sched = message["scheduler"]
            if sched["ok"] and not source.fail and len(seen) < 3:
                source.fail = True  # the scheduler restarts: the banner's message comes
            elif sched["problem"]:
                assert "restarting" in sched["problem"]
                assert message["batches"], "the last good data stays on the page"
                source.fail = False
            elif sched["ok"] and len(seen) >= 3:
                break
    assert any(m["scheduler"]["problem"] for m in seen) and seen[-1]["scheduler"]["ok"]
    assert [m["version"] for m in seen] == sorted({m["version"] for m in seen})


async def test_a_frozen_fleet_times_out_without_holding_the_server():
    source = FakeSource()
    source.gate = threading.Event()
    options = DashboardOptions(refresh_s=0.05, call_timeout_s=0.3)
    try:
        async with (
            serving(Dashboard(source, options), "127.0.0.1", 0) as url,
            httpx.AsyncClient(base_url=url, timeout=5.0) as client,
        ):
            slow = asyncio.ensure_future(client.get("/api/jobs/sa_00000001"))
            page = await client.get("/")  # answered while the read is stuck in its thread
            assert page.status_code == 200 and not slow.done()
            resp = await slow
            assert resp.status_code == 503 and "did not answer within 0.3 s" in resp.json()["error"]
    finally:
        source.gate.set()


async def test_a_page_from_another_host_name_is_refused(served):
    _, client, _ = served
    port = client.base_url.port
    resp = await client.get("/api/usage", headers={"Host": f"attacker.example:{port}"})
    assert resp.status_code == 421
    ok = await client.get("/", headers={"Host": f"localhost:{port}"})
    assert ok.status_code == 200


async def test_streams_are_bounded_in_number_and_lifetime():
    options = DashboardOptions(refresh_s=0.05, max_streams=1, stream_lifetime_s=0.5)
    async with (
        serving(Dashboard(FakeSource(), options), "127.0.0.1", 0) as url,
        httpx.AsyncClient(base_url=url, timeout=5.0) as client,
    ):
        async with asyncio.timeout(5), client.stream("GET", "/api/stream") as first:
            second = await client.get("/api/stream")
            assert second.status_code == 503
            body = b"".join([chunk async for chunk in first.aiter_bytes()])
        assert body.startswith(b"retry: 2000") and b"event: overview" in body


# -- running it ------------------------------------------------------------------------------------
def test_dashboard_thread_serves_and_stops():
    runner = DashboardThread(FakeSource(), options=FAST)
    with runner as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url, timeout=5).status_code == 200
    assert not runner._thread.is_alive()
    runner.stop()  # harmless twice


async def test_a_port_in_use_is_a_usage_error(served):
    _, client, _ = served
    with pytest.raises(UsageError, match="cannot listen on 127.0.0.1"):
        async with serving(Dashboard(FakeSource()), "127.0.0.1", client.base_url.port):
            pass


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.4", "example.com"))


def test_command_without_a_cluster_names_cluster_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLONEFLEET_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["dashboard", "--port", "0", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 is not a loopback address" in err
    assert "`clonefleet cluster up`" in err


def test_command_refuses_bad_ports_and_refresh(capsys):
    for argv in (["--port", "70000"], ["--port", "x"], ["--refresh", "0"]):
        with pytest.raises(SystemExit) as stop:
            main(["dashboard", *argv])
        assert stop.value.code == 2
    assert "TCP port" in capsys.readouterr().err
