"""A batch that needs more clone hosts than the cluster holds grows it through Ray's autoscaler,
and the cluster shrinks back once the batch is done.

The cluster is Ray's own fake multi-node autoscaler (``fake_multinode`` in Ray's autoscaler
package): a head started with ``ray start --head --autoscaling-config``, whose autoscaler starts
and stops worker nodes as processes on this machine. (Autoscaler v1: Ray's wheel lacks the fake provider's
``example.yaml`` that v2 reads its defaults from.) Everything is on 127.0.0.1, with token
authentication, in a session of its own that the test ends (and a folder it removes), also on
failure. The batch runs in a driver subprocess, which also watches the nodes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from clonefleet.cluster._local import end_session

pytestmark = pytest.mark.timeout(420)

WORKER = "ray.worker.small"
COUNT = 8
"""Clones of the batch: 2 per host makes 4 hosts; the head (1 CPU) holds one that asks for a
CPU and the warm host (which asks for nothing), so two must wait for new nodes."""
IDLE_TIMEOUT_MIN = 0.1
"""The autoscaler's idle timeout: a worker node without work goes after 6 s."""

DRIVER = r"""
import json, sys, time
import ray
from clonefleet import Fleet
from clonefleet.config import Config

address, count, worker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config = Config(cluster={"max_clones_per_host": 2, "host_wait_s": 240})
deadline = time.monotonic() + 90
while True:
    try:
        fleet = Fleet(address=address, config=config, ship_package=False)
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)

def workers():
    # Every node but the head (the fake provider's nodes inherit the head's node-group label).
    head = "f" * 51 + "00000"
    return sum(1 for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)

out = {"before": workers()}
began = time.monotonic()
from clonefleet.providers import SimScript
# Each clone's one model call takes 12 s: the head's hosts are still busy when the new nodes come.
script = SimScript.from_data({"default": [{"text": "done", "latency_ms": 12000}]})
batch = fleet.spawn("general-purpose", "grow", count=count, sim_script=script)
most, grown_s = 0, None
deadline = began + 240
while time.monotonic() < deadline:
    now = workers()
    if now > most:
        most, grown_s = now, time.monotonic() - began
    if fleet.remaining([batch.batch_id]) == 0:
        break
    time.sleep(0.2)
out["done_s"] = time.monotonic() - began
out["most"], out["grown_s"] = most, grown_s
listing = fleet.list_jobs(batch=batch.batch_id)
out["jobs"] = [
    {"status": j["status"], "node": j.get("node"), "host": j.get("host"), "detail": j.get("detail")}
    for j in listing["jobs"]
]
page = fleet.events(batch.batch_id, level="lifecycle", limit=5000)
out["pending_events"] = sum('"host_pending"' in json.dumps(e) for e in page["events"])
ended = time.monotonic()
deadline = ended + 120
while time.monotonic() < deadline and workers() > 0:
    time.sleep(0.2)
out["shrunk_s"] = time.monotonic() - ended if workers() == 0 else None
out["after"] = workers()
from clonefleet.cluster import NAMESPACE, SCHEDULER_NAME
health = ray.get(ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE).health.remote(), timeout=30)
out["health"] = {k: health[k] for k in ("autoscaled", "hosts_given_up")}
print("RESULT " + json.dumps(out), flush=True)
fleet.close()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _autoscaling_config(port: int) -> dict[str, object]:
    return {
        "cluster_name": "clonefleet-fake",
        "max_workers": 3,
        "upscaling_speed": 10.0,
        "idle_timeout_minutes": IDLE_TIMEOUT_MIN,
        "docker": {},
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": f"127.0.0.1:{port}",
        },
        "auth": {},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            WORKER: {
                "resources": {"CPU": 1},
                "node_config": {},
                "min_workers": 0,
                "max_workers": 3,
            },
        },
        "head_node_type": "ray.head.default",
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def test_a_batch_grows_the_cluster_and_it_shrinks_after(tmp_path: Path):
    folder = Path(tempfile.mkdtemp(prefix="cf-as-", dir="/tmp"))  # short: Ray's socket paths
    port = _free_port()
    token = folder / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    config = folder / "autoscaling.json"
    config.write_text(json.dumps(_autoscaling_config(port)))
    env = {
        **os.environ,
        "RAY_FAKE_CLUSTER": "1",
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # 127.0.0.1 (the fake nodes are not `ray start`)
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_TMPDIR": str(folder),
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        # As the cluster launcher does for its head: the node carries its node type's label.
        "RAY_NODE_TYPE_NAME": "ray.head.default",
        "CLONEFLEET_STATE_DIR": str(tmp_path / "state"),
    }
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        env.pop(name, None)
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head_cmd = [
        ray_cli,
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        f"--autoscaling-config={config}",
        "--num-cpus=1",
        "--include-dashboard=false",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--disable-usage-stats",
        f"--temp-dir={folder / 'ray'}",
    ]
    log = (tmp_path / "head.log").open("wb")
    head = subprocess.Popen(
        head_cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, f"127.0.0.1:{port}", str(COUNT), WORKER],
            cwd=tmp_path,
            env={k: v for k, v in env.items() if k != "RAY_NODE_TYPE_NAME"},
            capture_output=True,
            text=True,
            timeout=380,
        )
        lines = [line for line in driver.stdout.splitlines() if line.startswith("RESULT ")]
        assert driver.returncode == 0 and lines, driver.stderr[-3000:] + driver.stdout[-2000:]
        out = json.loads(lines[-1].removeprefix("RESULT "))
        print(json.dumps(out))  # noqa: T201 (the figures, with -s)
        assert out["before"] == 0
        assert [j["status"] for j in out["jobs"]] == ["completed"] * COUNT, out
        # Two hosts waited for a node each (a third node, should the autoscaler have counted a
        # host the head then took, would run nothing).
        assert 2 <= out["most"] <= 3, out
        assert len({j["node"] for j in out["jobs"]}) == 3, out  # the head and both new nodes
        assert out["pending_events"] >= 1 or out["grown_s"] < 5, out
        assert out["health"] == {"autoscaled": True, "hosts_given_up": 0}, out
        assert out["after"] == 0 and out["shrunk_s"] is not None, out  # idle nodes went
    finally:
        end_session(head.pid, grace_s=0.5)
        head.wait(timeout=10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


FIXED = r"""
import json, sys, time
import ray
from clonefleet import Fleet
from clonefleet.cluster import NAMESPACE, SCHEDULER_NAME
from clonefleet.config import Config

# 10 s: time for a placed host's process to start on a busy machine, not for a node to come.
config = Config(cluster={"autoscale": "on", "max_clones_per_host": 1, "host_wait_s": 10})
fleet = Fleet(config=config, num_cpus=2)  # embedded: a fixed cluster of one node, 2 CPUs
began = time.monotonic()
from clonefleet.providers import SimScript
# 12 s a clone: the hosts that got the CPUs hold them past the other hosts' 10 s of waiting.
script = SimScript.from_data({"default": [{"text": "done", "latency_ms": 12000}]})
batch = fleet.spawn("general-purpose", "fixed", count=6, sim_script=script)
while fleet.remaining([batch.batch_id]) and time.monotonic() - began < 90:
    time.sleep(0.05)
out = {"done_s": time.monotonic() - began}
out["jobs"] = [
    {"status": j["status"], "host": j.get("host")}
    for j in fleet.list_jobs(batch=batch.batch_id)["jobs"]
]
health = ray.get(ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE).health.remote(), timeout=30)
out["given_up"] = health["hosts_given_up"]
print("RESULT " + json.dumps(out), flush=True)
fleet.close()
"""


def test_on_a_cluster_that_cannot_grow_hosts_are_given_up_and_the_batch_still_runs(tmp_path):
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "CLONEFLEET_STATE_DIR": str(tmp_path / "state"),
    }
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.run(
        [sys.executable, "-c", FIXED],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    lines = [line for line in driver.stdout.splitlines() if line.startswith("RESULT ")]
    assert driver.returncode == 0 and lines, driver.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    print(json.dumps(out))  # noqa: T201 (the figures, with -s)
    assert [j["status"] for j in out["jobs"]] == ["completed"] * 6, out
    # 6 hosts of 1 wanted: 2 warm ones (asking for nothing) and 4 asking for a CPU, of which
    # the 2 CPUs hold 2; the other 2 were given up after 10 s and their clones packed.
    assert out["given_up"] == 2, out
    assert len({j["host"] for j in out["jobs"]}) == 4, out
    assert 12 <= out["done_s"] < 90, out
