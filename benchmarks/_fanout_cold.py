"""A cold ``clonefleet run general-purpose --count N`` in a fresh process and folder (Ray start
included), for ``benchmarks/fanout.py``. Processes it started are gone when it returns."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["run_cold", "run_session"]

PROMPT = "Summarise file_{{ clone.index }}.py"


def _session_members(sid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[3]) == sid:
                    out.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def _reap_session(sid: int, timeout_s: float = 30.0) -> int:
    """Wait for the processes of session ``sid`` (the CLI's Ray) to end; kill survivors by pid."""
    deadline = time.monotonic() + timeout_s
    left = _session_members(sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _session_members(sid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


def run_session(
    cmd: list[str], *, cwd: str | Path, env: dict[str, str], timeout_s: float
) -> tuple[subprocess.Popen[str], str, str, bool, float]:
    """Run ``cmd`` in a session of its own; past ``timeout_s``, or on any exception here
    (KeyboardInterrupt too), its process group is killed.

    Returns the process, its stdout and stderr, whether it timed out, and its wall seconds.
    """
    p0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            timed_out = True
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _reap_session(proc.pid, timeout_s=5)
        raise
    return proc, out, err, timed_out, time.perf_counter() - p0


def clean_env(root: Path, **extra: str) -> dict[str, str]:
    """This environment without what would point a run elsewhere, with fresh HOME, TMPDIR,
    state and config folders under ``root`` (made here), plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "CLONEFLEET_CONFIG", "VIRTUAL_ENV", "PYTHONPATH")
    }
    for name in ("home", "tmp", "state", "xdg"):
        (root / name).mkdir()
    env.update(
        HOME=str(root / "home"),
        TMPDIR=str(root / "tmp"),
        CLONEFLEET_STATE_DIR=str(root / "state"),
        XDG_CONFIG_HOME=str(root / "xdg"),
        RAY_USAGE_STATS_ENABLED="0",
        CLONEFLEET_BLOCK_LIVE="1",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


SIM_READY = "serving simulated provider on "
"""The line ``clonefleet provider serve`` prints once it listens, before its URL."""


class SimProvider:
    """``clonefleet provider serve --port 0`` plus ``args``, in a session of its own;
    :meth:`stop` kills that session."""

    def __init__(self, exe: str, work: Path, env: dict[str, str], args: list[str]) -> None:
        cmd = [exe, "provider", "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith(SIM_READY):
            self.stop()
            raise RuntimeError(f"the simulated provider did not start: {line!r}")
        self.base_url = line.removeprefix(SIM_READY).strip()

    def stats(self) -> dict[str, Any] | None:
        """The server's counters, or ``None`` when it does not answer ``/sim/stats``."""
        url = self.base_url.removesuffix("/v1") + "/sim/stats"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=30) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL to its session after 10 s)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        _reap_session(self.proc.pid, timeout_s=5)


def run_cold(count: int, time_limit_s: float) -> dict[str, Any]:
    """``clonefleet run general-purpose --count COUNT --json`` in a fresh process and directory."""
    exe = Path(sys.executable).with_name("clonefleet")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "clonefleet"]
    cmd += ["run", "general-purpose", "--prompt", PROMPT, "--count", str(count), "--json"]
    with tempfile.TemporaryDirectory(prefix="fanout-cold-") as cwd:
        env = {k: v for k, v in os.environ.items() if k not in ("CLONEFLEET_CONFIG", "RAY_ADDRESS")}
        env["XDG_CONFIG_HOME"] = str(Path(cwd) / "xdg")
        proc, out, err, timed_out, wall = run_session(cmd, cwd=cwd, env=env, timeout_s=time_limit_s)
        leftovers = _reap_session(proc.pid)
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    ok = sum(1 for r in records if r["status"] == "completed" and r["outcome"] == "success")
    return {
        "count": count,
        "wall_s": round(wall, 2),
        "exit_status": proc.returncode,
        "records": len(records),
        "completed_success": ok,
        "timed_out": timed_out,
        "leftover_processes": leftovers,
        "stderr_tail": err[-500:] if proc.returncode else "",
    }
