"""A worker node removed from a 3-node local cluster mid-batch: the clones it hosted restart on
the nodes left, and every job completes exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

NODES = """
import json, sys
from clonefleet.cluster import ClusterConfig, ClusterSession
with ClusterSession(ClusterConfig(address=sys.argv[1])):
    import ray
    print(json.dumps([
        {"id": n["NodeID"], "port": n["NodeManagerPort"], "alive": n["Alive"],
         "head": "node:__internal_head__" in n.get("Resources", {})}
        for n in ray.nodes()
    ]))
"""


def node_pids(node_id: str) -> list[int]:
    """The raylet of node ``node_id`` and every process it started (from /proc): the node."""
    cmds: dict[int, list[bytes]] = {}
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmds[int(proc.name)] = (proc / "cmdline").read_bytes().split(b"\0")
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            parents[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    raylet = next(
        pid
        for pid, cmd in cmds.items()
        if cmd and cmd[0].endswith(b"raylet") and f"--node_id={node_id}".encode() in cmd
    )
    family, grew = {raylet}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in family} - family
        family |= more
        grew = bool(more)
    return sorted(family)


def test_a_worker_node_removed_mid_batch_its_clones_finish_on_the_others(cli, tmp_path):
    run, work = cli
    env = {
        **os.environ,
        "CLONEFLEET_STATE_DIR": str(tmp_path / "state"),  # the `cli` fixture's state folder
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    env.pop("RAY_ADDRESS", None)
    up = run("cluster", "up", "--nodes", "3", "--cpus-per-node", "1", "--json", timeout=200)
    assert up.returncode == 0, up.stderr
    address = json.loads(up.stdout)["address"]
    steps = [{"tool": "progress_update", "args": {"summary": f"s{i}"}} for i in range(8)]
    script = work / "slow.yaml"
    script.write_text(json.dumps({"default": [{**s, "latency_ms": 700} for s in steps]}))
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
        "--sim-script",
        str(script),
    )
    assert batch.returncode == 0, batch.stderr
    batch_id = json.loads(batch.stdout)["batch_id"]
    nodes = json.loads(
        subprocess.run(
            [sys.executable, "-c", NODES, address],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    victim = next(n for n in nodes if not n["head"])
    deadline = time.monotonic() + 60
    while True:  # until a clone runs on the victim node
        jobs = json.loads(run("jobs", "list", "--batch", batch_id, "--json").stdout)["jobs"]
        if any(j["node"] == victim["id"] and j["status"] == "running" for j in jobs):
            break
        assert time.monotonic() < deadline, jobs
    for pid in node_pids(victim["id"]):
        os.kill(pid, signal.SIGKILL)
    waited = run("jobs", "wait", batch_id, "--timeout", "150", timeout=200)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    jobs = json.loads(run("jobs", "list", "--batch", batch_id, "--json").stdout)["jobs"]
    assert len(jobs) == 6 and {j["status"] for j in jobs} == {"completed"}, jobs
    moved = [j for j in jobs if j["restarts"]]
    assert moved, "the victim node's clones were restarted"
    assert all(j["node"] != victim["id"] for j in moved)
