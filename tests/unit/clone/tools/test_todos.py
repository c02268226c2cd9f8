"""``todo_write``: the clone's todo list, its ``todo`` event, its bounds, its place in the
checkpoint, and the ``todos`` field the scheduler keeps on the job."""

from __future__ import annotations

import pytest

from clonefleet.clone import Clone
from clonefleet.config import Config
from clonefleet.planning import BatchSubmission
from clonefleet.providers import SimScript
from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import LocalHost, ScriptedModel, call, make_spec, reply
from clonefleet.vocab import EVENT_LEVELS, EventType

pytestmark = pytest.mark.timeout(20)

PLAN = [
    {"content": "Read the code", "status": "completed", "activeForm": "Reading the code"},
    {"content": "Fix the bug", "status": "in_progress", "activeForm": "Fixing the bug"},
    {"content": "Run the tests", "status": "pending"},
]
EXIT = call("exit_tool", "cx", success=True, summary="ok")


async def test_each_call_replaces_the_list_and_emits_it():
    events: list[dict] = []
    model = ScriptedModel(
        [
            reply("", call("todo_write", "c1", todos=PLAN)),
            reply("", call("TodoWrite", "c2", todos=PLAN[:1])),
            reply("", call("todo_write", "c3", todos=PLAN[:1])),
            reply("", EXIT),
        ]
    )
    clone = Clone(make_spec(tools=("TodoWrite",)), model, emit=events.append)
    assert clone.todos is None
    await clone.run()
    first = model.calls[1].messages[-1]
    assert first.content == "todo list updated: 3 items (1 pending, 1 in progress, 1 completed)"
    assert "unknown tool 'TodoWrite'" in model.calls[2].messages[-1].content
    todo_events = [e for e in events if e["type"] == "todo"]
    assert [e["todos"] for e in todo_events] == [PLAN, PLAN[:1]]
    assert clone.todos == PLAN[:1]
    assert str(EventType.TODO) in EVENT_LEVELS["lifecycle"]


@pytest.mark.parametrize(
    "todos",
    [
        [{"content": "x", "status": "someday"}],
        [{"content": "", "status": "pending"}],
        [{"content": "x" * 1001, "status": "pending"}],
        [{"content": "x", "status": "pending", "owner": "me"}],
        [{"content": f"t{i}", "status": "pending"} for i in range(101)],
    ],
)
async def test_a_list_out_of_bounds_is_a_tool_error_and_changes_nothing(todos):
    model = ScriptedModel([reply("", call("todo_write", "c1", todos=todos)), reply("", EXIT)])
    clone = Clone(make_spec(tools=("todo_write",)), model)
    await clone.run()
    msg = model.calls[1].messages[-1]
    assert msg.is_error and "invalid arguments for todo_write" in msg.content
    assert clone.todos is None


async def test_the_checkpoint_keeps_the_list_and_a_bad_one_is_a_fresh_start():
    snapshots: list[dict] = []

    async def keep(state: dict) -> None:
        snapshots.append(state)

    model = ScriptedModel([reply("", call("todo_write", "c1", todos=PLAN)), reply("", EXIT)])
    spec = make_spec(tools=("todo_write",))
    await Clone(spec, model, checkpoint=keep).run()
    state = snapshots[-1]
    assert state["todos"] == PLAN
    resumed = Clone(spec, ScriptedModel([reply("", EXIT)]), resume=state)
    assert resumed.resumed and resumed.todos == PLAN
    assert Clone(spec, ScriptedModel([]), resume={**state, "todos": None}).todos is None
    bad = Clone(spec, ScriptedModel([]), resume={**state, "todos": [{"status": "maybe"}]})
    assert not bad.resumed and bad.todos is None
    assert "checkpoint ignored" in bad.warnings[-1]


async def test_the_job_status_shows_the_latest_list():
    core = SchedulerCore(LocalHost)
    batch_id, (job_id,) = core.reserve_ids(1)
    script = SimScript.from_data(
        {
            "default": [
                {"tool": "todo_write", "args": {"todos": PLAN}},
                {"tool": "exit_tool", "args": {"success": True, "summary": "ok"}},
            ]
        }
    )
    spec = make_spec(job_id=job_id, batch_id=batch_id, tools=("todo_write",))
    sub = BatchSubmission(batch_id=batch_id, specs=(spec,), config=Config(), sim_script=script)
    try:
        await core.submit(sub)
        assert (await core.job_block([job_id], timeout_seconds=10))["done"]
        status = await core.job_status(job_id)
        assert status["status"] == "completed" and status["todos"] == PLAN
        page = await core.events(target=job_id, level="lifecycle")
        assert [e["event"]["todos"] for e in page["events"] if e["event"]["type"] == "todo"] == [
            PLAN
        ]
    finally:
        await core.aclose()
