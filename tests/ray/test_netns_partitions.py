"""Partitions on a cluster of separate machines (``clonefleet.testing.NetnsCluster``): a worker
cut for less than Ray's node-death timeout (nothing restarts), a worker cut past it and healed
(its clones restart on the others), the client cut from the head (its commands fail, the
batch goes on, and once healed the client reads every result) and the head cut from the
workers (their clones restart on the head, none ends twice). Each scenario measures the time
to detect and to recover, the model requests repeated, and the jobs lost and doubled (both must
be 0). Messages are sent as each partition begins (to the cut worker's clones; from the cut
client): each ends delivered once or undelivered, never twice. The figures are in
docs/cluster.md, "Partitions".

One cluster for the module, its node-death timeout shortened to 5 failed health checks of at
most 1 s each, 1 s apart (Ray's defaults: about a minute). Skips or fails as
``test_netns_cluster.py`` does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from clonefleet.testing import Machine, NetnsCluster
from tests.ray.test_netns_cluster import _supported

pytestmark = pytest.mark.timeout(240)

TURNS = 12
"""Progress turns of every clone before its exit, 0.5 s each."""
LONG = 40
"""Turns of clone 30 (only batches of 31 clones or more have it): 20 s, so that its batch
still runs while client commands connect and are cut (under the 50 turns a clone may take)."""
SCRIPT: dict[str, Any] = {
    "default": [
        *(
            {"tool": "progress_update", "args": {"summary": f"step {i}"}, "latency_ms": 500}
            for i in range(TURNS)
        ),
        {"tool": "exit_tool", "args": {"success": True, "summary": "done"}, "latency_ms": 50},
    ],
    "clones": {
        "30": [
            *(
                {"tool": "progress_update", "args": {"summary": f"long {i}"}, "latency_ms": 500}
                for i in range(LONG)
            ),
            {"tool": "exit_tool", "args": {"success": True, "summary": "done"}, "latency_ms": 50},
        ]
    },
}
HEALTH = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
}
"""Ray's node-death timeout: a node that stops answering is dead after 5 failed checks, 5 to
10 s."""
COUNT = 30
WAIT_LIMIT_S = 45.0
"""How long a client command connected before its client was cut is followed."""

# On the client machine: submit a batch through Ray Client, then read its job table every
# 0.2 s (one JSON line each) until every job has ended, then count each job's result events.
MONITOR = """
import json, queue, sys, threading, time
import ray
from clonefleet import Fleet

fleet = Fleet(sys.argv[1], config=sys.argv[2])
# Hosts of 5 clones, made round-robin over the nodes: every node that runs gets some.
batch = fleet.spawn(
    "general-purpose", "partition {{ clone.index }}", count=int(sys.argv[3]), clones_per_actor=5
)
print(json.dumps({"batch": batch.batch_id}), flush=True)
asked = queue.Queue()  # job ids to send a message to, one JSON list a line on stdin
threading.Thread(target=lambda: [asked.put(json.loads(x)) for x in sys.stdin], daemon=True).start()
sent = {}  # job id: [delivery id, most copies seen in its context, copies in the last look]
ended = ("completed", "failed", "cancelled")
while True:
    while not asked.empty():
        for job in asked.get():
            try:
                sent[job] = [fleet.message(job, "note " + job)["delivery_id"], 0, 0]
            except Exception as exc:
                print(json.dumps({"t": time.time(), "error": str(exc)[:300]}), flush=True)
    try:
        jobs = fleet.list_jobs(batch=batch.batch_id)["jobs"]
        looks = ray.get([fleet._sched.checkpoint_of.remote(j) for j in sent], timeout=10)
    except Exception as exc:
        print(json.dumps({"t": time.time(), "error": str(exc)[:300]}), flush=True)
        continue
    for job, state in zip(list(sent), looks):
        if state:
            texts = [m.get("content") for m in state.get("messages", []) if m.get("role") == "user"]
            copies = sum(1 for t in texts if isinstance(t, str) and ("note " + job) in t)
            sent[job][1], sent[job][2] = max(sent[job][1], copies), copies
    rows = {
        j["job_id"]: [j["status"], j["node"], j["restarts"], (j["progress"] or {}).get("summary")]
        for j in jobs
    }
    print(json.dumps({"t": time.time(), "jobs": rows}), flush=True)
    if len(rows) == int(sys.argv[3]) and all(r[0] in ended for r in rows.values()):
        break
    time.sleep(0.2)
results, cursor = {}, 0
while True:
    page = fleet.events(batch.batch_id, cursor=cursor)
    for envelope in page["events"]:
        if envelope["event"]["type"] == "result":
            job = envelope["subagent_run_id"]
            results[job] = results.get(job, 0) + 1
    if page["cursor"] == cursor:
        break
    cursor = page["cursor"]
messages = {
    job: {"status": fleet.delivery(d)["status"], "most_seen": most, "last_seen": last}
    for job, (d, most, last) in sent.items()
}
print(json.dumps({"results": results, "messages": messages}), flush=True)
fleet.close()
"""


class Monitor:
    """The client's view of one batch, read line by line in a thread."""

    def __init__(self, net: NetnsCluster) -> None:
        config = str(net.client.home / "config.yaml")
        self.proc = net.client.popen(
            sys.executable, "-c", MONITOR, net.client_address, config, str(COUNT),
            env=net.client_env(), stdin=subprocess.PIPE,
        )  # fmt: skip
        self.lines: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # closed by close()
            for line in self.proc.stdout:
                with self.changed:
                    self.lines.append(json.loads(line))
                    self.changed.notify_all()
        with self.changed:
            self.lines.append({"exit": self.proc.wait()})
            self.changed.notify_all()

    def wait_for(
        self, test: Any, timeout_s: float, since: int | None = None, every: bool = False
    ) -> dict[str, Any]:
        """The first job-table line (any line with ``every``) from now on, or from line
        ``since`` on, for which ``test(line)`` holds."""
        deadline = time.monotonic() + timeout_s
        seen = len(self.lines) if since is None else since
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    if (every or "jobs" in line) and test(line):
                        return line
                    assert "exit" not in line, self.proc.stderr.read()[-3000:]  # type: ignore[union-attr]
                seen = len(self.lines)
                left = deadline - time.monotonic()
                assert left > 0, self.lines[-3:]
                self.changed.wait(min(left, 0.05))

    def message(self, job_ids: list[str]) -> None:
        """Have the client send a message to each of ``job_ids`` (at once, one by one)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job_ids) + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout_s: float) -> dict[str, Any]:
        """The batch's end: ``results`` (each job's result events) and ``messages`` (what
        became of each message sent: its delivery's status, and the most copies of it seen in
        its clone's context, in any look and in the last)."""
        line = self.wait_for(lambda line: "results" in line, timeout_s, since=0, every=True)
        self.proc.wait(timeout=30)
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            Machine.kill(self.proc)
        self.thread.join(timeout=30)
        with self.proc:
            pass


@pytest.fixture(scope="module")
def net() -> Iterator[NetnsCluster]:
    _supported()
    cluster = NetnsCluster(workers=2, cpus_per_node=1, system_config=HEALTH)
    try:
        cluster.start()
        cluster.serve_script(SCRIPT)
        yield cluster
    finally:
        assert cluster.stop() == [] and cluster.leftovers() == []


MEASURED: list[dict[str, Any]] = []


def _on(line: dict[str, Any], node: str) -> list[str]:
    jobs = line.get("jobs", {})
    return [j for j, row in jobs.items() if row[1] == node and row[0] == "running"]


def _hold(seconds: float) -> None:
    """Let ``seconds`` pass (a partition's length, in 50 ms steps)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.05)


def _scenario(net: NetnsCluster, victim: str, cut_s: float | None) -> dict[str, Any]:
    """Cut ``victim`` once clones run there: for ``cut_s`` seconds, or (``None``) until its
    clones were restarted elsewhere and 2 s more; then heal it and follow the batch to its end.

    ``detect_s``: from the cut until the scheduler restarted every clone of the victim.
    ``recover_s``: past the timeout, from the cut until every one runs on another node; under
    it, from the heal until every one took a turn again. ``requests`` against
    ``expected_requests``: the model requests made again."""
    node = net.node_ids()[victim]
    before = net.provider_stats()["requests"]
    monitor = Monitor(net)
    try:
        first = monitor.wait_for(lambda line: len(_on(line, node)) >= 3, 120)
        there = set(_on(first, node))
        monitor.message(sorted(there))  # their deliveries are under way as the link goes down
        _hold(0.4)
        mark, cut_at = len(monitor.lines), time.time()
        net.cut(victim)
        detected_at = None
        try:
            if cut_s is None:

                def moved(line: dict[str, Any]) -> bool:
                    jobs = line.get("jobs", {})
                    return all(jobs[j][2] >= 1 or jobs[j][1] != node for j in there)

                detected_at = monitor.wait_for(moved, 90)["t"]
                _hold(2.0)
            else:
                _hold(cut_s)
        finally:
            net.heal(victim)
        healed_at = time.time()
        if cut_s is None:  # recovered: every clone of the victim runs on another node (or ended)

            def back(line: dict[str, Any]) -> bool:
                jobs = line.get("jobs", {})
                return all(
                    jobs[j][0] == "completed" or jobs[j][1] not in (None, node) for j in there
                )

            recovered_at = monitor.wait_for(back, 90, since=mark)["t"] - cut_at
        else:  # recovered: every clone of the victim took a turn since the link came back
            at_heal = next(line for line in reversed(monitor.lines) if "jobs" in line)["jobs"]

            def back(line: dict[str, Any]) -> bool:
                jobs = line.get("jobs", {})
                return all(jobs[j][0] == "completed" or jobs[j][3] != at_heal[j][3] for j in there)

            recovered_at = monitor.wait_for(back, 90)["t"] - healed_at
        end = monitor.finish(150)
        last = next(line for line in reversed(monitor.lines) if "jobs" in line)
    finally:
        monitor.close()
    results, messages = end["results"], end["messages"]
    requests = net.provider_stats()["requests"] - before
    statuses = [row[0] for row in last["jobs"].values()]
    measured = {
        "victim": victim,
        "cut_s": round(healed_at - cut_at, 1),
        "clones_there": len(there),
        "detect_s": None if detected_at is None else round(detected_at - cut_at, 1),
        "recover_s": round(recovered_at, 1),
        "restarted": sum(1 for row in last["jobs"].values() if row[2]),
        "requests": requests,
        "expected_requests": COUNT * (TURNS + 1),
        "completed": statuses.count("completed"),
        "lost": sum(1 for j in last["jobs"] if results.get(j, 0) == 0),
        "doubled": sum(1 for n in results.values() if n > 1),
        "messages": _deliveries(messages, len(there)),
    }
    MEASURED.append(measured)
    print(json.dumps(measured))
    return measured


def _deliveries(messages: dict[str, dict[str, Any]], sent: int) -> dict[str, Any]:
    """What became of the messages sent as the partition began: ``delivered`` (its delivery
    says so and its clone's context held it once), ``undelivered`` (its job ended first: its
    context never held it), ``twice`` and ``wrong`` (any other ending; both must be 0)."""
    out: dict[str, Any] = {"sent": sent, "delivered": 0, "undelivered": 0, "twice": 0, "wrong": 0}
    for seen in messages.values():
        if seen["most_seen"] > 1:
            out["twice"] += 1
        elif seen["status"] == "delivered" and seen["most_seen"] == 1:
            out["delivered"] += 1
        elif seen["status"] == "undelivered" and seen["most_seen"] == 0:
            out["undelivered"] += 1
        else:
            out["wrong"] += 1
            out.setdefault("odd", []).append(seen)
    out["wrong"] += sent - len(messages)  # a message the client could not send
    return out


def _stuck(net: NetnsCluster, monitor: Monitor, there: set[str], away: set[str]) -> str:
    """Why the jobs of ``there`` did not all run elsewhere: their rows in the latest job
    table, and the latest events of three of those still on a node of ``away`` (or none)."""
    last = next((line for line in reversed(monitor.lines) if "jobs" in line), {"jobs": {}})
    rows = {j: last["jobs"].get(j) for j in sorted(there)}
    stuck = [
        j for j, row in rows.items() if row and row[0] != "completed" and row[1] in (None, *away)
    ]
    lines = [f"jobs not back {len(stuck)} of {len(there)}: {json.dumps(rows)}"]
    for job in stuck[:3]:
        got = net.client.clonefleet(
            "events", job, "--address", net.client_address, "--json", env=net.client_env()
        )
        kinds = [json.loads(x)["event"] for x in got.stdout.splitlines()[-8:]]
        lines.append(f"{job}: {json.dumps(kinds)[:1500]} {got.stderr[-500:]}")
    return "\n".join(lines)


def _delivered_once(got: dict[str, Any]) -> bool:
    seen = got["messages"]
    return seen["twice"] == 0 and seen["wrong"] == 0 and seen["sent"] > 0


def test_a_worker_cut_for_less_than_the_node_timeout_restarts_nothing(net):
    got = _scenario(net, "w1", cut_s=2.0)  # under the 5 checks' 5 s at least
    assert got["completed"] == COUNT and got["lost"] == 0 and got["doubled"] == 0, got
    assert _delivered_once(got), got
    assert got["restarted"] == 0, got


def test_a_worker_cut_past_the_node_timeout_has_its_clones_restarted_elsewhere(net):
    got = _scenario(net, "w2", cut_s=None)
    assert got["completed"] == COUNT and got["lost"] == 0 and got["doubled"] == 0, got
    assert _delivered_once(got), got
    assert got["restarted"] >= got["clones_there"] > 0, got
    assert got["detect_s"] is not None and got["detect_s"] < 30, got


def _end_of(proc: subprocess.Popen[str], since: float) -> tuple[float, int | None, str]:
    """When ``proc`` ended (seconds after ``since``), its exit status and its stderr."""
    _, err = proc.communicate()
    return time.monotonic() - since, proc.returncode, err


def test_a_client_cut_from_the_head_fails_its_commands_and_reads_every_result_once_healed(net):
    client, address = net.client, net.client_address
    config = str(client.home / "config.yaml")
    before = net.provider_stats()["requests"]
    run = client.clonefleet(
        "run", "general-purpose", "--prompt", "while cut {{ clone.index }}", "--count", str(COUNT + 1),
        "--detach", "--address", address, "--config", config, "--json", env=net.client_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    submitted = json.loads(run.stdout)
    batch, long_job = submitted["batch_id"], submitted["job_ids"][30]
    env = net.client_env()
    python = [sys.executable, "-m", "clonefleet"]
    # Connected before the cut: waiting for the batch (its call's deadline: 20 s plus 2 s), and
    # following its events (each call's deadline: its 0.5 s wait plus 2 s; its first event says
    # it is connected).
    waiting = client.popen(
        *python, "jobs", "wait", batch, "--timeout", "20", "--address", address, env=env
    )
    following = client.popen(*python, "events", batch, "--follow", "--address", address, env=env)
    # Under way as the client is cut: a message to the long clone (delivered once, or never).
    note = "sent as the client is cut"
    sending = client.popen(
        *python, "message", long_job, note, "--address", address, "--json", env=env
    )
    assert following.stdout is not None
    assert following.stdout.readline(), following.stderr.read()[-3000:]  # type: ignore[union-attr]
    cut_at = time.monotonic()
    net.cut("client")
    ended: dict[str, tuple[float, int | None, str]] = {}
    try:
        fresh = client.clonefleet(
            "jobs", "list", "--address", address, "--json", env=env, timeout=150
        )
        ended["fresh"] = (time.monotonic() - cut_at, fresh.returncode, fresh.stderr)
        # Each followed to its end at once (its output read as it comes), none past
        # WAIT_LIMIT_S from the cut.
        procs = {"sending": sending, "following": following, "waiting": waiting}
        with ThreadPoolExecutor(len(procs)) as pool:
            ends = {name: pool.submit(_end_of, proc, cut_at) for name, proc in procs.items()}
            concurrent.futures.wait(
                ends.values(), timeout=WAIT_LIMIT_S - (time.monotonic() - cut_at)
            )
            for name, proc in procs.items():
                if not ends[name].done():
                    client.kill(proc)
            ended.update((name, end.result(timeout=30)) for name, end in ends.items())
        if ended["sending"][1] == 0:
            ended["sending"] = (*ended["sending"][:2], "")
    finally:
        net.heal("client")
        healed_at = time.monotonic()
        for proc in (sending, following, waiting):
            with proc:
                if proc.poll() is None:
                    client.kill(proc)
    measured: dict[str, Any] = {"scenario": "client cut"}
    for name, (took, rc, err) in ended.items():
        measured[f"{name}_s"] = round(took, 1)
        measured[f"{name}_rc"] = rc  # negative: killed, still running at WAIT_LIMIT_S
        measured[f"{name}_error"] = err.strip().splitlines()[-1:]
    print(json.dumps(measured))
    # Each fails within its deadline, saying the cluster cannot be reached: a new command
    # after the 10 s it gives the head's port, the connected ones within seconds, whatever
    # their call's deadline (a call through Ray Client that has run 5 s tries the head's port
    # every 2 s, each try given 2 s).
    limits = {"fresh": 10 + 8.0, "following": 5 + 4 + 6.0, "waiting": 5 + 4 + 6.0}
    limits["sending"] = limits["fresh"]  # connecting, or its one call (not made again)
    for name, limit in limits.items():
        took, rc, err = ended[name]
        sent = name == "sending" and rc == 0  # it got through before the cut
        assert sent or (rc == 1 and "cannot be reached" in err and took < limit), (name, measured)
    wait = ("jobs", "wait", batch, "--timeout", "120", "--address", address)
    waited = client.clonefleet(*wait, env=env, timeout=180)
    measured["read_after_heal_s"] = round(time.monotonic() - healed_at, 1)
    print(json.dumps(measured))
    assert waited.returncode == 0, waited.stderr[-3000:] + net.ray_logs(
        "head", "ray_client_server*"
    )
    events = client.clonefleet("events", batch, "--address", address, "--json", env=env)
    assert events.returncode == 0, events.stderr[-3000:]
    results = [
        e["subagent_run_id"]
        for e in map(json.loads, events.stdout.splitlines())
        if e["event"]["type"] == "result"
    ]
    assert len(results) == COUNT + 1 == len(set(results))  # none lost, none doubled
    # The message: delivered once if the client was told it was queued, else at most once.
    listed = client.clonefleet("jobs", "list", "--batch", batch, "--address", address, "--json",
                               env=env)  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-3000:]
    long_record = next(j for j in json.loads(listed.stdout)["jobs"] if j["job_id"] == long_job)
    measured["message"] = long_record["messages"]
    print(json.dumps(measured))
    assert sum(long_record["messages"].values()) <= 1, measured
    if ended["sending"][1] == 0:
        assert long_record["messages"]["delivered"] == 1, measured
    # The batch went on, no request made twice.
    assert net.provider_stats()["requests"] - before == COUNT * (TURNS + 1) + LONG + 1
    MEASURED.append(measured)


def test_the_head_cut_from_the_workers_past_the_timeout_ends_every_job_once(net):
    """The head (its GCS and the scheduler) loses both workers, the client and the model still
    reach it: Ray declares the workers dead and the scheduler restarts their clones on the
    head. The workers' old clones cannot report; once healed, Ray ends those nodes (a dead
    node never rejoins), so no job ends twice. How long the old clones went on calling the
    model is measured at the provider (its relay counts requests by machine)."""
    ids = net.node_ids()
    workers = [w.name for w in net.workers if w.name in ids]  # w2 left, dead, in an earlier test
    assert workers, ids
    away = {ids[name] for name in workers}
    before = net.provider_stats()["requests"]
    monitor = Monitor(net)
    try:

        def spread(line: dict[str, Any]) -> bool:
            return all(len(_on(line, ids[name])) >= 3 for name in workers)

        first = monitor.wait_for(spread, 120)
        there = {j for name in workers for j in _on(first, ids[name])}
        mark, cut_at = len(monitor.lines), time.time()
        net.cut_between("head", workers)
        try:

            def moved(line: dict[str, Any]) -> bool:
                jobs = line.get("jobs", {})
                return all(jobs[j][2] >= 1 or jobs[j][0] == "completed" for j in there)

            detected_at = monitor.wait_for(moved, 90)["t"]
            _hold(2.0)
        finally:
            net.heal_between("head", workers)
        healed_at = time.time()

        def back(line: dict[str, Any]) -> bool:
            jobs = line.get("jobs", {})
            return all(jobs[j][0] == "completed" or jobs[j][1] not in (None, *away) for j in there)

        try:
            recovered_at = monitor.wait_for(back, 90, since=mark)["t"]
        except AssertionError:
            pytest.fail(_stuck(net, monitor, there, away))
        results = monitor.finish(150)["results"]
        last = next(line for line in reversed(monitor.lines) if "jobs" in line)
    finally:
        monitor.close()
    requests = net.provider_stats()["requests"] - before
    sources = net.provider_sources()
    statuses = [row[0] for row in last["jobs"].values()]
    stale = [sources.get(name, {}).get("last_at", 0.0) - cut_at for name in workers]
    measured = {
        "victim": "head, from both workers",
        "cut_s": round(healed_at - cut_at, 1),
        "clones_there": len(there),
        "detect_s": round(detected_at - cut_at, 1),
        "recover_s": round(recovered_at - cut_at, 1),
        "restarted": sum(1 for row in last["jobs"].values() if row[2]),
        "requests": requests,
        "expected_requests": COUNT * (TURNS + 1),
        "workers_last_request_after_cut_s": [round(s, 1) for s in stale],
        "completed": statuses.count("completed"),
        "lost": sum(1 for j in last["jobs"] if results.get(j, 0) == 0),
        "doubled": sum(1 for n in results.values() if n > 1),
    }
    MEASURED.append(measured)
    print(json.dumps(measured))
    assert measured["completed"] == COUNT and measured["lost"] == 0, measured
    assert measured["doubled"] == 0 and measured["restarted"] >= len(there), measured
