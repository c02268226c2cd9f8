"""Signals at any moment: ``clonefleet run`` says what became of its batch, exits 128 + the
signal's number and leaves no process behind; a killed run or cluster daemon leaves nothing
that ``cluster down`` (or the run's watchdog) does not end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clonefleet.cluster._local import pid_alive, private_ray_temp_dir, session_pids

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]

SLOW = "default: [{text: slow, latency_ms: 120000}]\n"
GONE_WITHIN_S = 5.0
"""How soon after the run ends no process of its session may be left."""


class Run:
    """``clonefleet run`` in a session of its own, its stderr read as it comes."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        script = tmp_path / "slow.yaml"
        script.write_text(SLOW)
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        env["CLONEFLEET_STATE_DIR"] = str(tmp_path / "state")
        env.pop("RAY_ADDRESS", None)
        cmd = [sys.executable, "-m", "clonefleet", "run", "general-purpose", "--prompt", "x"]
        self.proc = subprocess.Popen(
            [*cmd, "--sim-script", str(script), *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, ready: Callable[[], bool], timeout_s: float = 150.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert self.proc.poll() is None, f"the run ended early: {self.stderr[-2000:]}"
            assert time.monotonic() < deadline, f"not ready in time: {self.stderr[-2000:]}"
            time.sleep(0.02)

    def finish(self, timeout_s: float = 60.0) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return rc

    def close(self) -> None:
        """Kill whatever of the run's session is left (after a failed test) and close its pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in session_pids(self.proc.pid):
            os.kill(pid, signal.SIGKILL)
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()

    def left_after(self, within_s: float = GONE_WITHIN_S) -> list[int]:
        """The processes of the run's session still there ``within_s`` after it ended."""
        deadline = time.monotonic() + within_s
        while (left := session_pids(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left


@pytest.fixture
def start_run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def start(*args: str) -> Run:
        runs.append(Run(tmp_path, *args))
        return runs[-1]

    yield start
    for run in runs:
        run.close()


def _ray_started(run: Run) -> bool:
    """Whether Ray's first processes (GCS, raylet) are up in the run's session."""
    for pid in session_pids(run.proc.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"gcs_server" in command or b"raylet" in command:
            return True
    return False


def _agents_in(session: int) -> bool:
    for pid in session_pids(session):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::DashboardAgent"):
                return True
        except OSError:
            continue
    return False


def _assert_own_ending(run: Run, sig: signal.Signals) -> str:
    stderr = run.stderr
    assert f"clonefleet: interrupted ({sig.name})" in stderr, stderr[-2000:]
    assert "*** SIGTERM received" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert run.left_after() == []
    return stderr


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGHUP, True)],
    ids=["SIGTERM", "SIGHUP", "SIGHUP-to-its-group"],  # the group: as a terminal's hangup
)
def test_a_signal_while_ray_starts_ends_the_run_with_its_own_message(start_run, sig, to_group):
    run = start_run("--count", "200")
    run.wait_for(lambda: _ray_started(run))
    if to_group:
        os.killpg(run.proc.pid, sig)
    else:
        run.proc.send_signal(sig)
    started = time.monotonic()
    assert run.finish() == 128 + sig
    assert time.monotonic() - started < 10  # Ray's GCS, killed too, made it wait 30 s
    stderr = _assert_own_ending(run, sig)
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"clonefleet: interrupted ({sig.name}); ")  # one line, its own


def test_sigterm_mid_batch_names_the_cancelled_batch(start_run):
    run = start_run("--count", "4")
    run.wait_for(lambda: "done, running" in run.stderr)  # the batch is under way
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 143
    stderr = _assert_own_ending(run, signal.SIGTERM)
    assert "; batch b_" in stderr and " cancelled: the embedded cluster stopped" in stderr


def test_a_killed_run_leaves_no_ray_process_behind(start_run):
    run = start_run("--count", "4")
    run.wait_for(lambda: "done, running" in run.stderr)
    assert len(session_pids(run.proc.pid)) > 3  # GCS, raylet, agents, workers
    run.proc.kill()  # no clean-up of its own: its watchdog ends what Ray left (the agents)
    run.finish()
    assert run.left_after() == []


def test_status_and_down_after_the_cluster_daemon_was_killed(cli, tmp_path):
    run, _work = cli
    up = run("cluster", "up", "--json")
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    daemon = int(state["pid"])
    deadline = time.monotonic() + 60
    while not _agents_in(daemon):  # the raylet starts them once the node is up
        assert time.monotonic() < deadline, "Ray's agents did not start"
        time.sleep(0.05)
    os.kill(daemon, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _agents_in(daemon)  # they outlive the daemon by a minute or more
    status = run("cluster", "status")
    assert status.returncode == 1
    assert f"daemon (pid {daemon}) died; `clonefleet cluster down` ends" in status.stdout
    down = run("cluster", "down", "--json")
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["stopped"] is True
    assert json.loads(down.stdout)["daemon_had_died"] is True
    assert session_pids(daemon) == []
    assert not (tmp_path / "state" / "cluster.json").exists()
    assert not Path(state["auth_token_path"]).exists()
    assert "no clonefleet cluster is running" in run("cluster", "status").stdout


def test_jobs_wait_during_cluster_down_fails_with_its_own_error_in_time(cli, tmp_path):
    run, work = cli
    up = run("cluster", "up", "--json")
    assert up.returncode == 0, up.stderr
    daemon = json.loads(up.stdout)["pid"]
    (work / "slow.yaml").write_text(SLOW)
    args = ["--sim-script", "slow.yaml", "--detach", "--address", "auto", "--json"]
    detached = run("run", "general-purpose", "--prompt", "x", "--count", "2", *args)
    assert detached.returncode == 0, detached.stderr
    batch = json.loads(detached.stdout)["batch_id"]
    env = {**os.environ, "CLONEFLEET_STATE_DIR": str(tmp_path / "state")}
    env.pop("RAY_ADDRESS", None)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "clonefleet", "jobs", "wait", batch, "--timeout", "120"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Connected once its Ray driver writes its log in the cluster's session folder.
        logs = f"session_*_{daemon}/logs/python-core-driver-*_{waiting.pid}.log"
        deadline = time.monotonic() + 90
        while not any(private_ray_temp_dir().glob(logs)):
            assert waiting.poll() is None, waiting.communicate()
            assert time.monotonic() < deadline, "jobs wait did not connect"
            time.sleep(0.05)
        down = run("cluster", "down")
        assert down.returncode == 0, down.stderr
        ended = time.monotonic()
        # Ray alone retried for 60 s, then ended the process with its own log line.
        stdout, stderr = waiting.communicate(timeout=30)
        took = time.monotonic() - ended
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 1, stderr
    assert "clonefleet: error: the cluster at 127.0.0.1:" in stderr
    assert "cannot be reached" in stderr and "Failed to connect to GCS" not in stderr
    assert took < 15, took


def test_a_signal_while_cluster_up_starts_it_takes_the_cluster_down_too(tmp_path):
    state = tmp_path / "state"
    env = {**os.environ, "CLONEFLEET_STATE_DIR": str(state), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "clonefleet", "cluster", "up"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    daemon: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while not daemon:  # the daemon leads a session of its own; its GCS is up first
            assert up.poll() is None, up.communicate()
            assert time.monotonic() < deadline, "the daemon's GCS did not start"
            daemon = [p for p in _children_running(up.pid, b"cluster._daemon") if _has_gcs(p)]
            time.sleep(0.05)
        up.send_signal(signal.SIGTERM)
        _, stderr = up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        for pid in daemon and session_pids(daemon[0]):
            os.kill(pid, signal.SIGKILL)
    assert up.returncode == 143, stderr
    assert "clonefleet: interrupted (SIGTERM)" in stderr and "Traceback" not in stderr
    assert session_pids(daemon[0]) == []
    assert not (state / "cluster.json").exists() and not (state / "auth_token").exists()


def _children_running(parent: int, marker: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or marker not in (entry / "cmdline").read_bytes():
                continue
            if int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _has_gcs(session: int) -> bool:
    for pid in session_pids(session):
        try:
            if b"gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False
