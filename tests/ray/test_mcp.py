"""A batch's clones call an MCP tool through their clone hosts, on real Ray actors: one server
process per host, never one per clone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.planning import plan_batch

pytestmark = pytest.mark.timeout(180)

DEMO = Path(__file__).parents[1] / "fixtures" / "mcp" / "demo_server.py"
ECHOER = """---
name: echoer
description: Echoes through MCP.
tools: [mcp__demo__echo]
---
Echo.
"""
SCRIPT = """default:
  - {tool: mcp__demo__echo, args: {text: through the host}}
  - {tool: exit_tool, args: {success: true, summary: echoed}}
"""


def test_a_batchs_clones_call_an_mcp_tool_through_their_hosts(fleet, tmp_path: Path) -> None:
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "echoer.md").write_text(ECHOER)
    (tmp_path / "script.yaml").write_text(SCRIPT)
    starts = tmp_path / "starts"
    demo = {"command": [sys.executable, str(DEMO), "stdio"], "env": {"DEMO_STARTS": str(starts)}}
    plan = plan_batch(
        "echoer",
        "go",
        4,
        config=Config(mcp_servers={"demo": demo}),
        caller_cwd=tmp_path,
        clones_per_actor=2,
        sim_script=str(tmp_path / "script.yaml"),
    )
    batch = fleet.submit(plan)
    assert fleet.job_block([batch.batch_id], timeout_seconds=150)["done"]
    results = [fleet.job_result(j) for j in batch.job_ids]
    assert [r["status"] for r in results] == ["completed"] * 4, results
    for job_id in batch.job_ids:
        ends = [
            e["event"]
            for e in fleet.events(job_id, level="tools")["events"]
            if e["event"]["type"] == "tool_call_end" and e["event"]["tool"] == "mcp__demo__echo"
        ]
        assert [e["is_error"] for e in ends] == [False]
    # At most one start per clone host (two hosts of two clones each), never one per clone.
    assert 1 <= len(starts.read_text().split()) <= 2
