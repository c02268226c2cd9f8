"""A persistent local Ray cluster on this machine: ``clonefleet cluster up|down|status``.

``up`` starts a small daemon process (``_daemon.py``) that holds a head node and ``nodes - 1``
worker nodes on 127.0.0.1, writes a fresh token file (mode 0600) and records the address in a
state file, where later invocations find it; ``down`` asks the daemon to stop its nodes and
removes the token. This module does not import Ray. See docs/cluster.md, "A persistent local
cluster" and "Token authentication".
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clonefleet.errors import ClusterError, UsageError

__all__ = [
    "cluster_down",
    "cluster_up",
    "dead_daemon_state",
    "end_session",
    "local_token_path",
    "pid_alive",
    "private_ray_temp_dir",
    "prune_ray_sessions",
    "read_state",
    "resolve_address",
    "session_pids",
    "state_path",
    "token_path",
]


def _state_dir() -> Path:
    base = os.environ.get("CLONEFLEET_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "clonefleet"
    )
    return Path(base)


def state_dir() -> Path:
    """The folder of the recorded cluster, its token and the scheduler's journal
    (``$CLONEFLEET_STATE_DIR`` overrides)."""
    return _state_dir()


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


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which still answers ``kill(pid, 0)``, does not)."""
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


def _recorded() -> dict[str, Any] | None:
    try:
        state = json.loads(state_path().read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _daemon_pid(state: dict[str, Any]) -> int:
    try:
        return int(state.get("pid", 0))
    except (TypeError, ValueError):
        return 0


def read_state() -> dict[str, Any] | None:
    """The recorded cluster, or ``None`` when none is running.

    The record of a daemon that died (killed, say) stays until ``cluster down`` (or the next
    ``cluster up``) has ended what is left of its session: :func:`dead_daemon_state` reads it.
    """
    state = _recorded()
    return state if state is not None and pid_alive(_daemon_pid(state)) else None


def dead_daemon_state() -> dict[str, Any] | None:
    """The record of a cluster whose daemon is no longer running, or ``None``."""
    state = _recorded()
    return state if state is not None and not pid_alive(_daemon_pid(state)) else None


MAX_RAY_FOLDER_CHARS = 38
"""The longest Ray folder whose sockets Ray can still make: a Unix socket's path holds at most 107
bytes, and Ray adds up to about 69 (``/session_<date>_<time>_<pid>/sockets/plasma_store.N``)."""


def private_ray_temp_dir() -> Path:
    """Ray's temporary folder for the instances clonefleet starts (embedded and ``cluster up``).

    Ray makes its temporary folder, each session folder and its log files readable (and the
    folders writable) by every user, and puts its sockets there; the folder clonefleet gives it
    sits inside ``clonefleet-UID`` in the system's temporary folder, which only this user may
    enter (mode 0700), so other users reach neither the logs nor the sockets. When that name is
    taken by something this user does not own, a fresh private folder is used instead. When the
    temporary folder's path is too long for Ray's socket paths (:data:`MAX_RAY_FOLDER_CHARS`),
    ``/tmp`` is used instead of it.
    """
    system = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    if len(os.path.join(system, f"clonefleet-{os.getuid()}", "ray")) > MAX_RAY_FOLDER_CHARS:
        system = "/tmp" if os.path.isdir("/tmp") else system
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


KEEP_RAY_SESSIONS = 20
"""Session folders of ended Ray instances kept in :func:`private_ray_temp_dir` (the newest)."""


def prune_ray_sessions(folder: Path, keep: int = KEEP_RAY_SESSIONS) -> int:
    """Remove the session folders (logs, sockets) that Ray instances started by clonefleet left
    in ``folder`` beyond the ``keep`` newest; returns how many went.

    Ray never removes them: each embedded run left about 0.7 MB, and 800 runs 600 MB. A folder
    is kept while the process that started it (the number ending its name) is alive, and so is
    the one ``session_latest`` points to.
    """
    try:
        sessions = sorted(
            (e for e in folder.iterdir() if e.name.startswith("session_2") and not e.is_symlink()),
            key=lambda e: e.name,  # the name starts with the start time: newest last
        )
        latest = (folder / "session_latest").resolve()
    except OSError:
        return 0
    removed = 0
    for old in sessions[: max(len(sessions) - keep, 0)]:
        pid = old.name.rpartition("_")[2]
        if old == latest or not pid.isdigit() or pid_alive(int(pid)):
            continue
        shutil.rmtree(old, ignore_errors=True)
        removed += 1
    return removed


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
    """Turn ``--address`` into what Ray takes (``None``: an embedded instance).

    ``auto`` (given, or in ``RAY_ADDRESS``) means the cluster ``clonefleet cluster up``
    recorded and nothing else: never Ray's own search for any Ray instance on the machine, which
    would join whatever it finds (another user's embedded run). The recorded cluster's GCS port
    must answer a TCP connect on 127.0.0.1 within about a second.

    Raises:
        ClusterError: ``auto`` with no recorded cluster, or the recorded cluster's GCS port does
            not answer (the message names ``clonefleet cluster up``).
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address != "auto":
        if address:
            state = read_state()
            if state and state.get("address") == address:
                _check_gcs_answers(address)
        return address
    state = read_state()
    if not state or not state.get("ready"):
        raise _no_cluster_error(state)
    address = str(state["address"])
    _check_gcs_answers(address)
    return address


def _no_cluster_error(state: dict[str, Any] | None) -> ClusterError:
    if state is None and (dead := dead_daemon_state()) is not None:
        return ClusterError(
            f"the clonefleet cluster's daemon (pid {_daemon_pid(dead)}) is no longer running: "
            "`clonefleet cluster down` ends what is left of it, then `clonefleet cluster up` "
            "starts a fresh one"
        )
    now = "is still starting" if state else "is running"
    return ClusterError(
        f"no clonefleet cluster {now}, and `--address auto` means only the cluster "
        "`clonefleet cluster up` starts: run `clonefleet cluster up` first (or pass the "
        "address of another cluster)"
    )


GCS_PROBE_TIMEOUT_S = 1.0
"""How long the recorded cluster's GCS port gets to accept a TCP connection."""


def _check_gcs_answers(address: str, timeout_s: float = GCS_PROBE_TIMEOUT_S) -> None:
    """Fail fast when the recorded cluster's GCS port does not accept a connection (``ray.init``
    would retry for about 20 s before giving up)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "timed out"
    raise ClusterError(
        f"the clonefleet cluster recorded at {address} does not answer ({why}); its daemon may "
        "be stuck: `clonefleet cluster down` then `clonefleet cluster up` starts a fresh one"
    )


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
    if dead_daemon_state() is not None:
        cluster_down()  # what a killed daemon left (its agents hold ports), record and token
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
    try:
        return _wait_until_ready(proc, token, log, timeout_s)
    except KeyboardInterrupt:  # a signal: the cluster being started goes as well
        end_session(proc.pid, grace_s=0.0)
        state_path().unlink(missing_ok=True)
        token.unlink(missing_ok=True)
        raise


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


DOWN_TIMEOUT_S = 3.0
"""How long ``cluster down`` lets the daemon stop its nodes before it kills them itself."""


def cluster_down(
    timeout_s: float = DOWN_TIMEOUT_S, *, announce: Callable[[int | None], None] | None = None
) -> bool:
    """Stop the recorded cluster within a few seconds; ``False`` when none was recorded.

    The daemon gets ``timeout_s`` to stop its nodes (it ends their processes itself, without
    Ray's graceful waits); then every process still in its session (nodes, the scheduler, clone
    hosts) is killed. A daemon that died (killed) left its session behind (Ray's agents live on
    for a minute or more): it is ended the same way, and the record and token go.

    Args:
        timeout_s: how long the daemon gets before its processes are killed.
        announce: called, before anything stops, with how many jobs are running and end with
            the cluster (``None`` when that is not known).
    """
    state = _recorded()
    if state is None:
        return False
    pid = _daemon_pid(state)
    # Else the daemon is gone and its pid belongs to another program.
    ours = pid > 0 and _is_daemon(pid)
    if ours:
        if announce is not None:
            announce(_running_jobs_hint(state))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        _wait_gone([pid], timeout_s)
        end_session(pid, grace_s=0.0)
    state_path().unlink(missing_ok=True)
    token = state.get("auth_token_path")
    if token:
        Path(str(token)).unlink(missing_ok=True)
    return ours


def _is_daemon(pid: int) -> bool:
    """Whether ``pid`` runs clonefleet's cluster daemon (assumed where ``/proc`` cannot say): a
    recorded pid that the system gave to another program since is never signalled."""
    if not pid_alive(pid):
        return True  # it died (a zombie not yet reaped, even): its pid is nobody else's yet
    try:
        return b"clonefleet.cluster._daemon" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists() or not pid_alive(pid)
    except OSError:
        return True


def _running_jobs_hint(state: dict[str, Any]) -> int | None:
    """How many jobs of the cluster ``state`` records are running, or ``None`` when unknown.

    Asking the scheduler would mean a Ray connection (seconds) in a command that has to finish
    in a few; the count is meant to come from the scheduler's journal on disk instead.
    """
    return None


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (on Linux, from ``/proc``; elsewhere none)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            # The command name (field 2) may hold spaces and parentheses: count from its end.
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def end_session(sid: int, *, grace_s: float, kill_wait_s: float = 1.0) -> None:
    """End every process of session ``sid`` but the caller: SIGTERM, ``grace_s`` to exit, then
    SIGKILL. Ray's workers start their own process groups but stay in the session, so this
    reaches the scheduler and clone hosts as well as the node processes."""
    pids = [p for p in session_pids(sid) if p != os.getpid()]
    if grace_s > 0:
        _signal_all(pids, signal.SIGTERM)
        pids = _wait_gone(pids, grace_s)
    _signal_all(pids, signal.SIGKILL)
    if sid != os.getpid() and not Path("/proc/self/stat").exists():
        # No /proc to list the session: at least the process group. (With /proc, never: once
        # the session is empty its number may belong to another program's group.)
        with contextlib.suppress(OSError):
            os.killpg(sid, signal.SIGKILL)
    _wait_gone(pids, kill_wait_s)


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` is alive; the ones still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if not _reaped(p) and pid_alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def _reaped(pid: int) -> bool:
    """Reap ``pid`` when it is an exited child of ours (only that one: a caller's other children
    keep their exit status)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False
