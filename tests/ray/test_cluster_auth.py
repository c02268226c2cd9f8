"""Token authentication of `clonefleet cluster up` and of an embedded run.

One two-node cluster for the module, started in a temporary HOME and state folder. A client
without the cluster's token, or with another, is refused by Ray itself; clonefleet's own commands
find the token; no listener of the cluster or of an embedded instance hands out the session's log
listing (`GET /logs/`) without the token; an embedded run leaves no token file readable by others.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(240)

# A client that connects, runs one task and reports the HTTP port of each node's dashboard agent.
# A node reports its agent's port once the agent is up (-1 before): wait for every one, bounded.
CLIENT = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
value = ray.get(ray.remote(lambda: 42).remote(), timeout=60)
deadline = time.monotonic() + 60
while True:
    ports = [n["DashboardAgentListenPort"] for n in ray.nodes() if n["Alive"]]
    if all(p > 0 for p in ports) or time.monotonic() > deadline:
        break
    time.sleep(0.05)
session = ray._private.worker._global_node.get_session_dir_path()
print(json.dumps({"task": value, "agent_ports": ports, "session_dir": session}))
"""

# An embedded session (what `clonefleet run` without --address starts) that reports what it sees.
EMBEDDED = """
import json, os, urllib.error, urllib.request
from clonefleet.cluster import ClusterConfig, ClusterSession

session = ClusterSession(ClusterConfig(num_cpus=1)).start()
import ray
from ray._private import worker

value = ray.get(ray.remote(lambda: 42).remote(), timeout=60)
# -1 when the agent found its port taken (by another Ray on the machine): it then serves no HTTP.
port = ray.nodes()[0]["DashboardAgentListenPort"]
status = None
if port > 0:
    try:
        status = urllib.request.urlopen(f"http://127.0.0.1:{port}/logs/", timeout=10).status
    except urllib.error.HTTPError as exc:
        status = exc.code
print(json.dumps({
    "task": value,
    "agent_port": port,
    "logs_status": status,
    "during": sorted(k for k in os.environ if k.startswith("RAY_AUTH")),
    "session_dir": worker._global_node.get_session_dir_path(),
    "token": os.environ["RAY_AUTH_TOKEN"],
}), flush=True)
input()  # the test probes every listener of this process's instance, then lets it stop
session.stop()
print(json.dumps({"after": sorted(k for k in os.environ if k.startswith("RAY_AUTH"))}))
"""


def _environment(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "CLONEFLEET_STATE_DIR", "XDG_"))
    }
    env.update(
        HOME=str(home),
        XDG_STATE_HOME=str(home / "state"),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
    )
    env.update(extra)
    return env


def _clonefleet(
    *args: str, env: Mapping[str, str], cwd: Path, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clonefleet", *args],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _client(address: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLIENT, address],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _get(port: int, token: str | None) -> tuple[int, str]:
    """``GET /logs/`` on 127.0.0.1:port, with ``Authorization: Bearer token`` when given."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/logs/", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _listening_ports(pids: set[int]) -> set[int]:
    """TCP ports in LISTEN state held by any of ``pids``."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _raw_logs_request(port: int) -> bytes:
    """What a listener answers to a bare ``GET /logs/`` (b"" when it answers nothing HTTP)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.settimeout(2)
        conn.sendall(b"GET /logs/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        chunks: list[bytes] = []
        with contextlib.suppress(OSError):
            while sum(map(len, chunks)) < 1 << 16:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    return b"".join(chunks)


def _assert_no_listener_lists_logs(pids: set[int]) -> set[int]:
    """Send ``GET /logs/`` without a token to every listener of ``pids``: none may answer with
    a log listing. (Ray's Prometheus metrics servers answer any path with metrics, unprotected;
    the gRPC servers answer no HTTP/1 at all.)"""
    ports = _listening_ports(pids)
    assert ports, "found no listener to probe"
    for port in ports:
        answer = _raw_logs_request(port)
        for sign in (b"Index of", b'href="/logs', b"raylet.out", b"gcs_server.out"):
            assert sign not in answer, (port, answer[:300])
    return ports


def _assert_private_and_tokenless(session_dir: str, token: str) -> None:
    """Ray's session folder (logs, sockets) sits in a folder only this user may enter, and the
    token is written in none of its files."""
    private = Path(session_dir).parent.parent
    assert private.name == f"clonefleet-{os.getuid()}"
    info = private.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    assert stat.S_IMODE(info.st_mode) == 0o700
    for path in Path(session_dir).rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 1 << 24:
            assert token.encode() not in path.read_bytes(), path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("work")
    env = _environment(home)
    up = _clonefleet(
        "cluster", "up", "--nodes", "2", "--cpus-per-node", "1", "--json", env=env, cwd=work
    )
    state = json.loads(up.stdout) if up.returncode == 0 else {}
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield {"state": state, "home": home, "work": work, "env": env}
    finally:
        _clonefleet("cluster", "down", env=env, cwd=work, timeout=90)
        pid = int(state.get("pid", 0))
        if pid:  # whatever `down` left of the daemon's process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def authorized(cluster: dict[str, Any]) -> dict[str, Any]:
    """A raw Ray client given the cluster's token file, as `docs/cluster.md` says."""
    state = cluster["state"]
    env = _environment(
        cluster["home"], RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=state["auth_token_path"]
    )
    ok = _client(state["address"], env)
    assert ok.returncode == 0, ok.stderr[-3000:]
    return dict(json.loads(ok.stdout.splitlines()[-1]))


def test_cluster_up_writes_a_token_only_its_owner_can_read(cluster):
    state, home = cluster["state"], cluster["home"]
    assert state["auth"] == "token"
    token = Path(state["auth_token_path"])
    assert token == home / "state" / "clonefleet" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert re.fullmatch(r"[0-9a-f]{64}", token.read_text())
    assert not (home / ".ray").exists()  # Ray's world-readable default file is never made


def test_the_clusters_logs_and_sockets_are_private_and_hold_no_token(cluster, authorized):
    token = Path(cluster["state"]["auth_token_path"]).read_text()
    _assert_private_and_tokenless(authorized["session_dir"], token)


def test_a_client_without_the_token_or_with_another_is_refused(cluster, authorized):
    state, home = cluster["state"], cluster["home"]
    assert authorized["task"] == 42  # the cluster is up and serves a client with its token
    # Refused clients give up after 3 s instead of Ray's default 20 s of retries.
    quick = {"RAY_gcs_server_port_wait_time_s": "3"}
    without = _environment(home, **quick)
    wrong = _environment(home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64, **quick)
    for env in (without, wrong):
        refused = _client(state["address"], env)
        assert refused.returncode != 0 and '"task"' not in refused.stdout
        assert "InvalidAuthToken" in refused.stderr, refused.stderr[-3000:]


def test_clonefleet_commands_find_the_token_and_others_are_refused(cluster):
    env, work, state = cluster["env"], cluster["work"], cluster["state"]
    run = _clonefleet(
        "run",
        "general-purpose",
        "--prompt",
        "hello",
        "--detach",
        "--address",
        "auto",
        "--json",
        env=env,
        cwd=work,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    batch = json.loads(run.stdout)["batch_id"]
    waited = _clonefleet("jobs", "wait", batch, "--timeout", "60", env=env, cwd=work)
    assert waited.returncode == 0, waited.stderr[-3000:]
    events = _clonefleet("events", batch, "--json", env=env, cwd=work)
    assert events.returncode == 0, events.stderr[-3000:]
    assert [json.loads(line)["event"]["type"] for line in events.stdout.splitlines()].count(
        "result"
    ) == 1

    # Another user's view: the address, but not the token (another state folder, no ~/.ray).
    stranger = _environment(
        cluster["home"] / "elsewhere",
        CLONEFLEET_STATE_DIR=str(cluster["home"] / "elsewhere-state"),
        RAY_gcs_server_port_wait_time_s="3",
    )
    listing = _clonefleet(
        "jobs", "list", "--address", state["address"], "--json", env=stranger, cwd=work
    )
    assert listing.returncode == 1 and not listing.stdout
    assert "token" in listing.stderr, listing.stderr[-3000:]


def test_no_listener_of_the_cluster_lists_logs_without_the_token(cluster, authorized):
    token = Path(cluster["state"]["auth_token_path"]).read_text()
    ports = authorized["agent_ports"]
    assert len(ports) == 2  # one dashboard agent per node
    for port in ports:
        assert _get(port, None)[0] == 401
        assert _get(port, "0" * 64)[0] == 403
        status, body = _get(port, token)  # the same request with the token: the listing
        assert status == 200 and "Index of" in body
    probed = _assert_no_listener_lists_logs(_descendants(int(cluster["state"]["pid"])))
    assert set(ports) <= probed


@pytest.mark.timeout(150)
def test_an_embedded_session_makes_no_token_file_and_refuses_the_log_listing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with subprocess.Popen(
        [sys.executable, "-c", EMBEDDED],
        env=_environment(home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            seen = json.loads(proc.stdout.readline() or "{}")
            assert seen.get("task") == 42, proc.stderr.read()[-3000:]
            if seen["agent_port"] > 0:  # the agent's HTTP server: the listing needs the token
                assert seen["logs_status"] == 401
            assert seen["during"] == ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN"]  # a per-run token
            _assert_private_and_tokenless(seen["session_dir"], seen["token"])
            probed = _assert_no_listener_lists_logs(_descendants(proc.pid))
            assert seen["agent_port"] <= 0 or seen["agent_port"] in probed
            out, err = proc.communicate("\n", timeout=60)
            assert proc.returncode == 0, err[-3000:]
            assert json.loads(out.splitlines()[-1]) == {"after": []}  # the caller's env is back
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert not (home / ".ray").exists()
    assert not list(home.rglob("*token*"))


@pytest.mark.timeout(150)
def test_an_embedded_run_leaves_no_token_readable_by_others(tmp_path):
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    env = _environment(home)
    started = time.monotonic()
    out = _clonefleet(
        "run", "general-purpose", "--prompt", "hi", "--json", env=env, cwd=home / "work"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1])["status"] == "completed"
    assert time.monotonic() - started < 140
    assert not (home / ".ray" / "auth_token").exists()
    for path in home.rglob("*"):
        if path.is_file() and "token" in path.name:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
