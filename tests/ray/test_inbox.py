"""Messages to running clones on real Ray: order, exactly once, undelivered, refusals, limits,
and the inbox actor or a clone host killed (docs/inbox.md)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.errors import UnknownJobError, UsageError
from clonefleet.fleet import plan_batch

pytestmark = pytest.mark.timeout(180)


def submit(fleet, count, steps, tmp_path, *, restarts=2, **limits):
    script = Path(tmp_path) / f"s{time.monotonic_ns()}.json"
    script.write_text(json.dumps({"default": steps}))
    config = Config(
        limits={"max_restarts": restarts, **limits}, durability={"checkpoint_interval_s": 0.0}
    )
    plan = plan_batch(
        "general-purpose",
        "listen",
        count,
        config=config,
        caller_cwd=fleet.cwd,
        sim_script=str(script),
    )
    return fleet.submit(plan)


def turns(n, latency_ms=100):
    return [
        {"tool": "progress_update", "args": {"summary": f"t{i}"}, "latency_ms": latency_ms}
        for i in range(n)
    ]


def until(predicate, limit_s=60.0):
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def wait_running(fleet, job_id):
    until(
        lambda: (
            fleet.job_status(job_id)["status"] == "running"
            and fleet.job_status(job_id)["turns"] >= 1
        )
    )


def user_texts(scheduler_call, job_id):
    state = scheduler_call("checkpoint_of", job_id)
    return [m["content"] for m in (state or {}).get("messages", []) if m.get("role") == "user"]


def test_100_messages_arrive_in_order_once_each(fleet, scheduler_call, tmp_path):
    # Alive until cancelled (a clone stops at 50 turns): sending 100 takes seconds when busy.
    job = submit(fleet, 1, turns(45, 1000), tmp_path).job_ids[0]
    wait_running(fleet, job)
    sent = [fleet.message(job, f"note {i}") for i in range(100)]
    assert {s["status"] for s in sent} == {"queued"}
    until(lambda: fleet.delivery(sent[-1]["delivery_id"])["status"] == "delivered")
    until(lambda: sum(t.startswith("note ") for t in user_texts(scheduler_call, job)) == 100)
    notes = [t for t in user_texts(scheduler_call, job) if t.startswith("note ")]
    assert notes == [f"note {i}" for i in range(100)]
    assert {fleet.delivery(s["delivery_id"])["status"] for s in sent} == {"delivered"}
    assert fleet.job_status(job)["messages"] == {"queued": 0, "delivered": 100, "undelivered": 0}
    fleet.job_cancel(job)


def test_messages_to_all_50_clones_of_a_batch_are_delivered(fleet, tmp_path):
    batch = submit(fleet, 50, turns(40, 150), tmp_path)
    until(
        lambda: all(
            s["turns"] >= 1 for s in fleet.job_block([batch.batch_id], wait_seconds=0)["jobs"]
        )
    )
    sent = [fleet.message(j, f"hello {j}") for j in batch.job_ids]
    until(lambda: all(fleet.delivery(s["delivery_id"])["status"] == "delivered" for s in sent))
    fleet.cancel_many([batch.batch_id])


def test_a_message_to_a_job_that_ends_first_becomes_undelivered(fleet, tmp_path):
    job = submit(
        fleet,
        1,
        [{"tool": "progress_update", "args": {"summary": "x"}, "latency_ms": 1500}],
        tmp_path,
    ).job_ids[0]
    until(lambda: fleet.job_status(job)["status"] == "running")
    sent = fleet.message(job, "too late")
    fleet.job_cancel(job)
    until(lambda: fleet.delivery(sent["delivery_id"])["status"] == "undelivered")
    events = [e["event"]["type"] for e in fleet.events(job)["events"]]
    assert "message_queued" in events and "message_undelivered" in events
    assert fleet.job_status(job)["messages"]["undelivered"] == 1


def test_refusals_unknown_finished_skill_and_limits(fleet, tmp_path):
    with pytest.raises(UnknownJobError):
        fleet.message("sa_00000000", "anyone?")
    done = submit(fleet, 1, [], tmp_path).job_ids[0]
    assert fleet.job_block([done], timeout_seconds=30)["done"]
    with pytest.raises(UsageError, match="already ended"):
        fleet.message(done, "hello")
    job = submit(fleet, 1, turns(50, 200), tmp_path).job_ids[0]
    wait_running(fleet, job)
    with pytest.raises(UsageError, match="@skill:nope"):
        fleet.message(job, "use @skill:nope please")
    assert fleet.job_status(job)["messages"]["queued"] == 0, "a refused message keeps out"
    with pytest.raises(UsageError, match="max_message_chars"):
        fleet.message(job, "x" * 100_001)
    fleet.job_cancel(job)


def test_the_inbox_killed_with_20_queued_delivers_each_once(
    fleet, scheduler_call, inbox_call, tmp_path
):
    # The job outlives any restart of the inbox (45 turns of a second; it is cancelled at the
    # end): on a busy machine a restart takes seconds, and a job that ended first would rightly
    # leave some undelivered.
    job = submit(
        fleet,
        1,
        [
            *turns(1),
            {"tool": "progress_update", "args": {"summary": "slow"}, "latency_ms": 2500},
            *turns(45, 1000),
        ],
        tmp_path,
    ).job_ids[0]
    until(lambda: fleet.job_status(job)["turns"] >= 1)
    sent = [fleet.message(job, f"queued {i}") for i in range(20)]
    os.kill(inbox_call("__ray_call__", lambda self: os.getpid()), signal.SIGKILL)
    until(lambda: all(_status(fleet, s) == "delivered" for s in sent), 90)
    until(lambda: sum(t.startswith("queued ") for t in user_texts(scheduler_call, job)) == 20)
    notes = [t for t in user_texts(scheduler_call, job) if t.startswith("queued ")]
    assert notes == [f"queued {i}" for i in range(20)]
    fleet.job_cancel(job)


def test_what_a_clone_took_while_the_inbox_was_down_is_delivered_though_its_job_ended(
    fleet, inbox_call, tmp_path
):
    hold = {"tool": "progress_update", "args": {"summary": "hold"}, "latency_ms": 3000}
    job = submit(fleet, 1, [*turns(1), hold], tmp_path).job_ids[0]
    until(lambda: fleet.job_status(job)["turns"] >= 1)
    sent = [fleet.message(job, f"held {i}") for i in range(5)]
    until(lambda: fleet.job_status(job)["messages"]["queued"] == 5)  # its host holds them
    pid = inbox_call("__ray_call__", lambda self: os.getpid())
    os.kill(pid, signal.SIGSTOP)  # the inbox hears no acknowledgement until it restarts
    try:
        assert fleet.job_block([job], timeout_seconds=60)["done"]
        assert fleet.job_status(job)["messages"]["delivered"] == 5
    finally:
        os.kill(pid, signal.SIGKILL)
    # Restarted, the inbox routes the five again and hears that their job ended before the
    # acknowledgements arrive: those still win.
    until(lambda: all(_status(fleet, s) == "delivered" for s in sent), 90)
    assert fleet.job_status(job)["messages"] == {"queued": 0, "delivered": 5, "undelivered": 0}


def test_an_acknowledgement_the_inbox_answered_outlives_its_process(fleet, inbox_call, tmp_path):
    hold = {"tool": "progress_update", "args": {"summary": "hold"}, "latency_ms": 30_000}
    job = submit(fleet, 1, [*turns(1), hold], tmp_path).job_ids[0]
    until(lambda: fleet.job_status(job)["turns"] >= 1)
    sent = fleet.message(job, "acknowledged")
    # As the scheduler does once the clone took it; the inbox is killed as soon as it answers.
    inbox_call("acked", [sent["delivery_id"]])
    pid = inbox_call("__ray_call__", lambda self: os.getpid())
    os.kill(pid, signal.SIGKILL)
    until(lambda: _status(fleet, sent) is not None)  # restarted, from its journal
    assert _status(fleet, sent) == "delivered"
    fleet.job_cancel(job)


def _status(fleet, sent):
    try:
        return fleet.delivery(sent["delivery_id"])["status"]
    except Exception:
        return None


def test_a_host_killed_after_delivery_the_resumed_clone_sees_it_once(
    fleet, scheduler_call, tmp_path
):
    job = submit(fleet, 1, turns(40, 150), tmp_path).job_ids[0]
    wait_running(fleet, job)
    sent = fleet.message(job, "only once")
    until(lambda: "only once" in user_texts(scheduler_call, job))
    assert scheduler_call("kill_host_of", job)
    until(lambda: fleet.job_status(job)["restarts"] == 1)
    turn = fleet.job_status(job)["turns"]
    until(lambda: fleet.job_status(job)["turns"] >= turn + 2)
    assert user_texts(scheduler_call, job).count("only once") == 1
    assert fleet.delivery(sent["delivery_id"])["status"] == "delivered"
    fleet.job_cancel(job)


LEAD = """---
name: steer-lead
description: Starts a helper in the background and steers it.
clonefleet:
  allow_subagent_spawn: true
---
Coordinate: {{ prompt }}
"""


def test_a_parent_clone_steers_its_background_child_with_message_subagent(ray_cluster, tmp_path):
    from clonefleet import Fleet

    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "steer-lead.md").write_text(LEAD)
    spawn = {"description": "help", "prompt": "assist", "subagent_type": "general-purpose"}
    script = {
        "agents": {
            "steer-lead": {
                "default": [
                    {"tool": "subagent", "args": {**spawn, "background": True}},
                    {"tool": "message_subagent", "args": {"job_id": "$last_job", "text": "focus"}},
                    {"tool": "progress_update", "args": {"summary": "wait"}, "latency_ms": 1500},
                    {"tool": "exit_tool", "args": {"success": True, "summary": "steered"}},
                ]
            },
            "general-purpose": {"default": turns(12, 150)},
        }
    }
    (tmp_path / "steer.json").write_text(json.dumps(script))
    fleet = Fleet(cwd=tmp_path)
    batch = fleet.spawn("steer-lead", "task", count=1, sim_script=str(tmp_path / "steer.json"))
    lead = batch.job_ids[0]
    assert fleet.job_block([lead], timeout_seconds=60)["done"]
    assert fleet.job_result(lead)["status"] == "completed"
    child = fleet.list_jobs(parent=lead)["jobs"][0]["job_id"]
    until(lambda: fleet.job_status(child)["messages"]["delivered"] == 1)
    ends = [
        e["event"]
        for e in fleet.events(lead, level="tools")["events"]
        if e["event"]["type"] == "tool_call_end" and e["event"]["tool"] == "message_subagent"
    ]
    assert ends and not ends[0]["is_error"]
    fleet.job_cancel(child)
