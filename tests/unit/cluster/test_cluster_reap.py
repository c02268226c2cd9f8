"""What an embedded Ray instance leaves is found by the files it writes in its session folder and
ended: after a stop, by the next start (orphans of dead owners), or by the watchdog of an owner
that was killed. Stand-in processes, no Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clonefleet.cluster import _reap

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc"),
]

_HOLD = (
    "import sys, time; f = open(sys.argv[1], sys.argv[2]); print('ok', flush=True); time.sleep(60)"
)


def _session(temp_dir: Path, owner: int) -> Path:
    folder = temp_dir / f"session_2026-01-01_00-00-00_000000_{owner}" / "logs"
    folder.mkdir(parents=True)
    (folder / "raylet.out").write_text("")
    return folder


@pytest.fixture
def spawn() -> Iterator[Callable[[Path, str], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(path: Path, mode: str) -> subprocess.Popen[str]:
        """A process holding ``path`` open (``a``: writing, as Ray's do; ``r``: a reader)."""
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(path), mode], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdout.readline() == "ok\n"
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _dead_pid() -> int:
    cmd = [sys.executable, "-c", "import os; print(os.getpid())"]
    return int(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def test_the_processes_writing_in_an_owners_session_folder_are_its_instance(tmp_path, spawn):
    logs = _session(tmp_path, 4242)
    writer = spawn(logs / "raylet.out", "a")
    reader = spawn(logs / "raylet.out", "r")  # a pager on a log file is not Ray's
    other = spawn(_session(tmp_path, 4243) / "raylet.out", "a")
    assert _reap.instance_pids(tmp_path, 4242) == [writer.pid]
    assert _reap.end_instance(tmp_path, 4242) == 1
    assert writer.wait(timeout=5) == -signal.SIGKILL
    assert reader.poll() is None and other.poll() is None


def test_a_start_ends_what_dead_owners_left_and_nothing_of_a_live_one(tmp_path, spawn):
    orphan = spawn(_session(tmp_path, _dead_pid()) / "raylet.out", "a")
    mine = spawn(_session(tmp_path, os.getpid()) / "raylet.out", "a")
    assert _reap.reap_orphans(tmp_path) == 1
    assert orphan.wait(timeout=5) == -signal.SIGKILL
    assert mine.poll() is None


_OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from clonefleet.cluster._reap import start_watchdog
    temp_dir, how = Path(sys.argv[1]), sys.argv[2]
    watchdog = start_watchdog(temp_dir)
    logs = temp_dir / f"session_2026-01-01_00-00-00_000000_{__import__('os').getpid()}"
    logs.mkdir()
    hold = "import sys, time; f = open(sys.argv[1], 'a'); print('ok', flush=True); time.sleep(60)"
    # Its own session, as Ray's agents are in effect once their raylet is gone.
    agent = subprocess.Popen([sys.executable, "-c", hold, str(logs / "agent.log")],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    agent.stdout.readline()
    print(agent.pid, flush=True)
    if how == "stopped":
        watchdog.close()
        sys.exit(0)
    time.sleep(60)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_the_watchdog_ends_the_instance_of_a_killed_owner_only(tmp_path, how):
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(tmp_path), how], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    agent = int(owner.stdout.readline())
    owner.stdout.close()
    try:
        if how == "killed":
            owner.kill()
        owner.wait(timeout=10)
        # A watchdog that acts kills at its first look (milliseconds after the owner ended).
        deadline = time.monotonic() + (5.0 if how == "killed" else 1.0)
        while _alive(agent) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _alive(agent) is (how == "stopped")
    finally:
        owner.kill()
        owner.wait()
        if _alive(agent):
            os.kill(agent, signal.SIGKILL)
