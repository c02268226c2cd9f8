"""A batch against a separately started `ray start` cluster that has never seen the caller's
definitions, whose workers cannot import the installed clonefleet."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

_CLIENT_SERVER_START_FAILED = (
    "Starting Ray client server failed",
    "in start_specific_server",  # the proxier's start of a per-client server (ZombieProcess)
)
"""What Ray's client proxy prints when it could not start the server for one client."""

pytestmark = pytest.mark.timeout(240)

HIDE = Path(__file__).resolve().parent.parent / "fixtures" / "hide_clonefleet"

LEAD = """---
name: remote-lead
description: Only exists in the caller's project.
clonefleet:
  allow_subagent_spawn: true
  tools: [file_read]
---
Lead {{ clone.index }}: {{ prompt }}
"""
HELPER = """---
name: remote-helper
description: Also only in the caller's project.
tools: Read, Grep
---
Claude-style helper body with a literal {{REPO_PATH}}.
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    port, client_port = free_port(), free_port()
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(HIDE),
    }
    ray_bin = Path(sys.executable).with_name("ray")
    short_tmp = tempfile.mkdtemp(
        prefix="cfr", dir="/tmp"
    )  # Ray's socket paths must stay under 107 bytes
    cmd = [
        str(ray_bin),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={short_tmp}",
        f"--ray-client-server-port={client_port}",
    ]
    # The log file, the head's process group and its temp folder go away however the test ends,
    # a head that never came up included.
    with open(tmp_path / "head.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, (tmp_path / "head.log").read_text()[-2000:]
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                assert time.monotonic() < deadline, "the Ray head did not listen within 90 s"
                time.sleep(0.05)
            yield f"127.0.0.1:{port}", f"ray://127.0.0.1:{client_port}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of the node group is still there
            proc.wait(30)
            shutil.rmtree(short_tmp, ignore_errors=True)


def test_batch_on_a_cluster_that_never_saw_the_definitions_or_the_package(ray_head, tmp_path):
    address, client_address = ray_head
    work = tmp_path / "project"
    agents = work / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "remote-lead.md").write_text(LEAD)
    (agents / "remote-helper.md").write_text(HELPER)
    (work / "script.yaml").write_text(
        "agents:\n  remote-lead:\n    default:\n"
        "      - {tool: subagent, args: {description: help, prompt: assist, subagent_type: remote-helper}}\n"
        "      - {tool: exit_tool, args: {success: true, summary: lead done}}\n"
    )
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "clonefleet",
            "run",
            "remote-lead",
            "--prompt",
            "go",
            "--count",
            "2",
            "--address",
            address,
            "--json",
            "--sim-script",
            "script.yaml",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(r["clone_index"] for r in records) == [0, 1]
    assert all(
        r["agent"] == "remote-lead" and r["result"]["summary"] == "lead done" for r in records
    )

    # The same cluster through Ray Client (`ray://`), and through RAY_ADDRESS: both batches must
    # show up in that cluster's job table (an embedded instance would not).
    ran = []
    for extra, run_env in (
        (["--address", client_address], env),
        ([], {**env, "RAY_ADDRESS": address}),
    ):
        command = [sys.executable, "-m", "clonefleet", "run", "remote-helper", "--prompt", "hi"]
        command += ["--json", *extra]
        for _attempt in range(2):
            again = subprocess.run(
                command, cwd=work, env=run_env, capture_output=True, text=True, timeout=120
            )
            # Ray Client's proxy starts a server process per client; on a loaded 2-core machine
            # that start has failed in full suite runs ("Starting Ray client server failed", or
            # the proxy finding its new server process already a zombie). That is Ray's start-up,
            # not clonefleet: one more try, then it counts.
            if not any(sign in again.stderr for sign in _CLIENT_SERVER_START_FAILED):
                break
        assert again.returncode == 0, again.stderr[-3000:]
        ran.append(json.loads(again.stdout.splitlines()[-1])["job_id"])
    listing = subprocess.run(
        [
            sys.executable,
            "-m",
            "clonefleet",
            "jobs",
            "list",
            "--agent",
            "remote-helper",
            "--address",
            address,
            "--json",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    on_cluster = {j["job_id"] for j in json.loads(listing.stdout)["jobs"]}
    assert set(ran) <= on_cluster, (ran, on_cluster)
