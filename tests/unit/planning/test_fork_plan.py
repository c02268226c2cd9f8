"""Planning a fork spawn: the fork part of a request is read and checked, the children get the
parent's tools, tool view, models and turns, and the scheduler accepts only that batch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.errors import ClusterError, UsageError
from clonefleet.planning import (
    BatchRequest,
    NestedPlan,
    check_planned,
    child_request,
    fork_of,
    plan_specs,
)
from clonefleet.providers import Message, Role

FORKER = """---
name: rev
description: Reviews.
clonefleet:
  allow_subagent_spawn: true
  subagent_provider: fork
  tools: [file_read, grep, list_dir]
  undeferred_tools: [file_read]
---
Review: {{ prompt }}
"""

TURNS = [
    {"role": "system", "content": "identity", "pinned": True, "cache_break": True},
    {"role": "user", "content": "the task", "pinned": True},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "name": "grep", "arguments": {}}],
    },
    {"role": "tool", "content": "hits", "tool_call_id": "c1", "name": "grep"},
]


def parent_and_plan(tmp_path: Path, count: int = 2) -> tuple[NestedPlan, list[Message]]:
    folder = tmp_path / ".clonefleet" / "subagents"
    folder.mkdir(parents=True)
    (folder / "rev.md").write_text(FORKER)
    config = Config(limits={"max_depth": 2})
    catalog = load_catalog(tmp_path, (), config)
    (parent,) = plan_specs(
        BatchRequest(agent="rev", prompt="top", model="sim-large"),
        catalog,
        config,
        batch_id="b_00000001",
        job_ids=["sa_00000001"],
        caller_cwd=tmp_path,
    )
    request = {
        "prompt": "look again",
        "subagent_type": "anything",
        "model_override": "sim-small",
        "count": count,
        "fork": {"messages": TURNS, "visible": ["file_read", "grep"], "model": "sim-large"},
    }
    fork = fork_of(request, parent)
    assert fork is not None
    req = child_request(request, parent.job_id, parent.depth, config, fork)
    assert (req.agent, req.model, req.depth) == ("rev", None, 1)
    plan = NestedPlan(
        request=req,
        config=config,
        batch_id="b_00000002",
        job_ids=tuple(f"sa_0000001{i}" for i in range(count)),
        caller_cwd=str(tmp_path),
        caller_tools=parent.tools,
        catalog=catalog,
        skills=None,
        project_path=str(tmp_path),
        caller_policy=parent.policy,
        fork=fork,
    )
    return plan, list(fork.messages)


def test_fork_children_get_the_parents_tools_view_model_and_turns(tmp_path):
    plan, seed = parent_and_plan(tmp_path)
    assert seed[0] == Message(role=Role.SYSTEM, content="identity", pinned=True, cache_break=True)
    assert seed[2].tool_calls[0].name == "grep" and seed[3].tool_call_id == "c1"
    specs = check_planned(plan(), plan)
    parent = plan.fork.parent  # type: ignore[union-attr]
    assert len(specs) == 2
    for i, spec in enumerate(specs):
        assert spec.clone_index == i and spec.depth == 1 and spec.parent == parent.job_id
        assert spec.seed_messages == tuple(seed) and spec.task == "look again"
        assert spec.tools == parent.tools and spec.agent == "rev"
        assert spec.undeferred_tools == ("file_read", "grep")
        assert spec.candidates == parent.candidates == ("sim-large",)
        assert spec.subagent_provider == "fork"


def test_the_scheduler_refuses_fork_children_with_other_turns_or_tools(tmp_path):
    plan, _ = parent_and_plan(tmp_path, count=1)
    (spec,) = plan()
    for wrong in (
        replace(spec, seed_messages=spec.seed_messages[:-1]),
        replace(spec, tools=("file_read",)),
        replace(spec, seed_messages=()),
    ):
        with pytest.raises(ClusterError):
            check_planned((wrong,), plan)
    with pytest.raises(ClusterError):  # a plain spawn's plan takes no seeded child
        check_planned((spec,), replace(plan, fork=None))


def test_a_malformed_or_unasked_fork_part_is_a_usage_error(tmp_path):
    plan, _ = parent_and_plan(tmp_path, count=1)
    parent = plan.fork.parent  # type: ignore[union-attr]
    for bad in (
        "turns",
        {"messages": [{"role": "wizard"}], "visible": []},
        {"messages": TURNS, "visible": [1]},
        {"messages": TURNS},
    ):
        with pytest.raises(UsageError, match="malformed"):
            fork_of({"fork": bad}, parent)
    spawner = replace(parent, subagent_provider="spawn")
    with pytest.raises(UsageError, match="does not fork"):
        fork_of({"fork": {"messages": TURNS, "visible": []}}, spawner)
    assert fork_of({"prompt": "x"}, parent) is None


def test_a_fork_past_the_depth_cap_is_refused(tmp_path):
    plan, _ = parent_and_plan(tmp_path, count=1)
    with pytest.raises(UsageError, match="max_depth"):
        child_request({"prompt": "x"}, "sa_00000011", 2, plan.config, plan.fork)
