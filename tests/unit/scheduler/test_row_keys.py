"""A job's row key (a batch mapped over ``--inputs``) through the scheduler (no Ray): in its run
record, its status, its events' envelopes and the ``key`` filter of ``list_jobs``, kept by the
journal through a restart and by events that leave memory; a counted batch has ``key`` null."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Any

import msgpack
import pytest

from clonefleet.clone import ToolContext, job_tools
from clonefleet.scheduler import JournalView, SchedulerCore
from clonefleet.scheduler._events import spill_records, spilled_entries
from clonefleet.scheduler._recovery import restore
from clonefleet.testing import (
    LocalHosts,
    crash_core,
    make_submission,
    open_journaled_core,
    wait_until,
)
from clonefleet.vocab import RUN_RECORD_FIELDS

pytestmark = pytest.mark.timeout(60)

HANG = {"default": [{"tool": "progress_update", "args": {"summary": "step"}}, {"hang": True}]}

submission = partial(make_submission, restarts=2, checkpoint_s=0.0)


def keyed(sub: Any, keys: list[str]) -> Any:
    """The submission with one row key per clone, as planning with rows makes it."""
    return replace(
        sub, specs=tuple(replace(s, key=k) for s, k in zip(sub.specs, keys, strict=True))
    )


async def all_events(core: SchedulerCore, target: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = 0
    while True:
        page = await core.events(target, cursor=cursor, level="all")
        if not page["events"]:
            return out
        out.extend(page["events"])
        cursor = page["cursor"]


async def test_the_key_is_in_the_record_status_events_and_the_listing_filter():
    core = SchedulerCore(LocalHosts())
    keys = ["src/a.py", "src/b.py", "line 3"]
    rows = await core.submit(keyed(submission(core, 3), keys))
    counted = await core.submit(submission(core, 2))
    ids = [*rows["job_ids"], *counted["job_ids"]]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]

    for job_id, key in zip(rows["job_ids"], keys, strict=True):
        record = await core.job_result(job_id)
        assert tuple(record) == RUN_RECORD_FIELDS and RUN_RECORD_FIELDS[4] == "key"
        assert record["key"] == key and record["status"] == "completed"
        assert (await core.job_status(job_id))["key"] == key
    for job_id in counted["job_ids"]:
        assert (await core.job_result(job_id))["key"] is None
        assert (await core.job_status(job_id))["key"] is None

    events = await all_events(core, rows["batch_id"])
    assert {e["event"]["type"] for e in events} >= {"queued", "started", "result"}
    by_job = {e["subagent_run_id"]: e["key"] for e in events}
    assert by_job == dict(zip(rows["job_ids"], keys, strict=True))
    results = [e["event"]["record"] for e in events if e["event"]["type"] == "result"]
    assert sorted(r["key"] for r in results) == sorted(keys)
    assert all("key" not in e for e in await all_events(core, counted["batch_id"]))

    listing = await core.list_jobs(key="src/b.py")
    assert [j["job_id"] for j in listing["jobs"]] == [rows["job_ids"][1]]
    assert listing["jobs"][0]["key"] == "src/b.py"
    assert (await core.list_jobs(key="src/b.py", batch=counted["batch_id"]))["jobs"] == []
    assert (await core.list_jobs(key="no such key"))["jobs"] == []
    assert len((await core.list_jobs(key=None))["jobs"]) == 5
    # Paging a key filter: one match a page, the cursor leads on to the end.
    page = await core.list_jobs(key="line 3", limit=1)
    assert [j["key"] for j in page["jobs"]] == ["line 3"]
    await core.aclose()


async def test_a_restarted_scheduler_keeps_the_keys_of_ended_and_resumed_jobs(tmp_path):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "j", hosts)
    done = await core.submit(keyed(submission(core, 2), ["k1", "k2"]))
    assert (await core.job_block(done["job_ids"], timeout_seconds=10))["done"]
    hang = await core.submit(keyed(submission(core, 2, script=HANG), ["h1", "h2"]))
    await wait_until(lambda: all(j in core.table.checkpoints for j in hang["job_ids"]))
    await journal.commit()
    crash_core(core, journal, hosts)

    core2, journal2, table = open_journaled_core(tmp_path / "j", LocalHosts())
    assert dict(restore(core2, table)) == {"finished": 2, "resumed": 2, "lost": 0}
    assert [(await core2.job_result(j))["key"] for j in done["job_ids"]] == ["k1", "k2"]
    for job_id, key in zip(hang["job_ids"], ["h1", "h2"], strict=True):
        assert (await core2.job_status(job_id))["key"] == key
        spec = core2.table.spec_of(job_id)
        assert spec is not None and spec.key == key
    found = await core2.list_jobs(key="h2")
    assert [j["job_id"] for j in found["jobs"]] == [hang["job_ids"][1]]
    await core2.cancel_many([hang["batch_id"]])
    assert (await core2.job_block(hang["job_ids"], timeout_seconds=10))["done"]
    records = [await core2.job_result(j) for j in hang["job_ids"]]
    assert [(r["status"], r["key"]) for r in records] == [("cancelled", "h1"), ("cancelled", "h2")]
    await core2.aclose()
    await journal2.aclose()

    # Read offline (`jobs list --key` with no cluster running): the same keys.
    view = JournalView(tmp_path / "j")
    assert [j["key"] for j in view.list_jobs(key="k2")["jobs"]] == ["k2"]
    assert view.job_result(done["job_ids"][0])["key"] == "k1"


async def test_events_that_leave_memory_keep_their_key_in_the_shared_header():
    core = SchedulerCore(LocalHosts())
    out = await core.submit(keyed(submission(core, 2), ["a", "b"]))
    counted = await core.submit(submission(core, 1))
    ids = [*out["job_ids"], *counted["job_ids"]]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    entries = list(core.event_log.entries)
    records = [msgpack.unpackb(msgpack.packb(r)) for r in spill_records(0, entries)]
    rows = [row for r in records for row in r["ev"]]
    assert all(isinstance(row[1], int) for row in rows)  # every envelope shares its header
    back = [entry for r in records for _, entry in spilled_entries(r, 0)]
    assert [env for _, _, env in back] == [
        {**env, "seq": i} for i, (_, _, env) in enumerate(entries)
    ]
    assert {env.get("key") for _, _, env in back} == {"a", "b", None}
    await core.aclose()


async def test_the_list_jobs_tool_filters_by_key():
    core = SchedulerCore(LocalHosts())
    out = await core.submit(keyed(submission(core, 2), ["x", "y"]))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    tool = job_tools(core, "sa_00000000")["list_jobs"]
    assert tool.spec.parameters["properties"]["key"] == {"type": "string"}
    reply = json.loads(await tool.run({"key": "y"}, ToolContext(root="/")))
    assert [(j["job_id"], j["key"]) for j in reply["jobs"]] == [(out["job_ids"][1], "y")]
    await core.aclose()
