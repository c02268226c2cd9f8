"""`clonefleet run` end to end in a subprocess (its own embedded Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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


def _failing_script(path, failing):
    """A simulation script where the clones ``failing`` fail (every model answers 401)."""
    lines = ["clones:"] + [f"  {i}: [{{error: 401}}, {{error: 401}}]" for i in failing]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_off_a_terminal_names_each_job_in_progress_lines_and_keeps_records(cli_run, tmp_path):
    out_file = tmp_path / "records.jsonl"
    args = ("run", "general-purpose", "--prompt", "x", "--count", "51", "--out", str(out_file))
    out = cli_run(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    records = _records(out_file)
    assert len(records) == 51 and all(tuple(r) == RUN_RECORD_FIELDS for r in records)
    index_of = {r["job_id"]: r["clone_index"] for r in records}
    assert sorted(index_of.values()) == list(range(51))
    progress = [
        json.loads(line.removeprefix("exec: progress "))
        for line in out.stderr.splitlines()
        if line.startswith("exec: progress ")
    ]
    assert len(progress) == 51
    assert all(list(p)[:3] == ["job_id", "clone_index", "summary"] for p in progress)
    assert all(index_of[p["job_id"]] == p["clone_index"] for p in progress)
    # 51 jobs: the summary, without the per-job table.
    assert "51 jobs in " in out.stdout and "status       51 completed" in out.stdout
    assert "failures: none" in out.stdout and "sa_" not in out.stdout


def test_run_summary_lists_twenty_failures_and_the_command_for_the_rest(cli_run, tmp_path):
    out_file = tmp_path / "records.jsonl"
    script = _failing_script(tmp_path / "script.yaml", range(0, 50, 2))  # 25 of 55 fail
    out = cli_run(
        "run",
        "general-purpose",
        "--prompt",
        "x",
        "--count",
        "55",
        "--sim-script",
        script,
        "--out",
        str(out_file),
        "--table",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr
    assert len(_records(out_file)) == 55
    text = out.stdout
    assert "status       30 completed, 25 failed" in text
    assert "failures: 25 (the first 20 by clone index)" in text
    assert "#38 sa_" in text and "#40 sa_" not in text.split("failures:")[1]
    assert "every candidate model failed" in text
    assert (
        f'5 more: jq -c \'select(.status != "completed" or .outcome != "success")\' {out_file}'
        in text
    )
    table = text.split(" jobs in ")[0].splitlines()
    assert table[0].split() == [
        "job",
        "clone",
        "status",
        "outcome",
        "model",
        "turns",
        "result",
        "/",
        "error",
    ]
    assert sum(line.startswith("sa_") for line in table) == 55  # --table: every job, though 55
    # Failures are printed as they happen (stderr is not a terminal here).
    assert out.stderr.count("clonefleet: failed #") == 25


def test_interrupted_run_leaves_only_complete_records(tmp_path):
    out_file = tmp_path / "records.jsonl"
    script = tmp_path / "script.yaml"
    fast = "[{text: done}]"
    script.write_text(
        "default: [{text: slow, latency_ms: 120000}]\n"
        f"clones: {{0: {fast}, 1: {fast}, 2: {fast}}}\n"
    )
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "CLONEFLEET_STATE_DIR": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    args = ["run", "general-purpose", "--prompt", "x", "--count", "6", "--sim-script", str(script)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "clonefleet", *args, "--out", str(out_file)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            if out_file.exists() and out_file.read_text().count("\n") >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and stdout == ""
    text = out_file.read_text()
    assert text.endswith("\n")
    records = _records(out_file)
    assert sorted(r["clone_index"] for r in records) == [0, 1, 2]
    assert all(tuple(r) == RUN_RECORD_FIELDS for r in records)
