"""A job that fails on its provider says why, over real HTTP: its record, its ``result`` event and
its status carry the ``cause``, and a restarted scheduler still shows it (docs/json.md)."""

from __future__ import annotations

import pytest

from clonefleet.config import Config
from clonefleet.providers import start_server
from clonefleet.scheduler._durable import job_row, record_of
from clonefleet.scheduler._recovery import restore
from clonefleet.testing import LocalHosts, crash_core, make_submission, open_journaled_core

pytestmark = pytest.mark.timeout(60)


def http_config(base_url: str) -> Config:
    """``sim-small`` served by an ``openai`` provider at ``base_url``, one try per candidate."""
    return Config(
        providers={"local": {"kind": "openai", "base_url": base_url, "max_retries": 0}},
        models={"sim-small": {"provider": "local", "name": "sim-small"}},
    )


async def test_a_job_failing_over_http_names_the_status_and_keeps_it_across_a_restart(tmp_path):
    runner, port = await start_server(fail_rate=1.0)  # every request: HTTP 503
    try:
        hosts = LocalHosts()
        core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
        config = http_config(f"http://127.0.0.1:{port}/v1")
        out = await core.submit(make_submission(core, 1, config=config))
        job_id = out["job_ids"][0]
        assert (await core.job_block([job_id], timeout_seconds=20))["done"]
    finally:
        await runner.cleanup()
    record = await core.job_result(job_id)
    assert record["error"] == "Error: subagent run failed"  # the exact text stays
    cause = record["cause"]
    assert cause["summary"].startswith("HTTP 503 ") and cause["summary"].endswith("sim-small")
    # No retry, so no backoff: only the admission gate's bookkeeping (well under 0.1 s) is waited.
    assert cause["attempts"] == 1 and 0.0 <= cause["waited_s"] < 0.1
    (only,) = cause["candidates"]
    assert (only["model"], only["provider"], only["last_status"]) == ("sim-small", "local", 503)
    assert only["error_type"] and only["message"]
    status = await core.job_status(job_id)
    assert status["cause"] == cause
    page = await core.events(job_id, level="lifecycle")
    (result,) = [e["event"] for e in page["events"] if e["event"]["type"] == "result"]
    assert result["cause"] == cause and result["record"]["cause"] == cause
    await journal.commit()
    crash_core(core, journal, hosts)

    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core2, table)) == {"finished": 1, "resumed": 0, "lost": 0}
    assert (await core2.job_result(job_id))["cause"] == cause
    assert (await core2.job_status(job_id))["cause"] == cause
    await core2.aclose()
    await journal2.aclose()


def test_a_row_journaled_before_cause_existed_reads_as_no_cause():
    rec = record_of(
        {
            "job_id": "sa_00000001",
            "batch_id": "b_1",
            "agent": "a",
            "clone_index": 0,
            "clone_count": 1,
            "state": "failed",
        }
    )
    assert rec is not None and rec.cause is None
    old = job_row(rec)
    del old["cause"]
    again = record_of(old)
    assert again is not None and again.cause is None and again.run_record()["cause"] is None
