"""`clonefleet run` end to end in a subprocess (its own embedded Ray)."""

from __future__ import annotations

import json

import pytest

from clonefleet.vocab import RUN_RECORD_FIELDS

pytestmark = pytest.mark.timeout(180)

PROJECT_AGENT = """---
name: echoer
description: Echoes the task back.
clonefleet:
  tools: [file_read]
---
You are echoer clone {{ clone.index }} of {{ clone.count }}. Task: {{ prompt }}
"""


def test_run_json_prints_one_record_per_job_for_a_project_definition(cli_run, tmp_path):
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "echoer.md").write_text(PROJECT_AGENT)
    script = tmp_path / "script.yaml"
    script.write_text("clones:\n  2:\n    - {error: 503}\n    - {text: plain final answer}\n")
    out = cli_run(
        "run",
        "echoer",
        "--prompt",
        "count the files",
        "--count",
        "3",
        "--json",
        "--sim-script",
        str(script),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == 3
    assert all(tuple(r) == RUN_RECORD_FIELDS for r in records)
    by_index = {r["clone_index"]: r for r in records}
    assert sorted(by_index) == [0, 1, 2] and len({r["job_id"] for r in records}) == 3
    assert all(r["agent"] == "echoer" and r["status"] == "completed" for r in records)
    assert by_index[2]["result"] == "plain final answer"
    assert by_index[0]["result"]["success"] is True
    assert "exec: progress " in out.stderr


def test_run_exits_1_when_a_job_fails(cli_run, tmp_path):
    script = tmp_path / "script.yaml"
    script.write_text("clones:\n  0:\n    - {error: 401}\n    - {error: 401}\n")
    out = cli_run(
        "run",
        "general-purpose",
        "--prompt",
        "x",
        "--count",
        "2",
        "--json",
        "--sim-script",
        str(script),
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr
    records = {r["clone_index"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert records[0]["status"] == "failed" and records[0]["error"] == "Error: subagent run failed"
    assert records[1]["status"] == "completed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "no-such-agent", "--prompt", "x"], "general-purpose"),
        (["run", "general-purpose", "--prompt", "x", "--count", "0"], "at least 1"),
        (["run", "general-purpose", "--prompt", "x", "--count", "2.5"], "whole number"),
        (["run", "general-purpose", "--prompt", "x", "--count", "100001"], "max_count"),
        (
            ["run", "general-purpose", "--prompt", "{{ nope }}", "--count", "3"],
            "'nope' is undefined",
        ),
        (["run", "general-purpose", "--prompt", "{{ ''.__class__ }}"], "__class__"),
        (["run", "general-purpose", "--prompt", "x", "--cwd", "/"], "--allow-chdir"),
        (["run", "general-purpose", "--prompt", "x", "--model", "no-such-model"], "no-such-model"),
    ],
)
def test_usage_errors_exit_2_and_start_nothing(cli_run, tmp_path, args, message):
    out = cli_run(*args, cwd=tmp_path, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Ray" not in out.stderr and out.stdout == ""


def test_run_without_json_prints_plain_progress_and_a_summary(cli_run, tmp_path):
    out = cli_run("run", "researcher", "--prompt", "look around", "--count", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "clonefleet: 2/2 done" in out.stderr  # not a terminal: plain progress lines
    assert "exec: progress " in out.stderr
    assert "2 completed" in out.stdout
    assert out.stdout.count("sa_") == 2
