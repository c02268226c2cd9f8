"""Clone checkpoints: a snapshot after a turn is plain data, and a clone resumed from it goes on
exactly as the uninterrupted run would; a bad checkpoint means a fresh start with a warning."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from clonefleet.clone import Candidate, Clone, ExitJudge, FailoverModel, state_of
from clonefleet.clone._checkpoint import pack_state
from clonefleet.errors import ModelError
from clonefleet.providers import ToolCall
from clonefleet.testing import FunctionModel, ScriptedModel, call, make_spec, reply
from clonefleet.vocab import StopReason

pytestmark = pytest.mark.timeout(20)

STATUS_SCHEMA = {"type": "object", "properties": {"status": {"type": "string"}}}
"""An exit schema that lets unrecognised statuses through to the judge's retry budget."""
EXIT = call("exit_tool", "cx", success=True, summary="ok")


def rich_spec(**fields: Any):
    """A clone with deferred tools, a loadable skill, a declared exit schema and a context small
    enough to be compacted: every part of the state a checkpoint keeps."""
    base: dict[str, Any] = {
        "tools": ("file_read", "glob"),
        "undeferred_tools": ("file_read",),
        "available_skills": (("style", "How to write", "Write tersely."),),
        "exit_schema": STATUS_SCHEMA,
        "exit_schema_declared": True,
        "context_budget_tokens": 150,
    }
    return make_spec(**(base | fields))


def rich_steps():
    """Five turns: progress, load a tool and a skill, then three exit calls with unrecognised
    statuses; the third is salvaged only if the judge remembers the first two. The context is
    compacted before turns 4 and 5 (the second time folding in the first summary)."""
    return [
        reply(
            "looking around " * 20,
            call("progress_update", "c1", summary="started", nested={"a": [1, 2.5, None]}),
        ),
        reply(
            "",
            call("tool_search", "c2", query="select:glob"),
            ToolCall(id="c3", name="skill", arguments={"name": "style"}),
        ),
        reply("", call("exit_tool", "c4", status="weird-one")),
        reply("", call("exit_tool", "c5", status="weird-two")),
        reply("", call("exit_tool", "c6", status="weird-three")),
    ]


async def run_with_checkpoints(spec, model, **kw):
    snapshots: list[dict] = []

    async def keep(state: dict) -> None:
        snapshots.append(state)

    result = await Clone(spec, model, checkpoint=keep, **kw).run()
    return result, snapshots


def assert_plain(value: Any, where: str = "state") -> None:
    """Only what msgpack and JSON both carry as is: str-keyed dicts, lists, scalars."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), f"{where}: key {key!r}"
            assert_plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_plain(item, f"{where}[{i}]")
    else:
        assert value is None or isinstance(value, str | int | float | bool), f"{where}: {value!r}"


def roundtrip(state: dict) -> dict:
    return msgpack.unpackb(msgpack.packb(state, use_bin_type=True), strict_map_key=True)


async def test_snapshot_is_plain_data_that_survives_msgpack():
    queue = [[], [("d1", "a note from the parent")]]

    async def inbox():
        return queue.pop(0) if queue else []

    _, snapshots = await run_with_checkpoints(rich_spec(), ScriptedModel(rich_steps()), inbox=inbox)
    state = snapshots[3]
    assert_plain(state)
    assert roundtrip(state) == state
    assert state["v"] == 1 and state["job_id"] == "sa_00000000" and state["turns"] == 4
    assert state["delivered"] == ["d1"] and state["loaded_skills"] == ["style"]
    assert state["visible"] == ["file_read", "glob"] and state["summary"]  # compacted once
    assert state["judge"]["status_retries"] == 2 and state["judge"]["streak"] == 1
    assert state["progress"] == {"summary": "started", "nested": {"a": [1, 2.5, None]}}
    assert state["usage"] == {
        "input_tokens": 40,
        "output_tokens": 40,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert state["model_name"] == "sim-small" and state["failover"] is None


@pytest.mark.parametrize("turn", [1, 2, 3, 4])
async def test_resumed_clone_goes_on_exactly_like_the_uninterrupted_run(turn: int):
    whole = ScriptedModel(rich_steps())
    expected, snapshots = await run_with_checkpoints(rich_spec(), whole)
    assert [s["turns"] for s in snapshots] == [1, 2, 3, 4]  # none after the last turn
    assert expected.salvaged and expected.turns == 5
    assert expected.usage == {
        "input_tokens": 50,
        "output_tokens": 50,
        "total_tokens": 100,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }

    rest, events = ScriptedModel(rich_steps()[turn:]), []
    clone = Clone(rich_spec(), rest, emit=events.append, resume=roundtrip(snapshots[turn - 1]))
    assert clone.resumed and clone.turns == turn
    result = await clone.run()
    assert rest.calls == whole.calls[turn:]  # the same messages and tools from the next turn on
    assert result == expected  # salvaged: the judge kept its retries across the restart
    started = events[0]
    assert started["type"] == "started" and started["resumed"] is True and started["turn"] == turn
    assert [e["turn"] for e in events if e["type"] == "usage"] == list(range(turn + 1, 6))


async def test_budgets_count_the_whole_run_across_restarts():
    steps = [reply("", call("progress_update", f"c{i}", summary=str(i))) for i in range(5)]
    _, snapshots = await run_with_checkpoints(make_spec(max_turns=2), ScriptedModel(steps))
    assert [s["turns"] for s in snapshots] == [1]  # the max_turns ending is not checkpointed

    model = ScriptedModel(steps[2:])
    result = await Clone(make_spec(max_turns=3), model, resume=snapshots[0]).run()
    assert len(model.calls) == 2 and result.turns == 3
    assert result.stop_reason == StopReason.MAX_TURNS

    spent = Clone(make_spec(max_turns=1), ScriptedModel([]), resume=snapshots[0])
    result = await spent.run()  # already at its budget: ends before asking the model
    assert result.stop_reason == StopReason.MAX_TURNS and result.turns == 1


async def good_snapshot() -> dict:
    steps = [reply("", call("progress_update", "c1", summary="x")), reply("", EXIT)]
    _, snapshots = await run_with_checkpoints(make_spec(), ScriptedModel(steps))
    return snapshots[0]


def _set(key: str, value: Any):
    return lambda s: s | {key: value}


BAD = {
    "not a mapping": lambda s: ["not", "a", "checkpoint"],
    "other version": _set("v", 2),
    "version as bool": _set("v", True),
    "other job": _set("job_id", "sa_ffffffff"),
    "messages not a list": _set("messages", "hello"),
    "no messages": _set("messages", []),
    "unknown role": _set("messages", [{"role": "wizard", "content": "hi"}]),
    "unhashable role": _set("messages", [{"role": ["user"], "content": "hi"}]),
    "bad tool call": _set("messages", [{"role": "assistant", "tool_calls": [{"id": 1}]}]),
    "content not text": _set("messages", [{"role": "user", "content": b"bytes"}]),
    "negative turns": _set("turns", -1),
    "turns as bool": _set("turns", True),
    "turns as text": _set("turns", "2"),
    "usage as text": _set("usage", {"input_tokens": "a", "output_tokens": 0}),
    "judge retries out of range": _set("judge", {"status_retries": 99, "streak": 0}),
    "judge streak without signature": _set("judge", {"status_retries": 0, "streak": 1}),
    "visible not strings": _set("visible", [1]),
    "progress not a mapping": _set("progress", "done"),
    "warnings missing": lambda s: {k: v for k, v in s.items() if k != "warnings"},
    "failover not a mapping": _set("failover", "b"),
}


@pytest.mark.parametrize("mangle", BAD.values(), ids=list(BAD))
async def test_a_bad_checkpoint_means_a_fresh_start_with_a_warning(mangle):
    state = mangle(await good_snapshot())
    fresh = Clone(make_spec(), ScriptedModel([]))
    model = ScriptedModel([reply("", EXIT)])
    clone = Clone(make_spec(), model, resume=state)
    assert not clone.resumed and clone.turns == 0 and clone.messages == fresh.messages
    result = await clone.run()
    assert result.turns == 1 and result.status == "completed"
    assert any(w.startswith("checkpoint ignored, the run started afresh") for w in result.warnings)


async def test_a_packed_checkpoint_resumes_and_an_unreadable_one_starts_afresh():
    state = await good_snapshot()
    packed = pack_state(state)
    assert isinstance(packed, bytes) and state_of(packed) == roundtrip(state)
    assert state_of(state) is state and state_of(None) is None and state_of(b"\xc1") is None
    resumed = Clone(make_spec(), ScriptedModel([]), resume=packed)
    assert resumed.resumed and resumed.turns == state["turns"]
    garbled = Clone(make_spec(), ScriptedModel([reply("", EXIT)]), resume=packed[:7])
    assert not garbled.resumed
    result = await garbled.run()
    assert result.status == "completed"
    assert any(w.startswith("checkpoint ignored, the run started afresh") for w in result.warnings)
    odd = {"v": 1, "not packable": object()}
    assert pack_state(odd) is odd  # what msgpack cannot pack travels as it is


# -- the parts: exit judge and failover cursor ----------------------------------------------------
def test_exit_judge_state_round_trips_and_rejects_what_it_could_not_reach():
    judge = ExitJudge(STATUS_SCHEMA)
    judge.judge({"status": "odd"})
    judge.judge({"status": "odd"})
    state = judge.export_state()
    assert state == {"status_retries": 2, "streak": 2, "streak_signature": '{"status": "odd"}'}
    again = ExitJudge(STATUS_SCHEMA)
    again.restore_state(roundtrip(state))
    assert again.judge({"status": "odd"}).verdict == "break"  # the third identical failure
    for bad in ({"status_retries": 3, "streak": 0}, {"status_retries": 0, "streak": 3}, {}):
        with pytest.raises(ValueError):
            ExitJudge(STATUS_SCHEMA).restore_state(bad)


class Down(ModelError):
    """A non-transient model failure: the cursor moves on at once."""


async def _down(req):
    raise Down("gone")


def failover(model_b) -> FailoverModel:
    return FailoverModel(
        [
            Candidate(key="a", wire_name="a", model=FunctionModel(_down)),
            Candidate(key="b", wire_name="b", model=model_b),
        ]
    )


async def test_failover_cursor_is_kept_and_restored():
    steps = [reply("", call("progress_update", "c1", summary="x")), reply("", EXIT)]
    expected, snapshots = await run_with_checkpoints(
        make_spec(candidates=("a", "b")), failover(ScriptedModel(steps))
    )
    assert expected.status == "completed"
    state = snapshots[0]
    assert state["failover"] == {"start": 0, "cursor": 1, "current": "b"}
    assert state["model_name"] == "b"

    model = failover(ScriptedModel([]))
    clone = Clone(make_spec(candidates=("a", "b")), model, resume=roundtrip(state))
    assert clone.resumed and model.current == "b" and clone.model_name == "b"

    assert not model.restore_cursor({"start": 0, "cursor": 1, "current": "z"})  # not this group
    assert model.current == "b"
    with pytest.raises(ValueError):
        model.restore_cursor({"start": "0", "cursor": 1, "current": "b"})
