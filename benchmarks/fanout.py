"""Fan-out of counted batches, against a hand-written asyncio loop doing the same requests.

The simulated provider is served over HTTP from its own process (127.0.0.1, ``--latency-ms`` per
request; default behaviour: two model turns per clone, ``progress_update`` then ``exit_tool``).
For each batch size N:

1. clonefleet: embedded Ray through ``Fleet`` (its start is timed apart), then
   ``spawn("general-purpose", ..., count=N)`` on an ``openai`` provider pointing at the server.
   Makespan runs from the spawn call until ``job_block`` sees every job terminal. Also measured:
   the clone start rate (clones whose ``started`` event was emitted, per second since the spawn
   call), p50/p99 from the spawn call to each clone's first model request (the server records
   when each ``"<batch>/<clone>"`` first asked), the memory Ray's processes and this driver add
   during the run (peak during the run minus idle Ray just before the spawn, read from
   ``/proc``: RSS and PSS), the CPU each process kind used, and the clones per actor (hosts
   named in the job table, else host processes seen in ``/proc``).
2. baseline: one process, one ``aiohttp`` session, N agents all at once, each sending the two
   chat-completion requests a clone sends (the body of a clone's first request is captured by
   the server and reused, only ``user`` changes; the second request appends the answer and a
   tool result, as a hand-written loop would). The session's pool holds ``--baseline-limit``
   connections (default 1000, the pool one clonefleet host process has).

Once at the end: ``clonefleet run general-purpose --count 1000`` cold in a subprocess (in-process
simulated provider, Ray start included). Every wait is bounded in count and time; processes this
script started are stopped before it exits.

    python benchmarks/fanout.py [--sizes 10,100,1000,10000] [--latency-ms 200] [--seed 0]
                                [--clones-per-actor K] [--baseline-limit 1000]
                                [--cold-count 1000] [--no-cold]

Prints one table and writes ``benchmarks/results/fanout.json``. Targets (issue 6): N=1000 within
1.5x the loop; N=10000 within 2x with under 3 GB added; cold ``run --count 1000`` under 20 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "fanout.json"
PROMPT = "Summarise file_{{ clone.index }}.py"
TARGETS = {"ratio_1000": 1.5, "ratio_10000": 2.0, "added_mb_10000": 3000.0, "cold_s": 20.0}
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- the server process -------------------------------------------------------------------
def serve(latency_ms: float, seed: int) -> int:
    """Run the simulated server (``--serve``): prints its base URL, stops on SIGTERM/SIGINT.

    Besides the OpenAI-compatible routes it answers ``GET /bench/stats?prefix=P`` with its
    request counters, its CPU time, the first-request times of clones whose key starts with
    ``P``, and the body of the first chat request it received (the baseline's template).
    """
    return asyncio.run(_serve(latency_ms, seed))


async def _serve(latency_ms: float, seed: int) -> int:
    from aiohttp import web

    from clonefleet.providers import SimBrain, SimServer

    state = SimServer(SimBrain(seed=seed), latency_ms=latency_ms)
    sample: list[bytes] = []

    @web.middleware
    async def keep_first_body(request: web.Request, handler: Any) -> web.StreamResponse:
        if not sample and request.method == "POST":
            sample.append(
                await request.read()
            )  # aiohttp keeps the body; the handler reads it again
        return await handler(request)

    async def stats(request: web.Request) -> web.Response:
        prefix = request.query.get("prefix", "")
        usage = os.times()
        return web.json_response(
            {
                "requests": state.requests,
                "outcomes": dict(state.outcomes),
                "cpu_s": usage.user + usage.system,
                "first_request_at": {
                    k: v for k, v in state.first_request_at.items() if k.startswith(prefix)
                },
                "sample": sample[0].decode() if sample else None,
            }
        )

    app = state.app()
    app.middlewares.append(keep_first_body)
    app.router.add_get("/bench/stats", stats)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=2.0, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        sys.stdout.write(
            f"serving simulated provider on http://127.0.0.1:{runner.addresses[0][1]}/v1\n"
        )
        sys.stdout.flush()
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


class Server:
    """The server process seen from the benchmark."""

    def __init__(self, latency_ms: float, seed: int) -> None:
        cmd = [
            sys.executable,
            __file__,
            "--serve",
            "--latency-ms",
            str(latency_ms),
            "--seed",
            str(seed),
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CLONEFLEET_BLOCK_LIVE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("serving simulated provider on "):
            self.stop()
            raise SystemExit(f"the simulated server did not start: {line!r}")
        self.base_url = line.split(" on ", 1)[1].strip()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def stats(self, prefix: str = "\x00") -> dict[str, Any]:
        url = (
            f"{self.base_url.removesuffix('/v1')}/bench/stats?prefix={urllib.request.quote(prefix)}"
        )
        with self._opener.open(url, timeout=60) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


# -- /proc: memory and CPU of this process and its descendants ------------------------------
_KINDS = (
    ("ray::CloneHostActor", "hosts"),
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
class Sample:
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
        self.peak = Sample()
        self.hosts_seen: set[int] = set()
        self.cpu: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        out, todo = [], [os.getpid()]
        while todo and len(out) < 100_000:
            pid = todo.pop()
            if pid in self.exclude:
                continue
            out.append(pid)
            todo.extend(children.get(pid, ()))
        return out

    def sample(self, with_pss: bool = True) -> Sample:
        snap = Sample()
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
        self.peak, self.hosts_seen, self.cpu = Sample(), set(), {}
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="procwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Periodic samples read RSS only: reading smaps_rollup of every Ray process is costly
        # enough to slow the run it measures on 2 cores. PSS comes from the closing sample.
        while not self._stop.is_set():
            snap = self.sample(with_pss=False)
            if snap.rss > self.peak.rss:
                self.peak = snap
            self._stop.wait(self.interval_s)

    def stop(self) -> Sample:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        snap = self.sample()
        if snap.rss > self.peak.rss:
            self.peak = snap
        else:
            self.peak.pss = snap.pss
        return self.peak

    def cpu_by_kind(self, before: dict[int, tuple[str, float]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, (kind, cpu) in self.cpu.items():
            out[kind] = out.get(kind, 0.0) + cpu - (before.get(pid, (kind, 0.0))[1])
        return {k: round(v, 2) for k, v in sorted(out.items())}

    def reap(self, timeout_s: float = 30.0) -> list[int]:
        """Wait for every descendant to end; kill (by pid) what is left after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        left = [p for p in self.pids() if p != os.getpid()]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in self.pids() if p != os.getpid()]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _mb(n: float) -> float:
    return round(n / 1e6, 1)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# -- clonefleet -------------------------------------------------------------------------
def run_clonefleet(
    n: int, server: Server, watch: ProcWatch, args: argparse.Namespace
) -> dict[str, Any]:
    from clonefleet import Fleet
    from clonefleet.config import Config, ModelConfig, ProviderConfig

    config = Config(
        providers={"srv": ProviderConfig(kind="openai", base_url=server.base_url)},
        models={"m": ModelConfig(provider="srv", name="sim")},
        model_groups={"default": ("m",)},
    )
    row: dict[str, Any] = {"n": n, "load_before": _loadavg()}
    before = watch.sample()
    server_cpu0 = server.stats()["cpu_s"]
    with tempfile.TemporaryDirectory(prefix="fanout-") as cwd:
        started = time.perf_counter()
        fleet = Fleet(config=config, cwd=cwd)
        try:
            fleet.wait_ready()  # Ray and the warm clone hosts are start-up, reported apart
            row["ray_start_s"] = round(time.perf_counter() - started, 2)
            idle = watch.sample()
            cpu_idle = dict(watch.cpu)
            watch.start()
            t0, p0 = time.time(), time.perf_counter()
            batch = fleet.spawn(
                "general-purpose", PROMPT, count=n, clones_per_actor=args.clones_per_actor
            )
            row["spawn_call_s"] = round(time.perf_counter() - p0, 3)
            block = fleet.job_block([batch.batch_id], timeout_seconds=args.time_limit_s)
            row["makespan_s"] = round(time.perf_counter() - p0, 3)
            peak = watch.stop()
            row.update(_events(fleet, batch.batch_id, n, t0))
        finally:
            fleet.close()
    row["leftover_processes"] = len(watch.reap())
    stats = server.stats(prefix=f"{batch.batch_id}/")
    firsts = [(ts - t0) * 1000 for ts in stats["first_request_at"].values()]
    jobs = block["jobs"]
    # The job table names each job's host; host processes seen in /proc are the fallback.
    hosts = len({j["host"] for j in jobs if j.get("host")}) or len(watch.hosts_seen)
    row.update(
        {
            "done": block["done"],
            "completed_success": sum(
                1 for j in jobs if j["status"] == "completed" and j["outcome"] == "success"
            ),
            "statuses": _count(f"{j['status']}/{j['outcome']}" for j in jobs),
            "clones_per_actor": args.clones_per_actor or "auto",
            "host_processes": hosts,
            "host_processes_seen": len(watch.hosts_seen),
            "nodes_used": len({j["node"] for j in jobs if j.get("node")}) or None,
            "clones_per_host": math.ceil(n / hosts) if hosts else None,
            "clones_first_requested": len(firsts),
            "first_request_p50_ms": _round(_pct(firsts, 0.50)),
            "first_request_p99_ms": _round(_pct(firsts, 0.99)),
            "first_request_last_ms": _round(max(firsts, default=None)),
            "mem_before_ray_mb": _mb(before.rss),
            "mem_idle_ray_mb": _mb(idle.rss),
            "mem_peak_mb": _mb(peak.rss),
            "added_rss_mb": _mb(peak.rss - idle.rss),
            "added_pss_mb": _mb(peak.pss - idle.pss),
            "peak_rss_by_kind_mb": {k: _mb(v) for k, v in sorted(peak.by_kind.items())},
            "peak_processes": peak.procs,
            "cpu_s_by_kind": watch.cpu_by_kind(cpu_idle),
            "server_cpu_s": round(stats["cpu_s"] - server_cpu0, 2),
            "load_after": _loadavg(),
        }
    )
    row["template"] = stats["sample"]
    return row


def _events(fleet: Any, batch_id: str, n: int, t0: float) -> dict[str, Any]:
    """Start and end times from the batch's lifecycle events (pages of at most 5000)."""
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    cursor = 0
    for _ in range(n * 8 // 1000 + 20):
        page = fleet.events(batch_id, cursor=cursor, level="lifecycle")
        if not page["events"]:
            break
        cursor = page["cursor"]
        for env in page["events"]:
            event = env["event"]
            if event["type"] == "started":
                started.setdefault(env["subagent_run_id"], event["ts"])
            elif event["type"] == "result":
                ended.setdefault(env["subagent_run_id"], event["ts"])
    starts = sorted(ts - t0 for ts in started.values())
    last_start = starts[-1] if starts else None
    return {
        "started": len(starts),
        "first_start_s": _round(starts[0] if starts else None, 3),
        "last_start_s": _round(last_start, 3),
        "start_rate_per_s": _round(len(starts) / last_start if last_start else None, 1),
        "last_result_s": _round(max(ended.values()) - t0 if ended else None, 3),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _round(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


# -- baseline ----------------------------------------------------------------------------
async def run_baseline(
    n: int, server: Server, template: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """N agents in one process, each two sequential requests, all at once over one session."""
    import aiohttp

    url = f"{server.base_url}/chat/completions"
    tag = f"base{n}-{int(time.time())}"
    errors: list[str] = []

    async def agent(i: int) -> None:
        body = {**template, "messages": list(template["messages"]), "user": f"{tag}/{i}"}
        try:
            async with session.post(url, json=body) as resp:
                resp.raise_for_status()
                message = (await resp.json())["choices"][0]["message"]
            body["messages"].append(message)
            for call in message.get("tool_calls") or []:
                body["messages"].append(
                    {"role": "tool", "tool_call_id": call["id"], "content": "progress recorded"}
                )
            async with session.post(url, json=body) as resp:
                resp.raise_for_status()
                final = (await resp.json())["choices"][0]["message"]
            if not any(c["function"]["name"] == "exit_tool" for c in final.get("tool_calls") or []):
                errors.append("no exit_tool")
        except (aiohttp.ClientError, KeyError, ValueError) as exc:
            errors.append(type(exc).__name__)

    connector = aiohttp.TCPConnector(limit=args.baseline_limit)
    cpu0 = time.process_time()
    t0, p0 = time.time(), time.perf_counter()
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        try:
            async with asyncio.timeout(args.time_limit_s), asyncio.TaskGroup() as tg:
                for i in range(n):
                    tg.create_task(agent(i))
        except TimeoutError:
            errors.append(f"exceeded {args.time_limit_s:g}s")
        makespan = time.perf_counter() - p0
    firsts = [
        (ts - t0) * 1000 for ts in server.stats(prefix=f"{tag}/")["first_request_at"].values()
    ]
    return {
        "baseline_s": round(makespan, 3),
        "baseline_cpu_s": round(time.process_time() - cpu0, 2),
        "baseline_errors": len(errors),
        "baseline_error_kinds": sorted(set(errors)),
        "baseline_first_request_p50_ms": _round(_pct(firsts, 0.50)),
        "baseline_first_request_p99_ms": _round(_pct(firsts, 0.99)),
    }


# -- cold `clonefleet run` -----------------------------------------------------------------
def run_cold(count: int, time_limit_s: float) -> dict[str, Any]:
    """``clonefleet run general-purpose --count COUNT --json`` in a fresh process and directory."""
    exe = Path(sys.executable).with_name("clonefleet")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "clonefleet"]
    cmd += ["run", "general-purpose", "--prompt", PROMPT, "--count", str(count), "--json"]
    with tempfile.TemporaryDirectory(prefix="fanout-cold-") as cwd:
        env = {k: v for k, v in os.environ.items() if k not in ("CLONEFLEET_CONFIG", "RAY_ADDRESS")}
        env["XDG_CONFIG_HOME"] = str(Path(cwd) / "xdg")
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
            out, err = proc.communicate(timeout=time_limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            timed_out = True
        wall = time.perf_counter() - p0
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


def _reap_session(sid: int, timeout_s: float = 30.0) -> int:
    """Wait for the processes of session ``sid`` (the CLI's Ray) to end; kill survivors by pid."""

    def members() -> list[int]:
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if (
                        int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[3])
                        == sid
                    ):
                        out.append(int(name))
                except (OSError, ValueError, IndexError):
                    continue
        return out

    deadline = time.monotonic() + timeout_s
    left = members()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = members()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


# -- report ------------------------------------------------------------------------------
COLUMNS = (
    ("N", "n", "d"),
    ("clones/actor", "cpa", "s"),
    ("ray start s", "ray_start_s", ".2f"),
    ("spawn call s", "spawn_call_s", ".3f"),
    ("makespan s", "makespan_s", ".3f"),
    ("asyncio s", "baseline_s", ".3f"),
    ("ratio", "ratio", ".2f"),
    ("start/s", "start_rate_per_s", ".1f"),
    ("1st req p50 ms", "first_request_p50_ms", ".1f"),
    ("p99 ms", "first_request_p99_ms", ".1f"),
    ("added RSS MB", "added_rss_mb", ".1f"),
    ("added PSS MB", "added_pss_mb", ".1f"),
    ("ok", "ok", "s"),
)
"""(title, key of a result row, format spec) of each table column."""


def table(rows: list[dict[str, Any]]) -> str:
    cells = [[title for title, _, _ in COLUMNS]]
    cells += [
        ["-" if r.get(key) is None else format(r[key], spec) for _, key, spec in COLUMNS]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = [" ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]], cold: dict[str, Any] | None) -> list[str]:
    by_n = {r["n"]: r for r in rows}
    out = []
    if 1000 in by_n:
        r = by_n[1000]["ratio"]
        out.append(
            f"N=1000 within {TARGETS['ratio_1000']}x the asyncio loop: {'met' if r is not None and r <= TARGETS['ratio_1000'] else 'MISSED'} ({r}x)"
        )
    if 10000 in by_n:
        r, mem, ok = (
            by_n[10000]["ratio"],
            by_n[10000]["added_rss_mb"],
            by_n[10000]["completed_success"] == 10000,
        )
        met = (
            ok and r is not None and r <= TARGETS["ratio_10000"] and mem < TARGETS["added_mb_10000"]
        )
        out.append(
            f"N=10000 completes within {TARGETS['ratio_10000']}x, under 3 GB added: {'met' if met else 'MISSED'} ({r}x, {mem} MB RSS, {by_n[10000]['completed_success']}/10000 ok)"
        )
    if cold is not None:
        met = cold["completed_success"] == cold["count"] and cold["wall_s"] < TARGETS["cold_s"]
        out.append(
            f"cold `clonefleet run general-purpose --count {cold['count']}` under {TARGETS['cold_s']:g} s: {'met' if met else 'MISSED'} ({cold['wall_s']} s, {cold['completed_success']}/{cold['count']} ok)"
        )
    return out


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _git_commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when it has changes (``None`` outside git)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000", help="comma-separated batch sizes")
    parser.add_argument(
        "--latency-ms", type=float, default=200.0, help="simulated server latency per request"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated server")
    parser.add_argument(
        "--clones-per-actor", type=int, default=None, help="override clonefleet's automatic choice"
    )
    parser.add_argument(
        "--baseline-limit",
        type=int,
        default=1000,
        help="connections the baseline's session opens at most (0 = one per agent); default: the "
        "per-process pool of clonefleet's providers (max_connections), since 10,000 connections at "
        "once make the loop slower, not faster",
    )
    parser.add_argument(
        "--time-limit-s", type=float, default=600.0, help="longest wait for one batch"
    )
    parser.add_argument("--cold-count", type=int, default=1000)
    parser.add_argument("--no-cold", action="store_true", help="skip the cold `clonefleet run`")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.latency_ms, args.seed)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated run still stops Ray and the server
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    server = Server(args.latency_ms, args.seed)
    watch = ProcWatch(exclude={server.proc.pid})
    rows: list[dict[str, Any]] = []
    cold = None
    try:
        for n in sizes:
            row = run_clonefleet(n, server, watch, args)
            template = json.loads(row.pop("template"))
            template.pop("user", None)
            row.update(asyncio.run(run_baseline(n, server, template, args)))
            row["ratio"] = (
                round(row["makespan_s"] / row["baseline_s"], 2) if row["baseline_s"] else None
            )
            row["cpa"] = (
                f"{row['clones_per_actor']}:{row['clones_per_host'] or '?'}x{row['host_processes']}"
            )
            row["ok"] = f"{row['completed_success']}/{n}"
            rows.append(row)
            print(
                f"fanout: N={n} done: {json.dumps({k: row[k] for k in ('makespan_s', 'baseline_s', 'ratio', 'added_rss_mb')})}",
                flush=True,
            )  # noqa: T201
        if not args.no_cold:
            cold = run_cold(args.cold_count, args.time_limit_s)
    finally:
        server.stop()
    params = {
        "sizes": sizes,
        "latency_ms": args.latency_ms,
        "turns_per_clone": 2,
        "seed": args.seed,
        "clones_per_actor": args.clones_per_actor or "auto",
        "baseline_connection_limit": args.baseline_limit or "none",
        "agent": "general-purpose",
        "provider": "openai -> simulated server over HTTP (own process)",
        "cpus": os.cpu_count(),
        "commit": _git_commit(),
        "python": platform.python_version(),
        "versions": {
            p: metadata.version(p)
            for p in ("ray", "aiohttp", "httpx", "httpx-aiohttp", "clonefleet")
        },
    }
    print(f"fanout: {json.dumps(params)}")  # noqa: T201 - a benchmark script prints its table
    print(table(rows))  # noqa: T201
    print("clones/actor = setting:clones per host x hosts")  # noqa: T201
    if cold is not None:
        print(
            f"cold `clonefleet run general-purpose --count {cold['count']}`: {cold['wall_s']} s, exit {cold['exit_status']}, {cold['completed_success']}/{cold['count']} ok"
        )  # noqa: T201
    for line in verdicts(rows, cold):
        print(line)  # noqa: T201
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"params": params, "results": rows, "cold_run": cold, "targets": TARGETS}, indent=2
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
