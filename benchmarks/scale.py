"""One cold ``clonefleet run general-purpose --count N`` past one batch (default 100,000).

The CLI runs in a fresh directory whose project config raises ``limits.max_count`` past N, with
the in-process simulated provider, under ``/usr/bin/time -v`` (its peak RSS) in its own session.
While it runs, ``/proc`` is sampled every ``--interval-s``: RSS of every process of that session
(the CLI, the scheduler and host actors, raylet, GCS...), summed and by kind, with PSS every
tenth sample. The summary (stdout) is kept; stderr (progress lines) goes to a file whose tail is kept. The run is bounded by ``--time-limit-s``.

    python benchmarks/scale.py [--count 100000] [--time-limit-s 900] [--interval-s 1]

Prints the figures and writes ``benchmarks/results/scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "scale.json"
PAGE = os.sysconf("SC_PAGE_SIZE")
KINDS = (
    ("ray::CloneHostActor", "hosts"),
    ("ray::SchedulerActor", "scheduler"),
    ("ray::IDLE", "idle workers"),
    ("raylet", "raylet"),
    ("gcs_server", "gcs_server"),
    ("clonefleet run", "cli"),
    ("ray::", "ray agents"),
)


def _session(sid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            out.append(int(name))
    return out


def _kind(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace")
    return next((kind for word, kind in KINDS if word in argv), "other")


def _pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


class Sampler:
    """Peak RSS (and PSS, every tenth sample) of one session's processes, in a thread."""

    def __init__(self, sid: int, interval_s: float) -> None:
        self.sid, self.interval_s = sid, interval_s
        self.peak_rss, self.peak_pss, self.samples = 0, 0, 0
        self.peak_by_kind: dict[str, int] = {}
        self.peak_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, with_pss: bool) -> None:
        rss = pss = 0
        by_kind: dict[str, int] = {}
        pids = _session(self.sid)
        for pid in pids:
            try:
                one = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
                pss += _pss(pid) if with_pss else 0
                kind = _kind(pid)
            except (OSError, ValueError, IndexError):
                continue
            rss += one
            by_kind[kind] = by_kind.get(kind, 0) + one
        self.samples += 1
        self.peak_pss = max(self.peak_pss, pss)
        if rss > self.peak_rss:
            self.peak_rss, self.peak_by_kind, self.peak_procs = rss, by_kind, len(pids)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample(with_pss=self.samples % 10 == 0)
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _time_v(text: str) -> dict[str, str]:
    """The fields of ``/usr/bin/time -v`` that matter here."""
    keep = ("Elapsed (wall clock)", "Maximum resident set size", "Exit status", "Percent of CPU")
    out = {}
    for line in text.splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key.startswith(keep):
            out[key] = value
    return out


def run(count: int, time_limit_s: float, interval_s: float, workdir: Path) -> dict[str, Any]:
    (workdir / ".clonefleet").mkdir(parents=True, exist_ok=True)
    config = f"limits:\n  max_count: {max(count, 10_000) * 2}\n"
    (workdir / ".clonefleet" / "config.yaml").write_text(config)
    exe = Path(sys.executable).with_name("clonefleet")
    cmd = ["/usr/bin/time", "-v", "-o", str(workdir / "time.txt"), str(exe)]
    cmd += ["run", "general-purpose", "--prompt", "hi", "--count", str(count)]
    env = {k: v for k, v in os.environ.items() if k not in ("CLONEFLEET_CONFIG", "RAY_ADDRESS")}
    env["XDG_CONFIG_HOME"] = str(workdir / "xdg")
    load_before = _loadavg()
    with open(workdir / "stdout.txt", "wb") as out, open(workdir / "stderr.txt", "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=workdir, env=env, stdout=out, stderr=err, start_new_session=True
        )
        sampler = Sampler(proc.pid, interval_s)
        sampler.start()
        try:
            proc.wait(timeout=time_limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            timed_out = True
        wall = time.perf_counter() - t0
        sampler.stop()
    return _report(workdir, count, proc.returncode, wall, timed_out, sampler, load_before)


def _report(
    workdir: Path,
    count: int,
    rc: int,
    wall: float,
    timed_out: bool,
    sampler: Sampler,
    load_before: list[float],
) -> dict[str, Any]:
    mib = 1 << 20
    stderr = (workdir / "stderr.txt").read_bytes().decode(errors="replace")
    tail = [line for line in stderr.splitlines() if not line.startswith("exec: ")][-40:]
    return {
        "count": count,
        "exit_status": rc,
        "timed_out": timed_out,
        "wall_s": round(wall, 1),
        "time_v": _time_v((workdir / "time.txt").read_text(errors="replace")),
        "cluster_peak_rss_mib": round(sampler.peak_rss / mib),
        "cluster_peak_pss_mib": round(sampler.peak_pss / mib),
        "peak_rss_by_kind_mib": {
            k: round(v / mib) for k, v in sorted(sampler.peak_by_kind.items())
        },
        "processes_at_peak": sampler.peak_procs,
        "samples": sampler.samples,
        "summary": (workdir / "stdout.txt").read_text(errors="replace").splitlines()[:40],
        "stderr_bytes": len(stderr),
        "load_before": load_before,
        "load_after": _loadavg(),
        "cpus": os.cpu_count(),
        "summary_tail": tail,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--time-limit-s", type=float, default=900.0)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it")
    args = parser.parse_args()
    if args.keep is not None:
        report = run(args.count, args.time_limit_s, args.interval_s, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="clonefleet-scale-") as tmp:
            report = run(args.count, args.time_limit_s, args.interval_s, Path(tmp))
    print(json.dumps(report, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["exit_status"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
