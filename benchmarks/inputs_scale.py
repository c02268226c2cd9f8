"""Issue 27's targets for ``clonefleet run AGENT --inputs FILE``, each a cold run in a fresh
process, folder, HOME and TMPDIR, against ``clonefleet provider serve`` on 127.0.0.1:

- ``rows``: N rows of JSONL run to completion; the driver's and the scheduler actor's peak RSS
  (sampled from /proc every 0.2 s) and the makespan, beside a counted batch of the same size.
- ``start``: the seconds from the command to the first model request (the server's first) on
  an M-row file and on a counted batch, both then interrupted; Ray's start is in both, so the
  target (2 s) is on the difference.
- ``resume``: K rows uninterrupted, then K rows killed (SIGKILL of the driver's whole session)
  once a share of the records is in ``--out`` and run again: the model requests of the two
  runs together against the uninterrupted one (target: at most 1.02x).

Usage::

    python benchmarks/inputs_scale.py [--cases rows,start,resume] [--rows 100000]
        [--start-rows 1000000] [--resume-rows 10000] [--kill-at 0.4] [--latency-ms 200]
        [--counted-max-concurrency N] [--resume-max-concurrency N] [--resume-checkpoint-s S] [--resume-no-journal]
        [--time-limit-s 1800] [--out benchmarks/results/inputs_scale.json]

Prints a table and writes JSON; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _fanout_cold import SimProvider, _reap_session, _session_members, clean_env

_KEY_ENV = "INPUTS_BENCH_KEY"
_PROMPT = "Answer question {{ input.id }}: {{ input.q }}"
_SAMPLE_S = 0.2


def write_rows(path: Path, n: int) -> None:
    """``n`` JSONL rows ``{"id": i, "q": ...}``, written in blocks (memory stays small)."""
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, n, 10_000):
            block = range(start, min(start + 10_000, n))
            f.write("".join(f'{{"id": {i}, "q": "what is {i} squared"}}\n' for i in block))


def _config(
    base_url: str, max_count: int, checkpoint_s: float | None = None, journal: bool = True
) -> str:
    config: dict[str, Any] = {
        "version": 1,
        "providers": {"srv": {"kind": "openai", "base_url": base_url, "api_key_env": _KEY_ENV}},
        "models": {"m": {"provider": "srv", "name": "sim"}},
        "model_groups": {"default": ["m"]},
        "limits": {"max_count": max_count},
    }
    if checkpoint_s is not None:
        config["durability"] = {"checkpoint_interval_s": checkpoint_s}
    if not journal:  # no journal: a rerun cannot collect the killed run's batch
        config["durability"] = {"enabled": False}
    return json.dumps(config)


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _is_scheduler(pid: int) -> bool:
    try:
        return b"SchedulerActor" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Sampler(threading.Thread):
    """Peak RSS of the driver (``pid``) and of the scheduler actor in its session."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.driver_kb, self.scheduler_kb = pid, 0, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(_SAMPLE_S):
            self.driver_kb = max(self.driver_kb, _rss_kb(self.pid))
            for member in _session_members(self.pid):
                if _is_scheduler(member):
                    self.scheduler_kb = max(self.scheduler_kb, _rss_kb(member))

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


class Run:
    """One ``clonefleet`` command in a session of its own, output to files."""

    def __init__(self, cmd: list[str], work: Path, env: dict[str, str], name: str) -> None:
        self.out = (work / f"{name}.stdout").open("w")
        self.err = (work / f"{name}.stderr").open("w")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=self.out, stderr=self.err, start_new_session=True
        )
        self.sampler = Sampler(self.proc.pid)
        self.sampler.start()

    def wait(self, timeout_s: float) -> dict[str, Any]:
        timed_out = False
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            timed_out = True
        return self.finish(timed_out)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def finish(self, timed_out: bool = False) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        self.sampler.stop()
        leftovers = _reap_session(self.proc.pid, timeout_s=10)
        self.out.close()
        self.err.close()
        return {
            "exit_status": self.proc.returncode,
            "timed_out": timed_out,
            "wall_s": round(wall, 2),
            "driver_peak_mb": round(self.sampler.driver_kb / 1024, 1),
            "scheduler_peak_mb": round(self.sampler.scheduler_kb / 1024, 1),
            "leftover_processes": leftovers,
            "stderr_tail": Path(self.err.name).read_text(errors="replace")[-600:],
        }


def _lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def _ok_records(path: Path) -> tuple[int, int]:
    """(records, distinct keys with a successful record) in a JSONL results file; a record
    without a key (a counted batch's) counts as a key of its own."""
    total, ok = 0, set()
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            total += 1
            if rec.get("status") == "completed" and rec.get("outcome") == "success":
                key = rec.get("key")
                ok.add(("line", total) if key is None else ("key", key))
    return total, len(ok)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def session(self, name: str) -> tuple[Path, dict[str, str], SimProvider]:
        work = Path(tempfile.mkdtemp(prefix=f"inputs-{name}-"))
        env = clean_env(work, **{_KEY_ENV: "sim"})
        server = SimProvider(
            self.args.clonefleet, work, env, ["--latency-ms", f"{self.args.latency_ms:g}"]
        )
        return work, env, server

    def command(self, work: Path, rows: Path | None, n: int, out: str) -> list[str]:
        cmd = [self.args.clonefleet, "run", "general-purpose", "--config", str(work / "c.json")]
        cmd += ["--out", str(work / out), "--progress-lines"]
        if rows is None:
            return [*cmd, "--count", str(n), "--prompt", "Answer question {{ clone.index }}"]
        return [*cmd, "--inputs", str(rows), "--key", "id", "--prompt", _PROMPT]

    def case_rows(self) -> dict[str, Any]:
        n = self.args.rows
        out: dict[str, Any] = {"case": "rows", "rows": n}
        for kind in self.args.rows_kinds.split(","):
            work, env, server = self.session(f"rows-{kind}")
            try:
                (work / "c.json").write_text(_config(server.base_url, max(n, 10_000)))
                rows = work / "rows.jsonl" if kind == "inputs" else None
                if rows is not None:
                    write_rows(rows, n)
                cmd = self.command(work, rows, n, "out.jsonl")
                cap = self.args.counted_max_concurrency if kind == "counted" else None
                if cap:
                    cmd += ["--max-concurrency", str(cap)]
                run = Run(cmd, work, env, kind)
                result = run.wait(self.args.time_limit_s)
                result["max_concurrency"] = cap
                result["records"], result["ok_keys"] = _ok_records(work / "out.jsonl")
                result["requests"] = (server.stats() or {}).get("requests")
                out[kind] = result
                _say(f"rows {kind}: {result['wall_s']} s, driver {result['driver_peak_mb']} MB")
            finally:
                server.stop()
                shutil.rmtree(work, ignore_errors=True)
        return out

    def case_start(self) -> dict[str, Any]:
        """Seconds to the first model request on the big file and on a counted batch of 1,000
        (Ray's start is in both: the difference is what reading the file costs)."""
        n = self.args.start_rows
        out: dict[str, Any] = {"case": "start", "rows": n}
        for kind in ("inputs", "counted"):
            work, env, server = self.session(f"start-{kind}")
            try:
                (work / "c.json").write_text(_config(server.base_url, n))
                rows = work / "rows.jsonl" if kind == "inputs" else None
                if rows is not None:
                    write_rows(rows, n)
                run = Run(self.command(work, rows, 1000, "out.jsonl"), work, env, kind)
                first = _first_request(run, server)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.proc.pid, signal.SIGINT)  # the run stops what it started
                result = run.wait(120)
                result["first_request_s"] = first and round(first, 2)
                out[kind] = result
                _say(f"start {kind}: first model request after {result['first_request_s']} s")
            finally:
                server.stop()
                shutil.rmtree(work, ignore_errors=True)
        a, b = out["inputs"]["first_request_s"], out["counted"]["first_request_s"]
        out["added_s"] = round(a - b, 2) if a is not None and b is not None else None
        return out

    def case_resume(self) -> dict[str, Any]:
        n = self.args.resume_rows
        out: dict[str, Any] = {"case": "resume", "rows": n, "kill_at": self.args.kill_at}
        out["max_concurrency"] = self.args.resume_max_concurrency
        out["checkpoint_interval_s"] = self.args.resume_checkpoint_s
        out["journal"] = not self.args.resume_no_journal
        for kind in ("whole", "killed"):
            work, env, server = self.session(f"resume-{kind}")
            try:
                config = _config(
                    server.base_url,
                    max(n, 10_000),
                    self.args.resume_checkpoint_s,
                    journal=not self.args.resume_no_journal,
                )
                (work / "c.json").write_text(config)
                rows = work / "rows.jsonl"
                write_rows(rows, n)
                cmd = self.command(work, rows, n, "out.jsonl")
                if self.args.resume_max_concurrency:
                    cmd += ["--max-concurrency", str(self.args.resume_max_concurrency)]
                runs = []
                if kind == "killed":
                    first = Run(cmd, work, env, "first")
                    goal = int(n * self.args.kill_at)
                    deadline = time.perf_counter() + self.args.time_limit_s
                    while _lines(work / "out.jsonl") < goal and time.perf_counter() < deadline:
                        if first.proc.poll() is not None:
                            break
                        time.sleep(0.05)
                    first.kill()
                    runs.append(first.finish())
                runs.append(Run(cmd, work, env, "second").wait(self.args.time_limit_s))
                said = (work / "second.stderr").read_text(errors="replace").splitlines()
                runs[-1]["resumed"] = next((x for x in said if "resuming batch" in x), None)
                records, ok = _ok_records(work / "out.jsonl")
                requests = (server.stats() or {}).get("requests")
                out[kind] = {"runs": runs, "records": records, "ok_keys": ok, "requests": requests}
                _say(f"resume {kind}: {requests} requests, {ok}/{n} keys ok, {records} records")
            finally:
                server.stop()
                shutil.rmtree(work, ignore_errors=True)
        whole, killed = out["whole"]["requests"], out["killed"]["requests"]
        out["requests_ratio"] = round(killed / whole, 4) if whole and killed else None
        return out


def _first_request(run: Run, server: SimProvider) -> float | None:
    """Seconds from the command to the server's first model request (``None``: not in 180 s)."""
    deadline = time.perf_counter() + 180
    while time.perf_counter() < deadline and run.proc.poll() is None:
        if ((server.stats() or {}).get("requests") or 0) > 0:
            return time.perf_counter() - run.started
        time.sleep(0.05)
    return None


def _say(text: str) -> None:
    print(f"[inputs_scale] {text}", file=sys.stderr, flush=True)


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        if r["case"] == "rows":
            for kind in ("inputs", "counted"):
                if kind not in r:
                    continue
                x = r[kind]
                lines.append(
                    f"rows {kind:8} N={r['rows']:>8,}  {x.get('wall_s')} s  ok {x.get('ok_keys')}"
                    f"  driver {x.get('driver_peak_mb')} MB  scheduler {x.get('scheduler_peak_mb')} MB"
                )
        elif r["case"] == "start":
            lines.append(
                f"start    N={r['rows']:>8,}  first request {r['inputs']['first_request_s']} s,"
                f" counted {r['counted']['first_request_s']} s: +{r['added_s']} s"
            )
        else:
            lines.append(
                f"resume   N={r['rows']:>8,}  requests whole {r['whole']['requests']}, killed+rerun "
                f"{r['killed']['requests']}: {r['requests_ratio']}x  ok keys {r['killed']['ok_keys']}"
            )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="rows,start,resume")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--start-rows", type=int, default=1_000_000)
    p.add_argument("--resume-rows", type=int, default=10_000)
    p.add_argument("--kill-at", type=float, default=0.4, help="share of records before the kill")
    p.add_argument(
        "--counted-max-concurrency",
        type=int,
        default=None,
        help="--max-concurrency of the counted batch of the rows case (an --inputs run keeps "
        "the rows in flight the fleet serves; a counted batch starts every clone at once)",
    )
    p.add_argument(
        "--rows-kinds",
        default="inputs,counted",
        help="which runs the rows case makes: inputs, counted or both (comma-separated)",
    )
    p.add_argument(
        "--resume-max-concurrency", type=int, default=None, help="--max-concurrency of both runs"
    )
    p.add_argument(
        "--resume-no-journal",
        action="store_true",
        help="durability off in both runs: the rerun runs again the rows the killed run left",
    )
    p.add_argument(
        "--resume-checkpoint-s",
        type=float,
        default=None,
        help="durability.checkpoint_interval_s of both runs (default: the config's, 1 s)",
    )
    p.add_argument("--latency-ms", type=float, default=200.0)
    p.add_argument("--time-limit-s", type=float, default=1800.0)
    p.add_argument("--clonefleet", default=str(Path(sys.executable).with_name("clonefleet")))
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "inputs_scale.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    bench = Bench(args)
    cases = {"rows": bench.case_rows, "start": bench.case_start, "resume": bench.case_resume}
    results = [cases[name]() for name in args.cases.split(",")]
    print(table(results))
    Path(args.out).write_text(json.dumps({"at": time.time(), "results": results}, indent=2))
    _say(f"wrote {args.out}")
    missed = []
    for r in results:
        if r["case"] == "rows" and "inputs" in r:
            if not (r["inputs"].get("driver_peak_mb") or 0) < 300:
                missed.append("driver RSS")
            if not (r["inputs"].get("scheduler_peak_mb") or 0) < 1000:
                missed.append("scheduler RSS")
        if r["case"] == "start" and not (r.get("added_s") or 99) <= 2.0:
            missed.append("first start")
        if r["case"] == "resume" and not (r.get("requests_ratio") or 99) <= 1.02:
            missed.append("resume requests")
    if missed:
        _say("missed: " + ", ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
