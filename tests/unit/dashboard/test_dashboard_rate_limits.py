"""The dashboard's rate-limit panel (no Ray): the rows it sends, read with the job table, in the
overview and at `/api/rate-limits`; a source without a limiter or a failing one shows none."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from clonefleet.dashboard import Dashboard, DashboardOptions, serving
from clonefleet.dashboard._data import (
    MAX_SCOPES,
    overview,
    rate_row,
    read_rate_limits,
    read_snapshot,
)
from clonefleet.errors import ClusterError

pytestmark = pytest.mark.timeout(20)

ROW = {
    "scope": "p/sim-small",
    "provider": "p",
    "model": "sim-small",
    "source": "headers",
    "rpm_limit": 570.0,
    "tpm_limit": None,
    "max_in_flight": None,
    "rpm_now": 41.0,
    "tpm_now": 5230.0,
    "in_flight": 2,
    "waiting": 7,
    "rate_limited": 3,
    "rate_limited_last_min": 1,
    "paused_s": 0.0,
}


class Source:
    """No jobs, and the limiter's rows (or an error, or no ``rate_limits`` at all)."""

    def __init__(self, rows: list[Any] | Exception) -> None:
        self.rows = rows

    def list_jobs(self, **filters: Any) -> dict[str, Any]:
        return {"jobs": [], "capacity": {"running": 0, "max_concurrency": None, "queued": 0}}

    def job_status(self, job_id: str) -> Any:
        raise AssertionError("not read")

    def job_result(self, job_id: str) -> Any:
        raise AssertionError("not read")

    def events(self, target: Any = None, **query: Any) -> Any:
        raise AssertionError("not read")

    def rate_limits(self) -> list[Any]:
        if isinstance(self.rows, Exception):
            raise self.rows
        return self.rows


def test_a_row_keeps_its_numbers_and_gains_a_label():
    out = rate_row(ROW)
    assert out == {**ROW, "label": "p/sim-small"}
    assert rate_row({**ROW, "model": None})["label"] == "p"


def test_a_row_is_made_safe_to_send():
    out = rate_row({"provider": "p" * 5000, "model": None, "rpm_now": "7", "waiting": True})
    assert len(out["provider"]) < 300 and out["label"] == out["provider"]
    assert out["rpm_now"] is None and out["waiting"] is None  # not numbers: null
    assert out["rpm_limit"] is None and out["source"] is None


def test_the_snapshot_and_the_overview_carry_the_rows():
    snap = read_snapshot(Source([ROW, "junk"]))
    assert snap.rate_limits == (rate_row(ROW),)
    assert overview(snap)["rate_limits"] == [rate_row(ROW)]


def test_no_limiter_a_failing_one_or_none_at_all_shows_no_rows():
    class Journal:
        pass

    assert read_rate_limits(Journal()) == ()
    assert read_rate_limits(Source(ClusterError("gone"))) == ()
    assert read_snapshot(Source(ClusterError("gone"))).rate_limits == ()
    many = read_rate_limits(Source([ROW] * (MAX_SCOPES + 5)))
    assert len(many) == MAX_SCOPES


async def test_the_rows_are_served_at_their_endpoint():
    options = DashboardOptions(refresh_s=0.05, call_timeout_s=2.0, heartbeat_s=0.2)
    async with (
        serving(Dashboard(Source([ROW]), options), "127.0.0.1", 0) as url,
        httpx.AsyncClient(base_url=url, timeout=5.0) as client,
    ):
        for _ in range(100):  # until the first read is done (bounded, 50 ms steps)
            resp = await client.get("/api/rate-limits")
            if resp.status_code != 503:
                break
            await asyncio.sleep(0.05)
        assert resp.status_code == 200
        body = resp.json()
        assert body["rate_limits"] == [rate_row(ROW)] and body["scheduler"]["ok"]
