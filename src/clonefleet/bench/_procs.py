"""/proc readings for `clonefleet bench`: memory and CPU of this process and its descendants.

:class:`ProcWatch` samples the process tree (RSS, PSS, CPU per kind of process, the clone hosts
seen). Linux only.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ProcWatch", "Snapshot"]

PAGE = os.sysconf("SC_PAGE_SIZE")

_KINDS = (
    ("ray::CloneHostActor", "hosts"),
    ("ray::BaselineAgentActor", "actor-per-clone"),
    ("ray::SchedulerActor", "scheduler"),
    ("ray::IDLE", "idle workers"),
    ("raylet", "raylet"),
    ("gcs_server", "gcs_server"),
    ("dashboard", "dashboard"),
    ("ray::", "ray agents"),
    ("log_monitor", "log monitor"),
    ("monitor.py", "autoscaler monitor"),
    ("workers/setup_worker.py", "starting workers"),
    ("default_worker.py", "starting workers"),
)


def _kind(cmdline: bytes, pid: int) -> str:
    """What a process is, from its command line (Ray sets ``ray::<Actor>`` titles)."""
    if pid == os.getpid():
        return "driver"
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\x00") if a]
    script = next((a for a in argv[1:] if not a.startswith("-")), "")  # skips `python -u`
    text = f"{argv[0] if argv else ''} {script}"
    return next((kind for word, kind in _KINDS if word in text), "other")


@dataclass
class Snapshot:
    rss: int = 0
    pss: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    procs: int = 0


class ProcWatch:
    """Samples this process and its descendants, leaving out the subtrees of ``exclude``.

    ``sample()`` reads one snapshot; ``start()``/``stop()`` sample in a thread every
    ``interval_s`` and keep the peak, the host processes seen, and each process's latest CPU time.
    """

    def __init__(self, exclude: set[int], interval_s: float = 0.25) -> None:
        self.exclude, self.interval_s = exclude, interval_s
        self.peak = Snapshot()
        self.hosts_seen: set[int] = set()
        self.cpu: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.own_cpu_s = 0.0
        """CPU seconds this watcher spent sampling since :meth:`start`: it runs in the driver's
        process, and :meth:`cpu_by_kind` takes it out of the driver's CPU."""

    def pids(self) -> list[int]:
        children: dict[int, list[int]] = defaultdict(list)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children[ppid].append(int(name))
        out: list[int] = []
        todo = [os.getpid()]
        while todo and len(out) < 100_000:
            pid = todo.pop()
            if pid in self.exclude:
                continue
            out.append(pid)
            todo.extend(children.get(pid, ()))
        return out

    def sample(self, with_pss: bool = True) -> Snapshot:
        snap = Snapshot()
        ticks = os.sysconf("SC_CLK_TCK")
        for pid in self.pids():
            try:
                rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
                pss = _pss(pid) if with_pss else 0
                kind = _kind(Path(f"/proc/{pid}/cmdline").read_bytes(), pid)
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, ValueError, IndexError):
                continue
            snap.rss += rss
            snap.pss += pss
            snap.procs += 1
            snap.by_kind[kind] = snap.by_kind.get(kind, 0) + rss
            self.cpu[pid] = (kind, (int(fields[11]) + int(fields[12])) / ticks)
            if kind == "hosts":
                self.hosts_seen.add(pid)
        return snap

    def start(self) -> None:
        self.peak, self.hosts_seen, self.cpu = Snapshot(), set(), {}
        self.own_cpu_s = 0.0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="procwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Periodic samples read RSS only: reading smaps_rollup of every Ray process is costly
        # enough to slow the run it measures on 2 cores. PSS comes from the closing sample.
        while not self._stop.is_set():
            began = time.thread_time()
            snap = self.sample(with_pss=False)
            if snap.rss > self.peak.rss:
                self.peak = snap
            self.own_cpu_s += time.thread_time() - began
            self._stop.wait(self.interval_s)

    def stop(self) -> Snapshot:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        began = time.thread_time()
        snap = self.sample()
        self.own_cpu_s += time.thread_time() - began
        if snap.rss > self.peak.rss:
            self.peak = snap
        else:
            self.peak.pss = snap.pss
        return self.peak

    def cpu_by_kind(self, before: dict[int, tuple[str, float]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, (kind, cpu) in self.cpu.items():
            out[kind] = out.get(kind, 0.0) + cpu - (before.get(pid, (kind, 0.0))[1])
        if "driver" in out:
            out["driver"] = max(out["driver"] - self.own_cpu_s, 0.0)
        return {k: round(v, 2) for k, v in sorted(out.items())}


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
