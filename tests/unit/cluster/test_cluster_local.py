"""Finding and stopping the recorded local cluster, without Ray.

``--address auto`` means the cluster ``clonefleet cluster up`` recorded or a fast failure (never
Ray's own search); ``cluster down`` ends every process of the daemon's session within seconds,
whether the daemon cooperates or not. The end-to-end checks are in
``tests/ray/test_cluster_client.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clonefleet.cluster import _local
from clonefleet.errors import ClusterError

pytestmark = pytest.mark.timeout(20)
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


@pytest.fixture(autouse=True)
def state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("CLONEFLEET_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _record(address: str, pid: int | None = None, ready: bool = True) -> None:
    _local._write_token(_local.token_path())
    record = {
        "address": address,
        "pid": pid or os.getpid(),
        "auth_token_path": str(_local.token_path()),
        "ready": ready,
    }
    _local.state_path().write_text(json.dumps(record))


@pytest.fixture
def gcs() -> Iterator[str]:
    """A listening port on 127.0.0.1 standing in for a GCS; yields its address."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


def _closed_port() -> str:
    with socket.create_server(("127.0.0.1", 0)) as server:
        return f"127.0.0.1:{server.getsockname()[1]}"  # nothing listens once it closes


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_auto_without_a_cluster_fails_at_once_naming_cluster_up(monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("RAY_ADDRESS", "auto")
    started = time.monotonic()
    with pytest.raises(ClusterError, match="`clonefleet cluster up`"):
        _local.resolve_address("auto" if how == "argument" else None)
    assert time.monotonic() - started < 0.5


def test_auto_is_the_recorded_cluster(gcs):
    _record(gcs)
    assert _local.resolve_address("auto") == gcs


def test_auto_with_a_dead_daemons_record_fails_naming_cluster_down_and_keeps_the_record(state):
    _record("127.0.0.1:6390", pid=2**22 + 1)  # no such process
    with pytest.raises(ClusterError, match=r"no longer running: `clonefleet cluster down`"):
        _local.resolve_address("auto")
    # Kept for `cluster down`, which ends what the daemon left (its session's pid is in it).
    assert (state / "cluster.json").exists() and (state / "auth_token").exists()
    assert _local.read_state() is None and _local.dead_daemon_state() is not None
    assert _local.cluster_down() is True
    assert not (state / "cluster.json").exists() and not (state / "auth_token").exists()


def test_auto_with_a_cluster_still_starting_fails(gcs):
    _record(gcs, ready=False)
    with pytest.raises(ClusterError, match="`clonefleet cluster up`"):
        _local.resolve_address("auto")


def test_a_recorded_cluster_whose_gcs_does_not_answer_fails_within_a_second_or_so():
    address = _closed_port()
    _record(address)
    started = time.monotonic()
    with pytest.raises(ClusterError, match=f"recorded at {address} does not answer"):
        _local.resolve_address("auto")
    with pytest.raises(ClusterError, match="does not answer"):
        _local.resolve_address(address)  # its address given explicitly: checked the same way
    assert time.monotonic() - started < 2 * _local.GCS_PROBE_TIMEOUT_S + 0.5


def test_other_addresses_pass_through_unchecked(monkeypatch):
    assert _local.resolve_address(None) is None  # embedded
    assert _local.resolve_address("ray://10.0.0.5:10001") == "ray://10.0.0.5:10001"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert _local.resolve_address(None) == "127.0.0.1:1"


_FAKE_DAEMON = """
import os, signal, subprocess, sys, time
from pathlib import Path
cooperative = sys.argv[2] == "cooperative"
child = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]
kids = [subprocess.Popen(child), subprocess.Popen(child, start_new_session=False)]
if cooperative:
    from clonefleet.cluster._local import end_session
    def stop(*_):
        end_session(os.getpid(), grace_s=0.3)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
Path(sys.argv[1]).write_text(" ".join(str(k.pid) for k in kids))
time.sleep(60)
"""


def _start_fake_daemon(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A stand-in daemon in a session of its own with two children that ignore SIGTERM."""
    ready = tmp_path / "kids"
    marker = "clonefleet.cluster._daemon"  # what `cluster down` checks the recorded pid runs
    proc = subprocess.Popen(
        [sys.executable, "-c", _FAKE_DAEMON, str(ready), mode, marker], start_new_session=True
    )
    deadline = time.monotonic() + 15
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "fake daemon did not start"
        time.sleep(0.02)
    return proc, [int(p) for p in ready.read_text().split()]


@needs_proc
@pytest.mark.parametrize("mode", ["cooperative", "stuck"])
def test_cluster_down_ends_every_process_of_the_daemons_session_quickly(tmp_path, state, mode):
    proc, kids = _start_fake_daemon(tmp_path, mode)
    _record("127.0.0.1:6390", pid=proc.pid)
    assert sorted(_local.session_pids(proc.pid)) == sorted([proc.pid, *kids])
    announced: list[int | None] = []
    started = time.monotonic()
    try:
        assert _local.cluster_down(timeout_s=1.0, announce=announced.append) is True
        took = time.monotonic() - started
    finally:
        _local.end_session(proc.pid, grace_s=0.0)
    assert took < 3.0
    assert proc.poll() is not None
    assert _local.session_pids(proc.pid) == [] and not any(_local.pid_alive(k) for k in kids)
    assert announced == [None]  # not known without asking the scheduler
    assert not (state / "cluster.json").exists() and not (state / "auth_token").exists()
    assert _local.cluster_down() is False


@needs_proc
@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_cluster_down_after_the_daemon_was_killed_ends_what_its_session_left(
    tmp_path, state, reaped
):
    proc, kids = _start_fake_daemon(tmp_path, "stuck")
    _record("127.0.0.1:6390", pid=proc.pid)
    try:
        proc.kill()
        if reaped:
            proc.wait(timeout=10)
        else:  # dead, not yet reaped by its parent (it has no cmdline left to check)
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        # Its children (Ray's agents, in a real cluster) live on in the daemon's session.
        assert sorted(_local.session_pids(proc.pid)) == sorted(kids)
        assert _local.read_state() is None
        assert _local.dead_daemon_state() == json.loads((state / "cluster.json").read_text())
        started = time.monotonic()
        assert _local.cluster_down(timeout_s=1.0) is True
        assert time.monotonic() - started < 3.0
    finally:
        _local.end_session(proc.pid, grace_s=0.0)
        proc.wait(timeout=10)
    assert _local.session_pids(proc.pid) == [] and not any(_local.pid_alive(k) for k in kids)
    assert not (state / "cluster.json").exists() and not (state / "auth_token").exists()


@needs_proc
def test_cluster_down_never_signals_a_recorded_pid_that_another_program_has_now(state):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _record("127.0.0.1:6390", pid=other.pid)  # the daemon died and its pid was reused
        announced: list[int | None] = []
        assert _local.cluster_down(timeout_s=0.2, announce=announced.append) is False
        assert other.poll() is None and announced == []
        assert not (state / "cluster.json").exists()
    finally:
        other.kill()
        other.wait()


def test_cluster_down_with_nothing_recorded_touches_nothing():
    called: list[int | None] = []
    assert _local.cluster_down(announce=called.append) is False
    assert called == []


def test_the_daemon_stops_its_nodes_without_rays_graceful_waits():
    from clonefleet.cluster import _daemon

    assert _daemon.STOP_GRACE_S <= 1.0
    assert _local.DOWN_TIMEOUT_S + _daemon.STOP_GRACE_S < 5.0


def test_old_ray_session_folders_are_pruned_but_never_a_live_or_the_latest_one(tmp_path):
    dead = subprocess.Popen(["true"])  # an ended process: its pid is not alive
    dead.wait()
    gone = dead.pid
    names = [f"session_2026-11-{d:02d}_10-00-00_000000_{gone}" for d in range(1, 11)]
    alive = f"session_2026-10-01_10-00-00_000000_{os.getpid()}"  # oldest, but still running
    odd = "session_2026-10-02_10-00-00_000000_notapid"
    for name in [*names, alive, odd]:
        (tmp_path / name / "logs").mkdir(parents=True)
        (tmp_path / name / "logs" / "raylet.out").write_text("log")
    (tmp_path / "session_latest").symlink_to(tmp_path / names[2])
    (tmp_path / "unrelated").mkdir()
    assert _local.prune_ray_sessions(tmp_path, keep=3) == 6  # names[0, 1, 3..6]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([alive, odd, names[2], *names[-3:], "session_latest", "unrelated"])
    assert _local.prune_ray_sessions(tmp_path, keep=3) == 0  # nothing more to do
    assert _local.prune_ray_sessions(tmp_path / "missing") == 0
