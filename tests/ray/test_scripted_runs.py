"""Scripted end-to-end runs: `clonefleet run --sim-script` (salvage, breaker, plain text, failover,
declined, token limit) and the `openai` provider over real HTTP against `clonefleet provider serve`.

Each `clonefleet run` is a subprocess with its own embedded Ray (~8 s), so every case rides in one
batch with per-clone scripts.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.timeout(180)

REPORTER = """---
name: reporter
description: Reports a status.
clonefleet:
  tools: [file_read]
  max_turns: 4
  exit_tool_schema:
    type: object
    properties:
      status: {type: string}
      summary: {type: string}
    required: [status, summary]
---
You report on {{ prompt }}.
"""

SCRIPT = """
clones:
  0:   # salvage: three different unrecognised statuses (retry budget 2, then salvaged)
    - {tool: exit_tool, args: {status: shipped, summary: first}}
    - {tool: exit_tool, args: {status: landed, summary: second}}
    - {tool: exit_tool, args: {status: merged, summary: third}}
  1:   # breaker: the same failing call three times in a row
    - {tool: exit_tool, args: {status: shipped, summary: same}}
    - {tool: exit_tool, args: {status: shipped, summary: same}}
    - {tool: exit_tool, args: {status: shipped, summary: same}}
  2:   # plain-text ending (the definition declared a schema: a warning, still completed)
    - {tool: progress_update, args: {summary: reading}}
    - {text: plain final answer}
  3:   # failover: clone 3 starts on sim-large (3 mod 2); 1 try + 2 retries fail, then sim-small answers
    - {error: 503, retry_after: 0}
    - {error: 503, retry_after: 0}
    - {error: 503, retry_after: 0}
    - {tool: exit_tool, args: {status: Done, summary: after failover}}
  4:   # the model refuses
    - {refuse: true, text: I will not do that}
  5:   # max_turns 4 runs out
    - {tool: progress_update, args: {summary: p1}}
    - {tool: progress_update, args: {summary: p2}}
    - {tool: progress_update, args: {summary: p3}}
    - {tool: progress_update, args: {summary: p4}}
    - {tool: progress_update, args: {summary: p5}}
"""


def records(out: subprocess.CompletedProcess[str]) -> dict[int, dict]:
    parsed = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return {r["clone_index"]: r for r in parsed}


def test_scripted_batch_ends_each_clone_as_its_script_says(cli_run, tmp_path):
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "reporter.md").write_text(REPORTER)
    (tmp_path / "script.yaml").write_text(SCRIPT)
    out = cli_run(
        "run",
        "reporter",
        "--prompt",
        "the build",
        "--count",
        "7",
        "--json",
        "--sim-script",
        "script.yaml",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr  # some jobs did not succeed
    by = records(out)
    assert sorted(by) == list(range(7)), out.stderr

    salvage = by[0]
    assert (salvage["status"], salvage["stop_reason"], salvage["error"]) == (
        "completed",
        "completed",
        None,
    )
    assert salvage["salvaged"] and salvage["nonconforming"] and salvage["concerns"]
    assert salvage["result"] == {"status": "merged", "summary": "third"} and salvage["turns"] == 3

    breaker = by[1]
    assert (breaker["status"], breaker["stop_reason"], breaker["salvaged"], breaker["result"]) == (
        "failed",
        "abnormal",
        False,
        None,
    )
    assert (
        breaker["error"]
        == "Error: subagent run ended abnormally (no progress: repeated failing exit_tool calls)"
    )

    plain = by[2]
    assert (plain["status"], plain["outcome"], plain["result"]) == (
        "completed",
        "success",
        "plain final answer",
    )
    assert any("declared structured result was not produced" in w for w in plain["warnings"])

    failover = by[3]
    assert (failover["status"], failover["outcome"], failover["model"]) == (
        "completed",
        "success",
        "sim-small",
    )
    assert failover["result"] == {"status": "Done", "summary": "after failover"}

    declined = by[4]
    assert (declined["status"], declined["stop_reason"]) == ("failed", "declined")
    assert declined["error"] == "Error: subagent declined the task" and declined["result"] is None

    limit = by[5]
    assert (limit["stop_reason"], limit["turns"], limit["result"]) == ("max_turns", 4, None)
    assert limit["error"] == "Error: subagent run hit its token limit before finishing"

    default = by[6]  # no script of its own: progress, then an exit payload that fits the schema
    assert (default["status"], default["outcome"], default["model"]) == (
        "completed",
        "success",
        "sim-small",
    )
    assert default["result"]["status"] == "completed"

    progress = [line for line in out.stderr.splitlines() if line.startswith("exec: progress ")]
    updates = [json.loads(p[len("exec: progress ") :]) for p in progress]
    index_of = {r["job_id"]: i for i, r in by.items()}
    assert all(index_of[u["job_id"]] == u["clone_index"] for u in updates)  # each names its job
    assert any(u["summary"] == "reading" for u in updates)
    assert any(u["summary"] == "p4" for u in updates)


def test_failover_is_reported_as_a_model_failover_event(fleet, tmp_path):
    script = tmp_path / "failover.yaml"
    script.write_text(
        "clones:\n  0:\n    - {error: 401}\n    - {tool: exit_tool, args: {success: true, summary: moved on}}\n"
    )
    batch = fleet.spawn("general-purpose", "fail over", count=1, sim_script=str(script))
    assert fleet.job_block([batch.batch_id], timeout_seconds=60)["done"]
    record = fleet.job_result(batch.job_ids[0])
    assert (record["status"], record["model"], record["result"]["summary"]) == (
        "completed",
        "sim-large",
        "moved on",
    )
    events = [e["event"] for e in fleet.events(batch.batch_id)["events"]]
    moves = [e for e in events if e["type"] == "model_failover"]
    assert [(m["from"], m["to"]) for m in moves] == [("sim-small", "sim-large")]
    assert "HTTP 401" in moves[0]["reason"]


# -- the openai provider over real HTTP ---------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def provider_serve(*extra: str, cwd: Path) -> Iterator[int]:
    """`clonefleet provider serve` on a free loopback port, ready when `GET /v1/models` answers."""
    port = _free_port()
    command = [sys.executable, "-m", "clonefleet", "provider", "serve", "--port", str(port)]
    # As a context manager the process's pipes are closed on the way out.
    with subprocess.Popen(
        [*command, *extra], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            _wait_until_serving(proc, port)
            yield port
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                assert proc.wait(timeout=10) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _wait_until_serving(proc: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"provider serve exited: {proc.communicate()[1]}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "provider serve did not become ready"
        time.sleep(0.05)


def write_config(tmp_path: Path, port: int) -> Path:
    cfg = tmp_path / f"cfg-{port}.yaml"
    cfg.write_text(
        f"""version: 1
providers:
  local: {{kind: openai, base_url: "http://127.0.0.1:{port}/v1", timeout_s: 1.5, max_retries: 2}}
models:
  remote-a: {{provider: local, name: sim-small}}
  remote-b: {{provider: local, name: sim-large}}
model_groups:
  default: [remote-a, remote-b]
"""
    )
    return cfg


def test_openai_provider_completes_a_batch_over_real_http(cli_run, tmp_path):
    with provider_serve(cwd=tmp_path) as port:
        cfg = write_config(tmp_path, port)
        out = cli_run(
            "run",
            "general-purpose",
            "--prompt",
            "summarise",
            "--count",
            "4",
            "--config",
            str(cfg),
            "--json",
            cwd=tmp_path,
        )
    assert out.returncode == 0, out.stderr
    by = records(out)
    assert sorted(by) == [0, 1, 2, 3]
    for index, record in by.items():
        remote, wire = (("remote-a", "sim-small"), ("remote-b", "sim-large"))[index % 2]
        assert (record["status"], record["outcome"], record["model"]) == (
            "completed",
            "success",
            remote,
        )
        # The simulated server names the wire model it was asked for: the request went over HTTP.
        assert record["result"]["summary"].startswith(f"clone {index} ({wire}) finished")
        assert record["turns"] == 2 and record["usage"]["total_tokens"] > 0


FAULTS = """
clones:
  0: [{error: 401}, {tool: exit_tool, args: {success: true, summary: after 401}}]
  1: [{error: 429, retry_after: 0}, {html: true, error: 502}, {tool: exit_tool, args: {success: true, summary: after retries}}]
  2: [{malformed: true}, {malformed: true}, {malformed: true}, {tool: exit_tool, args: {success: true, summary: after malformed}}]
  3: [{error: 403}, {error: 403}]
  4: [{drip: true}, {tool: exit_tool, args: {success: true, summary: after drip}}]
  5: [{hang: true}, {tool: exit_tool, args: {success: true, summary: after hang}}]
"""


def test_openai_provider_fault_modes_end_in_retry_failover_or_a_clear_failure(cli_run, tmp_path):
    (tmp_path / "faults.yaml").write_text(FAULTS)
    started = time.monotonic()
    with provider_serve("--script", "faults.yaml", cwd=tmp_path) as port:
        cfg = write_config(tmp_path, port)
        out = cli_run(
            "run",
            "general-purpose",
            "--prompt",
            "x",
            "--count",
            "6",
            "--config",
            str(cfg),
            "--json",
            cwd=tmp_path,
        )
    assert out.returncode == 1, out.stderr
    by = records(out)
    assert sorted(by) == list(range(6)), out.stderr
    expected = {  # clone i starts on remote-a for even i, remote-b for odd i
        0: ("remote-b", "after 401"),  # 401 on remote-a: moved on at once
        1: (
            "remote-b",
            "after retries",
        ),  # 429 then an HTML 502 page: retried on the same candidate
        2: (
            "remote-b",
            "after malformed",
        ),  # broken JSON x3 on remote-a: retries spent, failed over
        4: ("remote-a", "after drip"),  # slow drip cut by the 1.5 s deadline, then retried
        5: ("remote-b", "after hang"),  # no answer: deadline, then retried
    }
    for index, (model, summary) in expected.items():
        record = by[index]
        assert (record["status"], record["model"], record["result"]["summary"]) == (
            "completed",
            model,
            summary,
        ), record
    assert (by[3]["status"], by[3]["stop_reason"], by[3]["error"]) == (
        "failed",
        "failed",
        "Error: subagent run failed",
    )
    assert time.monotonic() - started < 120  # nothing hung
