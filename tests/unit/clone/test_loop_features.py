"""The agent loop's tool surface, budgets, compaction and cancellation, driven by fake models."""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Literal

import pytest

from clonefleet.clone import Clone, ToolContext, tool_from_function
from clonefleet.errors import ToolRetry
from clonefleet.providers import ToolCall
from clonefleet.testing import FunctionModel, ScriptedModel, call, make_spec, reply
from clonefleet.vocab import StopReason

pytestmark = pytest.mark.timeout(20)


def exit_call(call_id: str = "cx") -> object:
    return call("exit_tool", call_id, success=True, summary="ok")


def lookup(
    key: str,
    limit: int | None = None,
    tags: list[str] = [],  # noqa: B006 (the default shows up in the derived schema)
    mode: Literal["fast", "full"] = "fast",
) -> dict:
    """Look a key up in the catalogue.

    Args:
        key: the catalogue key.
        limit: most rows to return; none means all.
    """
    return {"key": key, "limit": limit, "tags": tags, "mode": mode}


def where(ctx: ToolContext) -> str:
    """Say where the tool runs."""
    return str(ctx.root)


async def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


def broken() -> str:
    """Always fails."""
    raise RuntimeError("the catalogue is down")


# -- Python functions as tools --------------------------------------------------------------------
def test_function_signature_becomes_json_schema():
    spec = tool_from_function(lookup).spec
    assert spec.description == "Look a key up in the catalogue."
    props = spec.parameters["properties"]
    assert props["key"] == {"type": "string", "description": "the catalogue key."}
    assert props["limit"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert props["limit"]["description"] == "most rows to return; none means all."
    assert props["tags"]["type"] == "array" and props["tags"]["items"] == {"type": "string"}
    assert props["mode"]["enum"] == ["fast", "full"]
    assert (
        spec.parameters["required"] == ["key"] and spec.parameters["additionalProperties"] is False
    )


def test_tool_context_parameter_is_hidden_from_the_model():
    assert tool_from_function(where).spec.parameters["properties"] == {}


def test_star_args_are_rejected():
    def variadic(*names: str) -> str:
        return ""

    with pytest.raises(TypeError, match="named parameters"):
        tool_from_function(variadic)


def test_function_tool_pickles_with_its_spec_but_not_its_cached_argument_model():
    tool = tool_from_function(lookup)
    cached = tool.run.model()  # tool_from_function built the cache already; it must not travel
    assert cached is tool.run.model() and cached.__name__ == "lookup_arguments"
    data = pickle.dumps(tool)
    assert cached.__name__.encode() not in data
    copy = pickle.loads(data)
    assert copy.spec == tool.spec
    assert asyncio.run(copy.run({"key": "k"}, ToolContext(root="/"))) == json.dumps(lookup("k"))
    # The copy rebuilt its own argument model and still validates with it.
    assert copy.run.model() is not cached
    with pytest.raises(ToolRetry, match="invalid arguments for lookup: mode"):
        asyncio.run(copy.run({"key": "k", "mode": "slow"}, ToolContext(root="/")))


async def test_function_tools_validate_arguments_inject_context_and_report_failures(tmp_path):
    tools = tuple(tool_from_function(f) for f in (lookup, where, shout, broken))
    model = ScriptedModel(
        [
            reply(
                "",
                call("lookup", "c1", key="k", limit="3", mode="full"),
                call("lookup", "c2", key="k", mode="slow"),
                call("where", "c3"),
                call("shout", "c4", text="hey"),
                call("broken", "c5"),
            ),
            reply("", exit_call()),
        ]
    )
    spec = make_spec(
        extra_tools=tools, tools=("lookup", "where", "shout", "broken"), cwd=str(tmp_path)
    )
    result = await Clone(spec, model).run()
    assert result.status == "completed"
    out = {m.tool_call_id: m for m in model.calls[1].messages if m.role == "tool"}
    assert json.loads(out["c1"].content) == {"key": "k", "limit": 3, "tags": [], "mode": "full"}
    assert (
        out["c2"].is_error
        and "invalid arguments for lookup" in out["c2"].content
        and "mode" in out["c2"].content
    )
    assert out["c3"].content == str(tmp_path)
    assert out["c4"].content == "HEY"
    assert out["c5"].is_error and "RuntimeError: the catalogue is down" in out["c5"].content


# -- tools: aliases, argument checks, deferral, switch_facet ------------------------------------
async def test_claude_aliases_grant_the_built_in_tools(tmp_path):
    (tmp_path / "f.txt").write_text("via alias")
    model = ScriptedModel(
        [reply("", call("file_read", "c1", path="f.txt")), reply("", exit_call())]
    )
    await Clone(make_spec(tools=("Read", "Bash"), cwd=str(tmp_path)), model).run()
    names = {t.name for t in model.calls[0].tools}
    assert {"file_read", "shell"} <= names and not {"Read", "Bash", "file_write"} & names
    assert model.calls[1].messages[-1].content == "via alias"


async def test_built_in_tool_arguments_are_checked_before_running(tmp_path):
    model = ScriptedModel([reply("", call("file_read", "c1", file="x")), reply("", exit_call())])
    await Clone(make_spec(tools=("file_read",), cwd=str(tmp_path)), model).run()
    msg = model.calls[1].messages[-1]
    assert msg.is_error and "invalid arguments for file_read" in msg.content


async def test_tool_search_lists_deferred_tools_and_loads_them_by_keyword_or_select():
    tools = (tool_from_function(lookup), tool_from_function(shout))
    spec = make_spec(
        extra_tools=tools, tools=("lookup", "shout", "file_read"), undeferred_tools=("file_read",)
    )
    model = ScriptedModel(
        [
            reply("", call("shout", "c0", text="early")),
            reply("", call("tool_search", "c1", query="zebra")),
            reply("", call("tool_search", "c2", query="catalogue")),
            reply("", call("tool_search", "c3", query="select:shout")),
            reply("", call("shout", "c4", text="now")),
            reply("", exit_call()),
        ]
    )
    await Clone(spec, model).run()
    model.assert_complete()
    # A deferred tool called before tool_search loaded it is an error and does not run.
    early = model.calls[1].messages[-1]
    assert early.is_error and "it is deferred: load it with tool_search" in early.content
    assert "EARLY" not in early.content
    calls = model.calls[1:]  # the requests from the first tool_search on
    first = calls[0]
    assert "Deferred tools (load with tool_search): lookup, shout" in first.messages[1].content
    assert {t.name for t in first.tools} == {
        "file_read",
        "progress_update",
        "exit_tool",
        "tool_search",
    }
    assert "no deferred tool matches" in calls[1].messages[-1].content
    found = json.loads(calls[2].messages[-1].content)
    assert [f["name"] for f in found] == ["lookup"] and found[0]["parameters"]["required"] == [
        "key"
    ]
    assert "lookup" in {t.name for t in calls[2].tools} and "shout" not in {
        t.name for t in calls[2].tools
    }
    assert calls[4].messages[-1].content == "NOW"
    assert "tool_search" not in {t.name for t in calls[4].tools}  # nothing left to find


async def test_switch_facet_is_never_offered_and_a_call_is_an_error_the_run_survives():
    spec = make_spec(tools=("switch_facet", "file_read"))
    model = ScriptedModel(
        [reply("", call("switch_facet", "c1", facet="other")), reply("", exit_call())]
    )
    result = await Clone(spec, model).run()
    assert "switch_facet" not in {t.name for t in model.calls[0].tools}
    msg = model.calls[1].messages[-1]
    assert (
        msg.is_error
        and msg.content
        == "Error: switch_facet is not available to subagents: a subagent's facet is fixed for the run"
    )
    assert result.status == "completed"


async def test_skill_tool_loads_a_catalogue_skill_that_survives_compaction():
    turns = iter(range(100))

    def fn(req):
        n = next(turns)
        if n == 0:
            return reply("", ToolCall(id="s0", name="skill", arguments={"name": "nope"}))
        if n == 1:
            return reply("", ToolCall(id="s1", name="skill", arguments={"name": "style"}))
        if n < 8:
            return reply("y" * 400, call("progress_update", f"p{n}", summary=f"step {n}"))
        return reply("", exit_call())

    model = FunctionModel(fn)
    clone = Clone(make_spec(context_budget_tokens=300), model)
    clone.skill_catalog = {"style": ("House style.", "SKILL-STYLE-BODY")}
    await clone.run()
    skill_spec = next(t for t in model.calls[0].tools if t.name == "skill")
    assert "style: House style." in skill_spec.description
    assert (
        model.calls[1].messages[-1].is_error
        and "unknown skill 'nope'" in model.calls[1].messages[-1].content
    )
    assert "SKILL-STYLE-BODY" in model.calls[2].messages[-1].content
    assert any(m.pinned and "SKILL-STYLE-BODY" in m.content for m in model.calls[-1].messages)


async def test_no_skill_tool_without_a_catalogue():
    model = ScriptedModel([reply("", exit_call())])
    await Clone(make_spec(), model).run()
    assert "skill" not in {t.name for t in model.calls[0].tools}


# -- budgets ------------------------------------------------------------------------------------
async def test_token_budget_stops_the_run_with_the_exact_text():
    model = FunctionModel(lambda req: reply("", call("progress_update", summary="more"), tokens=50))
    events = []
    result = await Clone(make_spec(max_tokens=250, max_turns=50), model, emit=events.append).run()
    assert result.stop_reason is StopReason.TOKEN_LIMIT and result.status == "failed"
    assert (
        result.turns == 3 and result.usage["total_tokens"] == 300
    )  # 100 a turn; stops once past 250
    assert (
        result.error == "Error: subagent run hit its token limit before finishing"
        and result.result is None
    )
    assert any(e["type"] == "error" and "token budget 250" in e["detail"] for e in events)


# -- compaction ---------------------------------------------------------------------------------
async def test_compaction_keeps_system_skills_task_and_the_latest_progress_only():
    turns = iter(range(100))
    seen = []

    def fn(req):
        seen.append(req)
        n = next(turns)
        if n < 12:
            return reply(
                f"thinking {n} " + "x" * 400, call("progress_update", f"c{n}", summary=f"step {n}")
            )
        return reply("", exit_call())

    events = []
    spec = make_spec(
        context_budget_tokens=400,
        task="THE-TASK",
        instructions="THE-BODY",
        skills=(("style", "SKILL-BODY"),),
    )
    clone = Clone(spec, FunctionModel(fn), emit=events.append)
    result = await clone.run()
    assert result.status == "completed"
    compactions = [e for e in events if e["type"] == "compaction"]
    assert len(compactions) >= 2
    last = seen[-1].messages
    assert last[0].role == last[1].role == "system" and "THE-BODY" in last[1].content
    assert [m.content for m in last[2:4]] == ["[skill style]\nSKILL-BODY", "THE-TASK"]
    progress = [m.content for m in last if m.content.startswith("[latest progress]")]
    assert progress == ['[latest progress] {"summary": "step 11"}']
    summaries = [m.content for m in last if m.content.startswith("[summary of earlier work]")]
    assert len(summaries) == 1 and "thinking 0" in summaries[0]  # earlier summaries are folded in
    first_unpinned = next(m for m in last if not m.pinned)
    assert first_unpinned.role != "tool"  # a kept tool result never loses its assistant call
    assert all(len(req.messages) < 16 for req in seen)


# -- inbox, checkpoint, cancellation ------------------------------------------------------------
async def test_inbox_deliveries_arrive_once_in_order_and_checkpoints_follow_each_turn_but_the_last():
    queue = [[("d1", "first note"), ("d2", "second note")], [], []]
    checkpoints = []

    async def inbox():
        return queue.pop(0) if queue else []

    async def checkpoint(state):
        checkpoints.append(state["turns"])

    model = ScriptedModel(
        [reply("", call("progress_update", "c1", summary="a")), reply("", exit_call())]
    )
    events = []
    await Clone(make_spec(), model, emit=events.append, inbox=inbox, checkpoint=checkpoint).run()
    users = [m.content for m in model.calls[1].messages if m.role == "user"]
    assert users == ["do the thing", "first note", "second note"]
    assert [e["delivery_id"] for e in events if e["type"] == "message_delivered"] == ["d1", "d2"]
    assert checkpoints == [1]  # none after the turn that ends the run: the result supersedes it


async def test_requested_cancel_is_absorbed_so_an_outer_timeout_still_works():
    gate = asyncio.Event()

    async def slow(req):
        gate.set()
        await asyncio.sleep(30)

    clone = Clone(make_spec(), FunctionModel(slow))

    async def host():
        result = await clone.run()
        return result, asyncio.current_task().cancelling()

    task = asyncio.create_task(host())
    await asyncio.wait_for(gate.wait(), 2)
    clone.request_cancel()
    task.cancel()
    result, cancelling = await task
    assert result.stop_reason is StopReason.CANCELLED and cancelling == 0
    assert result.error == "Error: subagent run was cancelled"
