"""Issue 28's target: a batch on worker machines against the same batch on one loopback node.

Both cases run on ``clonefleet.testing.NetnsCluster`` (root, ``ip netns``; docs/cluster.md, "A
cluster on one Linux machine"), with the same definition, prompt, simulated provider (``provider
serve --latency-ms L``, a script of ``--turns`` model requests per clone), ``--count`` and
total CPUs, so the scheduler makes the same number of clone hosts (one per CPU) in both:

- ``A`` (machines): a head with no CPUs (``head_cpus=0``: the scheduler puts no clone host
  there), ``--workers`` workers sharing ``--cpus`` CPUs, the provider on the model machine
  (behind the harness's relay), and ``clonefleet run ... --address ray://HEAD:10001`` on the
  client machine.
- ``B`` (loopback): one machine, its node holding all ``--cpus`` CPUs, the provider on its
  127.0.0.1, and the same command run on that machine (``ray://`` its own address, over its
  loopback interface). ``--loopback-provider model`` puts B's provider on the model machine
  behind the relay instead, as in A: what the relay and the bridge cost, apart.

Each cluster first runs a small warm-up batch (the scheduler actor and its warm hosts start
there, in both cases), then ``--repeat`` timed batches. Per batch: ``command`` is the seconds
from starting the command to its last record (the target's makespan), ``wall`` to its exit,
``submit`` from the command to the batch's first job (Python start, Ray Client's connection, the
submission), ``batch`` from the first job created to the last ended (``jobs list --batch``),
``first start`` from the first job created to the first clone started. The target is on the
median ``command`` of A over B (at most ``--target``); the ``batch`` ratio is shown beside it.

    python benchmarks/netns_fanout.py [--count 1000] [--workers 3] [--cpus 3]
        [--latency-ms 200] [--turns 2] [--repeat 3] [--warmup-count 3]
        [--clones-per-actor K] [--cases A,B] [--loopback-provider local|model]
        [--target 1.2] [--time-limit-s 300]
        [--out benchmarks/results/netns_fanout.json]

Prints a table and writes JSON; exits 1 when the target is missed (or a batch failed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from clonefleet.testing import Machine, NetnsCluster, netns_unsupported
from clonefleet.testing._netns import client_server_failed

RESULTS = Path(__file__).parent / "results" / "netns_fanout.json"
PROMPT = "Summarise file_{{ clone.index }}.py"
LOOPBACK_PORT = 8001
CASES = {"A": "machines", "B": "loopback"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="clones per timed batch")
    parser.add_argument("--workers", type=int, default=3, help="worker machines of case A")
    parser.add_argument("--cpus", type=int, default=3, help="CPUs of each case, in all")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="server delay per request")
    parser.add_argument("--turns", type=int, default=2, help="model requests per clone")
    parser.add_argument("--repeat", type=int, default=3, help="timed batches per case")
    parser.add_argument("--warmup-count", type=int, default=3, help="clones of the warm-up batch")
    parser.add_argument(
        "--clones-per-actor", type=int, default=None, help="override the automatic choice"
    )
    parser.add_argument("--cases", default="A,B", help="A (machines), B (loopback), or both")
    parser.add_argument(
        "--loopback-provider",
        choices=("local", "model"),
        default="local",
        help="B's provider: on its own 127.0.0.1 (local), or on the model machine behind the "
        "relay as in A (model: what the relay and the bridge cost)",
    )
    parser.add_argument("--target", type=float, default=1.2, help="most A/B of the makespans")
    parser.add_argument("--time-limit-s", type=float, default=300.0, help="longest wait per batch")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


def _script(turns: int) -> dict[str, Any]:
    """Every clone makes ``turns`` model requests: ``turns - 1`` progress updates, then its exit."""
    steps: list[dict[str, Any]] = [
        {"tool": "progress_update", "args": {"summary": f"turn {i + 1}"}} for i in range(turns - 1)
    ]
    steps.append({"tool": "exit_tool", "args": {"success": True, "summary": "done"}})
    return {"default": steps}


def _config(base_url: str, clones_per_actor: int | None) -> str:
    """The same config in both cases but for the provider's address."""
    text = (
        "version: 1\n"
        "providers:\n"
        f'  sim: {{kind: openai, base_url: "{base_url}"}}\n'
        "models:\n"
        "  m: {provider: sim, name: sim-small}\n"
        "model_groups:\n"
        "  default: [m]\n"
    )
    if clones_per_actor is not None:
        text += f"limits: {{clones_per_actor: {clones_per_actor}}}\n"
    return text


class Case:
    """One cluster, its provider and the machine its commands run on."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        if name == "A":
            if args.cpus % args.workers:
                raise SystemExit("--cpus must split evenly over --workers")
            per = args.cpus // args.workers
            self.net = NetnsCluster(args.workers, cpus_per_node=per, head_cpus=0)
        else:
            self.net = NetnsCluster(0, cpus_per_node=args.cpus)
        self.stats_url = ""
        self.stats_of = self.net.model
        self.names: dict[str, str] = {}
        """Each node's machine, by Ray node id."""
        self.provider: subprocess.Popen[str] | None = None

    @property
    def runner(self) -> Machine:
        return self.net.client if self.name == "A" else self.net.head

    def start(self) -> None:
        net, args = self.net, self.args
        net.start()
        serve = ["--latency-ms", str(args.latency_ms), "--seed", "0"]
        if self.name == "A" or args.loopback_provider == "model":
            script = net.model.home / "script.json"
            script.write_text(json.dumps(_script(args.turns)))
            url = net.serve_provider(*serve, "--script", str(script))
            self.stats_of = net.model
        else:
            script = net.head.home / "script.json"
            script.write_text(json.dumps(_script(args.turns)))
            url = self._serve_on_head([*serve, "--script", str(script)])
            self.stats_of = net.head
        self.stats_url = url.removesuffix("/v1") + "/sim/stats"
        (self.runner.home / "config.yaml").write_text(_config(url, args.clones_per_actor))

    def _serve_on_head(self, serve: list[str]) -> str:
        head = self.net.head
        log = (head.root / "provider.log").open("w")
        command = [sys.executable, "-m", "clonefleet", "provider", "serve"]
        self.provider = head.popen(
            *command, "--port", str(LOOPBACK_PORT), *serve, stdout=log, stderr=log
        )
        log.close()  # the child has its own copy
        url = f"http://127.0.0.1:{LOOPBACK_PORT}"
        deadline = time.monotonic() + 30
        while True:
            try:
                head.get_json(f"{url}/v1/models", timeout_s=1.0)
                return f"{url}/v1"
            except OSError:
                if self.provider.poll() is not None or time.monotonic() > deadline:
                    text = (head.root / "provider.log").read_text(errors="replace")
                    raise RuntimeError(f"the provider did not start:\n{text[-3000:]}") from None
                time.sleep(0.05)

    def requests(self) -> int:
        stats: dict[str, Any] = self.stats_of.get_json(self.stats_url)
        return int(stats["requests"])

    def stop(self) -> list[str]:
        if self.provider is not None:
            Machine.kill(self.provider)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.provider.wait(timeout=10)
        return self.net.stop() + self.net.leftovers()

    def clonefleet(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """``clonefleet ARGS`` on the runner, once more when Ray Client's proxy did not start
        a server for it (before it asked the cluster anything)."""
        argv = [*args, "--address", self.net.client_address]
        done = self.runner.clonefleet(*argv, env=self.net.client_env(), timeout=timeout)
        if client_server_failed(done.stderr):
            done = self.runner.clonefleet(*argv, env=self.net.client_env(), timeout=timeout)
        return done

    def batch(self, count: int) -> dict[str, Any]:
        """One ``run --count COUNT --json`` on the runner, timed as its records come."""
        out = self._timed_run(count)
        if not out["records"] and client_server_failed(out["stderr"]):
            out = {**self._timed_run(count), "retried": True}
        del out["stderr"]
        return out

    def _timed_run(self, count: int) -> dict[str, Any]:
        config = str(self.runner.home / "config.yaml")
        command = [sys.executable, "-m", "clonefleet", "run", "general-purpose"]
        command += ["--prompt", PROMPT, "--count", str(count), "--config", config, "--json"]
        command += ["--address", self.net.client_address]
        err = (self.runner.root / "run.stderr").open("w+")
        before = self.requests()
        started_wall, started = time.time(), time.perf_counter()
        proc = self.runner.popen(*command, env=self.net.client_env(), stderr=err)
        timer = threading.Timer(self.args.time_limit_s, Machine.kill, (proc,))
        timer.start()
        records: list[dict[str, Any]] = []
        first = last = 0.0
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{"):
                    last = time.perf_counter() - started
                    first = first or last
                    records.append(json.loads(line))
            proc.wait(timeout=60)
        except BaseException:
            Machine.kill(proc)
            raise
        finally:
            timer.cancel()
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
        err.close()
        ok = sum(1 for r in records if r["status"] == "completed" and r["outcome"] == "success")
        out: dict[str, Any] = {
            "count": count,
            "exit_status": proc.returncode,
            "records": len(records),
            "completed_success": ok,
            "command_s": round(last, 3),
            "first_record_s": round(first, 3),
            "wall_s": round(wall, 3),
            "model_requests": self.requests() - before,
            "stderr": stderr,
            "stderr_tail": stderr[-600:] if proc.returncode else "",
        }
        if records:
            out.update(self._jobs(records[0]["batch_id"], started_wall))
        return out

    def _jobs(self, batch: str, started_wall: float) -> dict[str, Any]:
        """When the batch's jobs were created, started and ended, and where they ran."""
        listed = self.clonefleet("jobs", "list", "--batch", batch, "--json", timeout=120)
        if listed.returncode != 0:
            return {"batch_id": batch, "jobs_error": listed.stderr[-600:]}
        jobs = json.loads(listed.stdout)["jobs"]
        created = min(j["created_at"] for j in jobs)
        started = [j["started_at"] for j in jobs if j["started_at"] is not None]
        ended = max(j["ended_at"] for j in jobs if j["ended_at"] is not None)
        if not self.names:
            self.names = {node: name for name, node in self.net.node_ids().items()}
        per_node: dict[str, int] = {}
        for job in jobs:
            where = self.names.get(job["node"], str(job["node"]))
            per_node[where] = per_node.get(where, 0) + 1
        return {
            "batch_id": batch,
            "submit_s": round(created - started_wall, 3),
            "batch_s": round(ended - created, 3),
            "first_start_s": round(min(started) - created, 3) if started else None,
            "hosts": len({(j["node"], j["host"]) for j in jobs}),
            "jobs_per_node": dict(sorted(per_node.items())),
        }


def run_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    case = Case(name, args)
    out: dict[str, Any] = {"case": name, "kind": CASES[name], "batches": []}
    started = time.perf_counter()
    try:
        case.start()
        out["cluster_start_s"] = round(time.perf_counter() - started, 2)
        if args.warmup_count:
            warm = case.batch(args.warmup_count)
            out["warmup"] = {k: warm.get(k) for k in ("records", "exit_status", "wall_s")}
        for i in range(args.repeat):
            batch = case.batch(args.count)
            print(f"{name} #{i + 1}: {json.dumps(batch)}", file=sys.stderr)
            out["batches"].append(batch)
    finally:
        out["leftovers"] = case.stop()
    return out


def _summary(batches: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    values = [b[key] for b in batches if isinstance(b.get(key), int | float)]
    if not values:
        return {"min": None, "median": None}
    return {"min": min(values), "median": round(statistics.median(values), 3)}


METRICS = ("command_s", "wall_s", "submit_s", "batch_s", "first_start_s")


def table(cases: dict[str, dict[str, Any]]) -> str:
    head = f"{'case':<14}" + "".join(f"{m.removesuffix('_s') + ' min/med s':>24}" for m in METRICS)
    lines = [head + f"{'hosts':>7}  jobs per node"]
    for name, case in cases.items():
        row = f"{name + ' ' + case['kind']:<14}"
        for metric in METRICS:
            s = case["summary"][metric]
            cell = "-" if s["min"] is None else f"{s['min']:.2f} / {s['median']:.2f}"
            row += f"{cell:>24}"
        last = case["batches"][-1] if case["batches"] else {}
        lines.append(row + f"{last.get('hosts', '-')!s:>7}  {last.get('jobs_per_node', '-')}")
    return "\n".join(lines)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    args = _parser().parse_args()
    why = netns_unsupported()
    if why is not None:
        print(f"netns_fanout: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated run still removes its clusters
    names = [c.strip().upper() for c in args.cases.split(",") if c.strip()]
    cases: dict[str, dict[str, Any]] = {}
    for name in names:
        cases[name] = run_case(name, args)
        cases[name]["summary"] = {m: _summary(cases[name]["batches"], m) for m in METRICS}
    params = {k: v for k, v in vars(args).items() if k != "out"}
    print(f"netns_fanout: {json.dumps(params)}")
    print(table(cases))
    failed = [
        f"{n} batch {i + 1}: {b['completed_success']}/{b['count']} ok, exit {b['exit_status']}"
        for n, c in cases.items()
        for i, b in enumerate(c["batches"])
        if b["completed_success"] != b["count"] or b["exit_status"] != 0
    ]
    failed += [f"{n}: left behind {c['leftovers']}" for n, c in cases.items() if c["leftovers"]]
    ratios: dict[str, float | None] = {}
    if "A" in cases and "B" in cases:
        for metric in ("command_s", "batch_s"):
            a, b = (cases[c]["summary"][metric]["median"] for c in ("A", "B"))
            ratios[metric] = round(a / b, 3) if a and b else None
    verdict = None
    if ratios.get("command_s") is not None:
        verdict = ratios["command_s"] <= args.target
        print(
            f"A/B median command-to-last-record: {ratios['command_s']}x "
            f"(target <= {args.target}x: {'met' if verdict else 'MISSED'}); "
            f"A/B median batch (first job created to last ended): {ratios['batch_s']}x"
        )
    for line in failed:
        print(f"FAILED: {line}")
    doc = {
        "params": params,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "cases": cases,
        "ratios_a_over_b": ratios,
        "target": {"metric": "median command_s, A/B", "at_most": args.target, "met": verdict},
        "failures": failed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 1 if failed or verdict is False else 0


if __name__ == "__main__":
    raise SystemExit(main())
