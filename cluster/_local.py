"""A persistent local Ray cluster on this machine: ``clonefleet cluster up|down|status``.

``up`` starts a small daemon process that holds a head node and ``nodes - 1`` worker nodes, all
bound to 127.0.0.1 on distinct ports, and records the address in a state file; later
invocations (``run --detach``, ``jobs``, ``events``) find it there. ``down`` asks the daemon to
stop its nodes, and nothing else: other Ray instances on the machine are left alone.

The cluster runs with Ray's token authentication: ``up`` writes a fresh random token to
``auth_token`` next to the state file, readable by its owner only (mode 0600, created that way,
never widened), and every node reads it through ``RAY_AUTH_TOKEN_PATH``. A client without that
token, or with another, is refused by every node's RPC and HTTP servers. ``down`` removes it.

This module does not import Ray; the daemon (``_daemon.py``) does.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ClusterError, UsageError

__all__ = [
    "cluster_down",
    "cluster_up",
    "local_token_path",
    "private_ray_temp_dir",
    "read_state",
    "resolve_address",
    "state_path",
    "token_path",
]


def _state_dir() -> Path:
    base = os.environ.get("CLONEFLEET_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "clonefleet"
    )
    return Path(base)


def state_path() -> Path:
    """Where the running cluster is recorded (``$CLONEFLEET_STATE_DIR`` overrides)."""
    return _state_dir() / "cluster.json"


def token_path() -> Path:
    """Where the running cluster's authentication token is (next to :func:`state_path`)."""
    return _state_dir() / "auth_token"


def _write_token(path: Path) -> None:
    """Write a fresh random token to ``path``, readable and writable by its owner only.

    The file is created with mode 0600 (never briefly wider) under a temporary name and then
    renamed over ``path``, so a reader sees the old token or the new one, never part of one.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secrets.token_hex(32).encode())  # 256 bits, as Ray's own generator
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); its status line tells.
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def read_state() -> dict[str, Any] | None:
    """The recorded cluster, or ``None`` when none is running (a stale record is removed)."""
    path = state_path()
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    if not _alive(int(state.get("pid", 0))):
        path.unlink(missing_ok=True)
        if state.get("auth_token_path"):
            Path(str(state["auth_token_path"])).unlink(missing_ok=True)
        return None
    return state


def private_ray_temp_dir() -> Path:
    """Ray's temporary folder for the instances clonefleet starts (embedded and ``cluster up``).

    Ray makes its temporary folder, each session folder and its log files readable (and the
    folders writable) by every user, and puts its sockets there; the folder clonefleet gives it
    sits inside ``clonefleet-UID`` in the system's temporary folder, which only this user may
    enter (mode 0700), so other users reach neither the logs nor the sockets. When that name is
    taken by something this user does not own, a fresh private folder is used instead.
    """
    system = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    base = Path(system) / f"clonefleet-{os.getuid()}"
    try:
        base.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix="clonefleet-", dir=system)) / "ray"
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return Path(tempfile.mkdtemp(prefix="clonefleet-", dir=system)) / "ray"
    if info.st_mode & 0o077:
        base.chmod(0o700)
    return base / "ray"


def local_token_path(address: str | None) -> Path | None:
    """The token file of the cluster ``up`` started when ``address`` is that cluster's address
    (``None`` for any other address, or when that cluster has no token file)."""
    if not address:
        return None
    state = read_state()
    if not state or state.get("address") != address or not state.get("auth_token_path"):
        return None
    path = Path(str(state["auth_token_path"]))
    return path if path.is_file() else None


def resolve_address(address: str | None) -> str | None:
    """Turn ``--address`` into what Ray takes: ``auto`` prefers the cluster ``up`` started."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address == "auto":
        state = read_state()
        if state and state.get("ready"):
            return str(state["address"])
    return address


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_up(
    *,
    nodes: int = 1,
    cpus_per_node: int | None = None,
    port: int | None = None,
    timeout_s: float = 180.0,
) -> dict[str, Any]:
    """Start the local cluster and wait until every node is up.

    Raises:
        UsageError: one is already running, or ``nodes`` < 1.
        ClusterError: the daemon failed or did not get ready in time (its log is quoted).
    """
    if nodes < 1:
        raise UsageError("--nodes must be at least 1")
    existing = read_state()
    if existing:
        raise UsageError(
            f"a clonefleet cluster is already running at {existing['address']}; `clonefleet cluster down` stops it"
        )
    path = state_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = path.with_name("cluster.log")
    token = token_path()
    _write_token(token)
    cpus = cpus_per_node or max((os.cpu_count() or 2) // nodes, 1)
    cmd = [
        sys.executable,
        "-m",
        "clonefleet.cluster._daemon",
        "--nodes",
        str(nodes),
        "--cpus",
        str(cpus),
        "--port",
        str(port or _free_port()),
        "--state",
        str(path),
        "--auth-token-file",
        str(token),
    ]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return _wait_until_ready(proc, token, log, timeout_s)


def _wait_until_ready(
    proc: subprocess.Popen[bytes], token: Path, log: Path, timeout_s: float
) -> dict[str, Any]:
    """The daemon's state once it says ready; its token goes if it dies or is too slow."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            token.unlink(missing_ok=True)
            raise ClusterError(f"the cluster daemon exited ({proc.returncode}): {_tail(log)}")
        state = read_state()
        if state and state.get("ready"):
            return state
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    token.unlink(missing_ok=True)
    raise ClusterError(f"the cluster did not come up within {timeout_s:g}s: {_tail(log)}")


def _tail(log: Path, n: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def cluster_down(timeout_s: float = 60.0) -> bool:
    """Stop the recorded cluster; ``False`` when none was running."""
    state = read_state()
    if state is None:
        return False
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    state_path().unlink(missing_ok=True)
    token = state.get("auth_token_path")
    if token:
        Path(str(token)).unlink(missing_ok=True)
    return True
