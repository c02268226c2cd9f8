"""A fork child over Ray and the simulated provider's HTTP server (OpenAI wire): it runs its
parent's definition, returns its final text to the parent, and its first request reads at least
90% of its input from the prompt cache, since it starts with its parent's previous request
(docs/prompt-cache.md, "Fork spawns")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.ray.test_scripted_runs import provider_serve

pytestmark = [pytest.mark.timeout(300)]

PARAGRAPH = (
    "Read each changed file in full before judging it, name the line you mean, and say what "
    "should change and why; prefer one precise finding to three vague ones."
)
BODY = "\n\n".join(f"{i}. {PARAGRAPH}" for i in range(80))  # about 2,400 words, shared by all

FORKER = f"""---
name: reviewer
description: Reviews code and forks itself for a second look.
clonefleet:
  allow_subagent_spawn: true
  subagent_provider: fork
  tools: [list_dir]
---
{BODY}
"""

# The server scripts by clone index and starts a clone it has not seen at the step after the
# assistant turns in its context: the parent (root clone 1) looks, forks and ends; its fork
# child (clone 0 of its batch) inherits one turn and so reads clones.0 from its second step;
# root clone 0 only uses the first.
SCRIPT = """
clones:
  0:
    - {tool: exit_tool, args: {success: true, summary: clone 0 done}}
    - {tool: exit_tool, args: {success: true, summary: the second look agrees}}
  1:
    - {tool: list_dir, args: {path: .}}
    - {tool: subagent, args: {description: second look, prompt: Look again.}}
    - {tool: exit_tool, args: {success: true, summary: parent done}}
"""


def _config(tmp_path: Path, port: int) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"""version: 1
providers:
  local: {{kind: openai, base_url: "http://127.0.0.1:{port}/v1"}}
models:
  m: {{provider: local, name: sim-small}}
model_groups:
  default: [m]
"""
    )
    return cfg


def _usage(fleet: Any, job_id: str) -> list[dict[str, Any]]:
    """The usage events of ``job_id`` itself (a nested job's arrive inside its ancestors')."""
    found = []
    for envelope in fleet.events(job_id, level="all", limit=5000)["events"]:
        while envelope["event"]["type"] == "subagent_event":
            envelope = envelope["event"]
        if envelope["subagent_run_id"] == job_id and envelope["event"]["type"] == "usage":
            found.append(envelope["event"])
    return found


def test_a_fork_childs_first_request_reads_its_parents_turns_from_the_cache(ray_cluster, tmp_path):
    from clonefleet import Fleet

    folder = tmp_path / ".clonefleet" / "subagents"
    folder.mkdir(parents=True)
    (folder / "reviewer.md").write_text(FORKER)
    (tmp_path / "fork.yaml").write_text(SCRIPT)
    with provider_serve("--script", "fork.yaml", cwd=tmp_path) as port:
        fleet = Fleet(config=_config(tmp_path, port), cwd=tmp_path)
        batch = fleet.spawn("reviewer", "Review the change.", 2)
        assert fleet.remaining([batch.batch_id], wait_seconds=120) == 0
        parent = batch.job_ids[1]
        (child,) = [j["job_id"] for j in fleet.list_jobs(parent=parent)["jobs"]]
        assert fleet.remaining([child], wait_seconds=60) == 0
        records = {j: fleet.job_result(j) for j in (parent, child)}
        parent_usage, child_usage = _usage(fleet, parent), _usage(fleet, child)
    assert records[parent]["result"]["summary"] == "parent done"
    assert (records[child]["agent"], records[child]["status"]) == ("reviewer", "completed")
    assert records[child]["result"]["summary"] == "the second look agrees"
    assert len(parent_usage) == 3 and len(child_usage) == 1
    first = child_usage[0]
    # The child's first request is the parent's second request plus one short user message.
    assert first["input_tokens"] > parent_usage[1]["input_tokens"] >= 2000
    assert first["cache_read_tokens"] >= 0.9 * first["input_tokens"], first
    # All of the parent's previous request is read back (2,448 of 2,450 tokens when measured).
    assert first["cache_read_tokens"] >= parent_usage[1]["input_tokens"], (first, parent_usage)
