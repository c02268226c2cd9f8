"""The dashboard's JSON API over a real fleet, and `clonefleet dashboard` on a `cluster up`
cluster (the page itself in a browser: test_dashboard_browser.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from clonefleet.dashboard import DashboardOptions, DashboardThread
from clonefleet.providers import SimScript

pytestmark = pytest.mark.timeout(120)

SCRIPT = {"clones": {1: [{"refuse": True, "text": "I will not do that"}]}}
DECLINED = "Error: subagent declined the task"


def get_json(client: httpx.Client, path: str, ready: Any = bool, timeout_s: float = 20.0) -> Any:
    """``path``'s JSON once ``ready(body)`` holds (bounded polling, 50 ms steps)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        resp = client.get(path)
        if resp.status_code == 200 and ready(body := resp.json()):
            return body
        time.sleep(0.05)
    raise AssertionError(f"{path} never became ready: {resp.status_code} {resp.text[:300]}")


def test_api_shows_a_real_batch_its_failed_job_and_events(fleet):
    batch = fleet.spawn("general-purpose", "api", 3, sim_script=SimScript.from_data(SCRIPT))
    assert fleet.job_block([batch.batch_id], timeout_seconds=60)["done"]
    failed = batch.job_ids[1]
    options = DashboardOptions(refresh_s=0.2)
    with DashboardThread(fleet, options=options) as url, httpx.Client(base_url=url) as client:
        body = get_json(
            client,
            "/api/batches",
            lambda b: any(x["batch_id"] == batch.batch_id and x["done"] for x in b["batches"]),
        )
        shown = next(x for x in body["batches"] if x["batch_id"] == batch.batch_id)
        assert shown["counts"]["completed"] == 2 and shown["counts"]["failed"] == 1
        assert shown["usage"]["total_tokens"] > 0 and shown["agent"] == "general-purpose"
        page = get_json(client, f"/api/jobs?batch={batch.batch_id}&status=failed")
        assert [j["job_id"] for j in page["jobs"]] == [failed]
        assert page["jobs"][0]["error"] == DECLINED
        detail = get_json(client, f"/api/jobs/{failed}")
        assert detail["job"]["stop_reason"] == "declined" and detail["result"] is None
        ok = get_json(client, f"/api/jobs/{batch.job_ids[0]}")
        assert json.loads(ok["result"])["success"] is True
        events = get_json(client, f"/api/jobs/{failed}/events")
        types = [e["type"] for e in events["events"]]
        assert types[0] == "queued" and "error" in types and types[-1] == "result", types
        assert all(e["job_id"] == failed for e in events["events"])
        after = get_json(
            client, f"/api/jobs/{failed}/events?cursor={events['cursor']}", lambda b: True
        )
        assert after["events"] == []
        usage = get_json(client, "/api/usage")
        assert usage["usage"]["total_tokens"] >= shown["usage"]["total_tokens"]
        assert client.get("/api/jobs/sa_00000000").status_code == 404


def _first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The process's first line of output, or fail after ``timeout_s``."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    if not got:
        proc.kill()
        raise AssertionError(f"no output within {timeout_s} s: {proc.stderr.read()}")  # type: ignore[union-attr]
    return got[0]


def test_command_serves_the_cluster_up_cluster_until_interrupted(cli, tmp_path):
    run, work = cli
    refused = run("dashboard", "--port", "0")
    assert refused.returncode == 2 and "`clonefleet cluster up`" in refused.stderr
    assert run("cluster", "up", "--json").returncode == 0
    env = {
        **os.environ,
        "CLONEFLEET_STATE_DIR": str(tmp_path / "state"),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    with subprocess.Popen(
        [sys.executable, "-m", "clonefleet", "dashboard", "--port", "0", "--refresh", "0.2"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            line = _first_line(proc, 60)
            assert line.startswith("clonefleet dashboard: http://127.0.0.1:"), line
            url = line.split()[2]
            with httpx.Client(base_url=url) as client:
                assert client.get("/").status_code == 200
                usage = get_json(client, "/api/usage", lambda b: b["scheduler"]["ok"])
                assert usage["usage"]["jobs"] == 0 and usage["capacity"]["running"] == 0
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
            assert "dashboard stopped" in proc.stderr.read()  # type: ignore[union-attr]
        finally:
            if proc.poll() is None:
                proc.kill()
