"""The permission policy in runs: the clone loop's tool errors, planning, and nested spawns."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from clonefleet.clone import Clone, CloneSpec
from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.permissions import ALLOW_ALL, RuleSet, parse_rules
from clonefleet.planning import BatchRequest, BatchSubmission, plan_specs
from clonefleet.providers import SimScript
from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import FunctionModel, LocalHost, call, make_spec, reply

# -- the loop -------------------------------------------------------------------------------------


async def test_a_denied_call_comes_back_to_the_model_as_a_tool_error_naming_the_rule(
    tmp_path: Path,
) -> None:
    rules = RuleSet(source="config", deny=parse_rules(["Bash(rm:*)"], "permissions.deny"))
    spec = make_spec(
        tools=("shell",), cwd=str(tmp_path), policy=ALLOW_ALL.child(rules, str(tmp_path))
    )
    seen: list[Any] = []

    def model(req: Any) -> Any:
        seen.append(req)
        if len(seen) == 1:
            return reply("", call("shell", "c1", command="touch keep && rm -rf keep"))
        if len(seen) == 2:
            return reply("", call("shell", "c2", command="touch made"))
        return reply("", call("exit_tool", "c3", success=True, summary="done"))

    result = await Clone(spec, FunctionModel(model)).run()
    assert result.status == "completed"
    denied = seen[1].messages[-1]
    assert denied.is_error
    assert denied.content == "Error: denied by rule Bash(rm:*) (config permissions.deny)"
    assert not seen[2].messages[-1].is_error and (tmp_path / "made").exists()
    assert not (tmp_path / "keep").exists()  # the denied command never ran, not even its first part


# -- planning -------------------------------------------------------------------------------------

ROOT = """---
name: root
description: Delegates to leaf.
clonefleet:
  allow_subagent_spawn: true
  tools: [file_read]
  permissions:
    deny: ["Bash(rm:*)"]
---
Coordinate: {{ prompt }}
"""
LEAF = "---\nname: leaf\ndescription: Runs commands.\ntools: Bash, Read\n---\nRun them.\n"
CLAUDE_SPAWNER = "---\nname: lead\ndescription: Leads.\ntools: Read, Task\n---\nLead.\n"


def project(tmp_path: Path) -> Path:
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "root.md").write_text(ROOT)
    (agents / "leaf.md").write_text(LEAF)
    (agents / "lead.md").write_text(CLAUDE_SPAWNER)
    return tmp_path


def plan(tmp_path: Path, agent: str, config: Config) -> CloneSpec:
    cwd = project(tmp_path)
    (spec,) = plan_specs(
        BatchRequest(agent=agent, prompt="go"),
        load_catalog(cwd, (), config),
        config,
        batch_id="b_1",
        job_ids=["sa_00000001"],
        caller_cwd=cwd,
    )
    return spec


def test_a_clone_policy_is_the_config_layer_then_the_definition_layer(tmp_path: Path) -> None:
    spec = plan(tmp_path, "root", Config(permissions={"deny": ["WebFetch"], "allow": ["Read"]}))
    assert [layer["source"] for layer in spec.policy.describe()] == ["config", "definition root"]
    assert spec.policy.layers[0].root == str(tmp_path) and spec.policy.cwd == str(tmp_path)
    denial = spec.policy.decide("shell", {"command": "rm -rf /"})
    assert denial is not None
    assert (
        denial.message == "denied by rule Bash(rm:*) (definition root clonefleet.permissions.deny)"
    )


def test_a_tool_the_policy_always_denies_is_not_given(tmp_path: Path) -> None:
    spec = plan(tmp_path, "leaf", Config(permissions={"deny": ["Bash"]}))
    assert spec.tools == ("file_read",)


def test_a_claude_file_listing_task_may_spawn_unless_the_config_denies_subagents(
    tmp_path: Path,
) -> None:
    assert plan(tmp_path, "lead", Config()).allow_subagent_spawn
    denied = plan(tmp_path / "2", "lead", Config(permissions={"deny": ["Task"]}))
    assert not denied.allow_subagent_spawn


# -- nested spawns --------------------------------------------------------------------------------

STARTED: list[CloneSpec] = []


class RecordingHost(LocalHost):
    """A local host that remembers every spec it started."""

    async def start(
        self, specs: Sequence[CloneSpec], config: Any, sim_script: Any = None, resume: Any = None
    ) -> int:
        STARTED.extend(specs)
        return await super().start(specs, config, sim_script, resume)


def shell(command: str) -> dict[str, Any]:
    return {"tool": "shell", "args": {"command": command}}


@pytest.mark.timeout(30)
async def test_a_child_allowed_bash_cannot_run_what_its_parents_layer_denies(
    tmp_path: Path,
) -> None:
    cwd = project(tmp_path)
    config = Config(permissions={"deny": ["WebFetch"]})
    core = SchedulerCore(RecordingHost)
    batch_id, ids = core.reserve_ids(1)
    specs = plan_specs(
        BatchRequest(agent="root", prompt="top"),
        load_catalog(cwd, (), config),
        config,
        batch_id=batch_id,
        job_ids=ids,
        caller_cwd=cwd,
    )
    exit_step = {"tool": "exit_tool", "args": {"success": True, "summary": "ok"}}
    spawn = {
        "tool": "subagent",
        "args": {"description": "d", "prompt": "p", "subagent_type": "leaf"},
    }
    script = {
        "agents": {
            "root": {"default": [spawn, exit_step]},
            "leaf": {"default": [shell("rm -rf data"), shell("echo fine"), exit_step]},
        }
    }
    STARTED.clear()
    (tmp_path / "data").mkdir()
    sub = BatchSubmission(
        batch_id=batch_id,
        specs=specs,
        config=config,
        sim_script=SimScript.from_data(script),
        project_path=str(cwd),
    )
    root = (await core.submit(sub))["job_ids"][0]
    assert (await core.job_block([root], timeout_seconds=20))["done"]
    leaf = next(s for s in STARTED if s.agent == "leaf")
    assert "shell" in leaf.tools and leaf.policy.extends(specs[0].policy)
    assert [layer["source"] for layer in leaf.policy.describe()] == [
        "config",
        "definition root",
        "definition leaf",
    ]
    events = (await core.events(target=leaf.job_id, level="tools"))["events"]
    ends = [
        e for e in _flatten(events) if e.get("type") == "tool_call_end" and e["tool"] == "shell"
    ]
    assert [e["is_error"] for e in ends] == [True, False]
    assert (tmp_path / "data").is_dir()  # the denied `rm` never ran
    await core.aclose()


def _flatten(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for item in events:
        event = item.get("event", item)
        while event.get("type") == "subagent_event":
            event = event["event"]
        out.append(event)
    return out
