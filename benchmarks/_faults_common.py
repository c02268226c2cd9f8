"""Shared pieces of the fault benchmark (``benchmarks/faults.py``): the overall deadline, progress
lines, running the ``clonefleet`` command, and counting each job's end records in a journal."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _fanout_cold import run_session
from _fanout_report import rounded as _rounded
from _fanout_report import tally as tally

__all__ = ["Cli", "Deadline", "Ran", "ends_per_job", "log", "rounded", "tally"]

_T0 = time.monotonic()


def log(msg: str) -> None:
    """One progress line on stderr, with the seconds since the script started."""
    print(f"[faults +{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def rounded(x: float | None, nd: int = 2) -> float | None:
    """Seconds to two decimals (the fan-out report's rounding, with another default)."""
    return _rounded(x, nd)


@dataclass
class Deadline:
    """The script's overall time limit: every wait is bounded by what is left of it."""

    limit_s: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return max(self.limit_s - (time.monotonic() - self.start), 0.0)

    def cap(self, seconds: float) -> float:
        """``seconds``, or what is left of the overall limit when that is shorter."""
        return max(min(seconds, self.left()), 0.0)


@dataclass
class Ran:
    """A finished ``clonefleet`` command."""

    args: tuple[str, ...]
    rc: int | None
    out: str
    err: str
    wall_s: float
    timed_out: bool

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines() if line.startswith("{")]


class Cli:
    """Runs ``python -m clonefleet ARGS`` with its own state folder (``CLONEFLEET_STATE_DIR``),
    its own config folder and working directory, loopback only, no ``RAY_ADDRESS``."""

    def __init__(self, root: Path) -> None:
        self.state = root / "state"
        self.work = root / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = {
            k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CLONEFLEET_CONFIG")
        }
        self.env.update(
            CLONEFLEET_STATE_DIR=str(self.state),
            XDG_CONFIG_HOME=str(root / "xdg"),
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
            RAY_USAGE_STATS_ENABLED="0",
            CLONEFLEET_BLOCK_LIVE="1",
        )

    def __call__(self, *args: str, timeout: float = 150.0) -> Ran:
        """Run one command; past ``timeout`` its process group is killed (by its id)."""
        cmd = [sys.executable, "-m", "clonefleet", *args]
        proc, out, err, timed_out, wall = run_session(
            cmd, cwd=self.work, env=self.env, timeout_s=max(timeout, 1.0)
        )
        log(f"  `clonefleet {' '.join(args)[:70]}` -> {proc.returncode} in {wall:.2f} s")
        return Ran(tuple(args), proc.returncode, out, err, round(wall, 2), timed_out)


def ends_per_job(journal_dir: str | Path) -> dict[str, int]:
    """How many end records each job has in the journal at ``journal_dir`` (an end inside a
    compaction snapshot counts too)."""
    from clonefleet.journal import read_journal

    counts: dict[str, int] = {}
    for rec in read_journal(str(journal_dir)).records:
        if rec.get("k") == "end":
            counts[rec["j"]] = counts.get(rec["j"], 0) + 1
        elif rec.get("k") == "batch":
            for row in rec["jobs"]:
                if row["state"] in ("completed", "failed", "cancelled"):
                    counts[row["job_id"]] = counts.get(row["job_id"], 0) + 1
    return counts
