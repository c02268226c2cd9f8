"""The dashboard's JSON for jobs with row keys (a batch mapped over ``--inputs``), read from a
real journal (no Ray): the key in every table row and the job's detail, ``keyed`` to show the
key column, the ``key`` filter, and the key in event rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from clonefleet.dashboard._data import jobs_page, read_events, read_job, read_snapshot
from clonefleet.errors import UsageError
from clonefleet.journal import Journal
from clonefleet.scheduler import Durable, JournalView, SchedulerCore
from clonefleet.testing import LocalHosts, make_submission

pytestmark = pytest.mark.timeout(60)

STATIC = Path(__file__).resolve().parents[3] / "src" / "clonefleet" / "dashboard" / "static"


class Source(JournalView):
    """A journal read offline, with the events the scheduler logged before it stopped."""

    envelopes: list[dict[str, Any]] = []

    def events(self, target: str | None = None, **query: Any) -> dict[str, Any]:
        cursor = query.get("cursor", 0)
        out = [e for e in self.envelopes if e["subagent_run_id"] == target and e["seq"] >= cursor]
        return {"events": out, "cursor": (out[-1]["seq"] + 1) if out else cursor}


async def fleet(folder: Path, keys: list[str] | None) -> tuple[Source, list[str]]:
    journal, _ = Journal.open(folder)
    journal.start_background(0.01)
    core = SchedulerCore(LocalHosts(), durable=Durable(journal))
    ids: list[str] = []
    if keys is not None:
        sub = make_submission(core, len(keys))
        specs = tuple(replace(s, key=k) for s, k in zip(sub.specs, keys, strict=True))
        ids += (await core.submit(replace(sub, specs=specs)))["job_ids"]
    ids += (await core.submit(make_submission(core, 2)))["job_ids"]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    envelopes = list((await core.events(None, level="all", limit=5000))["events"])
    await core.aclose()
    await journal.aclose()
    source = Source(folder)
    source.envelopes = envelopes
    return source, ids


async def test_rows_and_detail_carry_the_key_and_the_table_is_keyed(tmp_path):
    source, ids = await fleet(tmp_path / "j", ["a.py", "b.py", "c.py"])
    snap = read_snapshot(source)
    page = jobs_page(snap, {})
    assert page["keyed"] is True
    keys = {j["job_id"]: j["key"] for j in page["jobs"]}
    assert keys == {ids[0]: "a.py", ids[1]: "b.py", ids[2]: "c.py", ids[3]: None, ids[4]: None}
    one = jobs_page(snap, {"key": "b.py"})
    assert [j["job_id"] for j in one["jobs"]] == [ids[1]] and one["total"] == 1
    assert jobs_page(snap, {"key": "zzz"})["jobs"] == []
    assert len(jobs_page(snap, {"key": ""})["jobs"]) == 5  # empty = any, as the other filters
    detail = read_job(source, ids[2])
    assert detail["job"]["key"] == "c.py" and detail["job"]["status"] == "completed"
    assert read_job(source, ids[3])["job"]["key"] is None
    events = read_events(source, ids[0], None)["events"]
    assert events and {e["key"] for e in events} == {"a.py"}
    assert {e["key"] for e in read_events(source, ids[4], None)["events"]} == {None}
    with pytest.raises(UsageError):
        jobs_page(snap, {"key": "a.py", "limit": "0"})


async def test_a_fleet_of_counted_batches_is_not_keyed(tmp_path):
    source, ids = await fleet(tmp_path / "j", None)
    page = jobs_page(read_snapshot(source), {})
    assert page["keyed"] is False and [j["key"] for j in page["jobs"]] == [None, None]


def test_the_page_shows_a_key_column_and_the_detail_a_key_field():
    html = (STATIC / "index.html").read_text()
    script = (STATIC / "app.js").read_text()
    assert '<th id="jobs-key-head" hidden>key</th>' in html
    assert "state.keyed = Boolean(page.keyed)" in script and '["key", job.key]' in script
