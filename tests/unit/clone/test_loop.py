"""The agent loop driven by fake models: no Ray, no network."""

from __future__ import annotations

import asyncio

import pytest

from clonefleet.clone import BASE_PROMPT, Clone, tool_from_function
from clonefleet.errors import AllModelsFailed
from clonefleet.testing import FunctionModel, ScriptedModel, call, make_spec, reply
from clonefleet.vocab import StopReason


def collect():
    events = []
    return events, events.append


async def test_progress_then_exit_completes_with_payload():
    model = ScriptedModel(
        [
            reply("", call("progress_update", summary="half way")),
            reply("", call("exit_tool", "c2", success=True, summary="done it")),
        ]
    )
    events, emit = collect()
    result = await Clone(make_spec(), model, emit=emit).run()
    model.assert_complete()
    assert result.status == "completed" and result.outcome == "success"
    assert result.result == {"success": True, "summary": "done it"}
    assert result.turns == 2 and result.error is None
    assert [e["progress"] for e in events if e["type"] == "progress"] == [{"summary": "half way"}]
    assert events[0]["type"] == "started" and events[-1]["type"] == "result"


async def test_model_sees_system_prompt_task_and_exit_schema():
    seen = []

    def fn(req):
        seen.append(req)
        return reply("", call("exit_tool", success=True, summary="x"))

    await Clone(make_spec(instructions="BODY-TEXT", task="TASK-TEXT"), FunctionModel(fn)).run()
    req = seen[0]
    assert [m.role for m in req.messages] == ["system", "system", "user"]
    assert req.messages[0].content == BASE_PROMPT  # identity first, the same for every clone
    assert req.messages[1].content == "BODY-TEXT"
    assert req.messages[2].content == "TASK-TEXT"
    exit_spec = next(t for t in req.tools if t.name == "exit_tool")
    assert exit_spec.parameters["required"] == ["success", "summary"]


async def test_exit_with_success_false_is_completed_with_failure_outcome():
    model = ScriptedModel([reply("", call("exit_tool", success=False, summary="could not"))])
    result = await Clone(make_spec(), model).run()
    assert (result.status, result.outcome) == ("completed", "failure")


async def test_schema_violation_goes_back_to_model_as_tool_error():
    model = ScriptedModel(
        [
            reply("", call("exit_tool", summary="no flag")),
            reply("", call("exit_tool", "c2", success=True, summary="ok")),
        ]
    )
    result = await Clone(make_spec(), model).run()
    assert result.status == "completed"
    tool_msg = model.calls[1].messages[-1]
    assert tool_msg.is_error and "success" in tool_msg.content


async def test_max_turns_ends_with_max_turns_reason_and_token_limit_text():
    model = FunctionModel(lambda req: reply("", call("progress_update", summary="again")))
    result = await Clone(make_spec(max_turns=3), model).run()
    assert result.stop_reason is StopReason.MAX_TURNS and result.turns == 3
    assert result.error == "Error: subagent run hit its token limit before finishing"
    assert result.result is None


async def test_refusal_declines():
    result = await Clone(make_spec(), ScriptedModel([reply("I will not", refusal=True)])).run()
    assert (
        result.stop_reason is StopReason.DECLINED
        and result.error == "Error: subagent declined the task"
    )


async def test_provider_failure_fails_the_run_with_exact_text():
    model = ScriptedModel([AllModelsFailed({"sim-small": "HTTP 503"})])
    events, emit = collect()
    result = await Clone(make_spec(), model, emit=emit).run()
    assert result.stop_reason is StopReason.FAILED and result.error == "Error: subagent run failed"
    assert any(e["type"] == "error" and "HTTP 503" in e["detail"] for e in events)


async def test_unrequested_cancel_propagates():
    async def slow(req):
        await asyncio.sleep(30)

    task = asyncio.create_task(Clone(make_spec(), FunctionModel(slow)).run())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_parallel_safe_tools_run_concurrently():
    a, b = asyncio.Event(), asyncio.Event()

    async def left() -> str:
        a.set()
        await asyncio.wait_for(b.wait(), 2)
        return "left"

    async def right() -> str:
        b.set()
        await asyncio.wait_for(a.wait(), 2)
        return "right"

    tools = (
        tool_from_function(left, parallel_safe=True),
        tool_from_function(right, parallel_safe=True),
    )
    model = ScriptedModel(
        [
            reply("", call("left", "c1"), call("right", "c2")),
            reply("", call("exit_tool", "c3", success=True, summary="ok")),
        ]
    )
    result = await Clone(make_spec(extra_tools=tools, tools=("left", "right")), model).run()
    assert result.status == "completed"
    contents = [m.content for m in model.calls[1].messages if m.role == "tool"]
    assert contents == ["left", "right"]


async def test_tool_outside_launch_directory_is_refused(tmp_path):
    (tmp_path / "inside.txt").write_text("hello")
    (tmp_path.parent / "secret.txt").write_text("secret")
    model = ScriptedModel(
        [
            reply(
                "",
                call("file_read", "c1", path="inside.txt"),
                call("file_read", "c2", path="../secret.txt"),
            ),
            reply("", call("exit_tool", "c3", success=True, summary="ok")),
        ]
    )
    await Clone(make_spec(tools=("file_read",), cwd=str(tmp_path)), model).run()
    tool_msgs = [m for m in model.calls[1].messages if m.role == "tool"]
    assert tool_msgs[0].content == "hello" and not tool_msgs[0].is_error
    assert tool_msgs[1].is_error and "outside the launch directory" in tool_msgs[1].content
