"""`clonefleet cluster up --nodes 3`: a batch's clone hosts are placed on every node."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_batch_hosts_are_spread_over_every_node(tmp_path):
    env = {
        **os.environ,
        "CLONEFLEET_STATE_DIR": str(tmp_path / "state"),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    env.pop("RAY_ADDRESS", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "clonefleet", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )

    up = run("cluster", "up", "--nodes", "3", "--cpus-per-node", "1", "--json")
    try:
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["nodes"] == 3
        batch = run(
            "run",
            "general-purpose",
            "--prompt",
            "spread",
            "--count",
            "6",
            "--address",
            "auto",
            "--detach",
            "--json",
        )
        assert batch.returncode == 0, batch.stderr
        batch_id = json.loads(batch.stdout)["batch_id"]
        assert run("jobs", "wait", batch_id, "--timeout", "120").returncode == 0
        jobs = json.loads(run("jobs", "list", "--batch", batch_id, "--json").stdout)["jobs"]
        assert len(jobs) == 6 and all(j["status"] == "completed" for j in jobs)
        assert len({j["host"] for j in jobs}) == 3  # 6 clones over 3 CPUs -> 3 hosts of 2 clones
        assert len({j["node"] for j in jobs}) == 3, jobs
    finally:
        run("cluster", "down")
