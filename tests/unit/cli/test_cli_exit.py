"""The ``clonefleet`` program ends at once after a command, but never before its work is out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from clonefleet.cli import program as cli

pytestmark = pytest.mark.timeout(60)


def test_a_running_thread_keeps_the_ordinary_exit():
    before = cli._nothing_left_to_finish()
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=False)
    worker.start()
    try:
        assert cli._nothing_left_to_finish() is False
    finally:
        release.set()
        worker.join(timeout=5)
    assert cli._nothing_left_to_finish() is before


def test_the_program_writes_all_its_output_and_its_exit_code_before_ending(tmp_path):
    env = {**os.environ, "CLONEFLEET_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-m", "clonefleet", "agents", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    agents = json.loads(done.stdout)  # the whole document arrived, not a cut-off buffer
    assert any(a["name"] == "general-purpose" for a in agents["agents"])
    bad = subprocess.run(
        [sys.executable, "-m", "clonefleet", "run", "no-such-agent", "--prompt", "x"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no-such-agent" in bad.stderr
