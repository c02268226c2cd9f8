"""The documented cluster path on several machines: ``clonefleet.testing.NetnsCluster`` makes a
head, two workers, a client and a model machine, each a network namespace with its own address
on a private bridge, with ``ray start`` and token authentication; every command below runs on
the machine it names, at the other machines' addresses (never 127.0.0.1 across machines).

One cluster for the module. Without root or ``ip netns`` the module skips with the reason,
unless ``CI`` is set or ``CLONEFLEET_REQUIRE_NETNS=1``: then it fails.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from clonefleet.testing import Machine, NetnsCluster, netns_unsupported
from clonefleet.testing._netns import client_server_failed

pytestmark = pytest.mark.timeout(240)

SLOW = 29
"""The clone index of a slow clone (the one a message is sent to): only batches of 30 clones
or more have one."""
SLOW_STEPS = 40
"""Its turns before its exit, 0.5 s each: it still runs when a client command (some seconds
each, through Ray Client) sends it a message."""
SCRIPT: dict[str, Any] = {
    "default": [
        {"tool": "progress_update", "args": {"summary": "step 1"}, "latency_ms": 200},
        {"tool": "progress_update", "args": {"summary": "step 2"}, "latency_ms": 200},
        {"tool": "exit_tool", "args": {"success": True, "summary": "done"}, "latency_ms": 50},
    ],
    "clones": {
        str(SLOW): [
            *(
                {"tool": "progress_update", "args": {"summary": f"slow {i}"}, "latency_ms": 500}
                for i in range(SLOW_STEPS)
            ),
            {"tool": "exit_tool", "args": {"success": True, "summary": "done"}, "latency_ms": 50},
        ]
    },
}


def requests_of(count: int) -> int:
    """The model requests a batch of ``count`` clones makes under :data:`SCRIPT`, none
    repeated."""
    return count * 3 + (SLOW_STEPS + 1 - 3 if count > SLOW else 0)


def _required() -> bool:
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return ci or os.environ.get("CLONEFLEET_REQUIRE_NETNS") == "1"


@dataclass
class Net:
    cluster: NetnsCluster
    refused: subprocess.Popen[str]
    """A client command started without the token (Ray's client gives up after about 30 s)."""
    batches: list[str] = field(default_factory=list)
    node_ids: dict[str, str] = field(default_factory=dict)

    def cf(
        self, *args: str, machine: Machine | None = None, timeout: float = 150
    ) -> subprocess.CompletedProcess[str]:
        """``clonefleet ARGS`` on the client machine (or ``machine``), with the token."""
        on = machine or self.cluster.client
        done = on.clonefleet(*args, env=self.cluster.client_env(), timeout=timeout)
        if client_server_failed(done.stderr):  # refused before it asked anything: once more
            print(f"{args[0]}: Ray Client's proxy did not start a server; again")
            print(self.cluster.ray_logs("head", "ray_client_server*"))
            done = on.clonefleet(*args, env=self.cluster.client_env(), timeout=timeout)
        return done

    def ids(self) -> dict[str, str]:
        if not self.node_ids:
            self.node_ids = self.cluster.node_ids()
        return self.node_ids


def _processes_naming(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{entry.name}: {cmd[:200]}")
    return found


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _supported() -> None:
    """Skip with the reason when this machine cannot make namespaces (fail where required)."""
    why = netns_unsupported()
    if why is not None:
        if _required():
            pytest.fail(f"{why}, and CI or CLONEFLEET_REQUIRE_NETNS=1 says these tests must run")
        pytest.skip(why)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    _supported()
    cluster = NetnsCluster(workers=2, cpus_per_node=1)
    try:
        cluster.start()
        cluster.serve_script(SCRIPT)
        cluster.write_config(machine=cluster.head)
        refused = cluster.client.popen(
            sys.executable,
            "-m",
            "clonefleet",
            "jobs",
            "list",
            "--address",
            cluster.client_address,
            "--json",
            env=cluster.client_env(token=False),
        )
        with refused:  # its pipes closed, and it waited for, whichever tests ran
            yield Net(cluster, refused)
            cluster.client.kill(refused)
    finally:
        left = cluster.stop()
        assert left == [] and cluster.leftovers() == []
        assert not [n for n in _namespaces() if n.startswith(cluster.prefix)]
        assert _processes_naming(str(cluster.root)) == []


def test_every_machine_has_its_own_address_and_node(net):
    cluster = net.cluster
    ids = net.ids()
    assert set(ids) == {"head", "w1", "w2"}  # keyed by each node's own address, not 127.0.0.1
    addresses = [m.ip for m in cluster.machines.values()]
    assert len(set(addresses)) == 5
    assert all(ipaddress.ip_address(a) in cluster.subnet for a in addresses)


def test_a_batch_through_ray_client_runs_on_every_node_machine(net):
    cluster = net.cluster
    before = cluster.provider_stats()["requests"]
    config = str(cluster.client.home / "config.yaml")
    prompt = "part {{ clone.index }}"
    run = net.cf(
        "run", "general-purpose", "--prompt", prompt, "--count", "12",
        "--address", cluster.client_address, "--config", config, "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(records) == 12 and {r["status"] for r in records} == {"completed"}
    assert {r["model"] for r in records} == {"m"}  # the model machine's provider
    batch = records[0]["batch_id"]
    net.batches.append(batch)
    listed = net.cf("jobs", "list", "--batch", batch, "--address", cluster.client_address, "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    jobs = json.loads(listed.stdout)["jobs"]
    assert {j["node"] for j in jobs} == set(net.ids().values())  # the head and both workers
    assert cluster.provider_stats()["requests"] - before == requests_of(12)


def test_a_detached_batch_with_jobs_events_and_a_message_from_the_client(net):
    cluster = net.cluster
    address, config = cluster.client_address, str(cluster.client.home / "config.yaml")
    before = cluster.provider_stats()["requests"]
    run = net.cf(
        "run", "general-purpose", "--prompt", "detached {{ clone.index }}", "--count", "30",
        "--detach", "--address", address, "--config", config, "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    submitted = json.loads(run.stdout)
    batch, job_ids = submitted["batch_id"], submitted["job_ids"]
    net.batches.append(batch)
    assert len(job_ids) == 30
    sent = net.cf(
        "message", job_ids[SLOW], "a note from the client", "--address", address, "--json"
    )
    assert sent.returncode == 0, sent.stderr[-3000:]
    delivery = json.loads(sent.stdout)
    assert delivery["status"] == "queued"

    waited = net.cf("jobs", "wait", batch, "--timeout", "120", "--address", address, timeout=180)
    assert waited.returncode == 0, waited.stdout + waited.stderr[-3000:]
    # Three client commands at once (each connects through Ray Client for some seconds).
    asked = {
        "events": ("events", batch, "--json"),
        "status": ("message", "--status", delivery["delivery_id"], "--json"),
        "list": ("jobs", "list", "--batch", batch, "--json"),
    }
    with ThreadPoolExecutor(len(asked)) as pool:
        futures = {k: pool.submit(net.cf, *a, "--address", address) for k, a in asked.items()}
        answers = {k: f.result() for k, f in futures.items()}
    for name, answer in answers.items():
        assert answer.returncode == 0, (name, answer.stderr[-3000:])
    envelopes = [json.loads(line) for line in answers["events"].stdout.splitlines()]
    results = [e["subagent_run_id"] for e in envelopes if e["event"]["type"] == "result"]
    assert sorted(results) == sorted(job_ids)  # exactly one result event per job
    assert json.loads(answers["status"].stdout)["status"] == "delivered"
    jobs = json.loads(answers["list"].stdout)["jobs"]
    assert {j["status"] for j in jobs} == {"completed"} and {j["restarts"] for j in jobs} == {0}
    assert {j["node"] for j in jobs} == set(net.ids().values())
    assert next(j for j in jobs if j["job_id"] == job_ids[SLOW])["messages"]["delivered"] == 1
    assert cluster.provider_stats()["requests"] - before == requests_of(30)


def test_the_gcs_address_on_a_machine_of_the_cluster(net):
    """``--address HEAD:6379`` needs a Ray node on the machine the command runs on (Ray's
    driver joins its local node): on the head it runs a batch and lists every batch."""
    cluster = net.cluster
    head, address = cluster.head, cluster.gcs_address
    config = str(head.home / "config.yaml")
    run = net.cf(
        "run", "general-purpose", "--prompt", "from the head", "--count", "3",
        "--address", address, "--config", config, "--json", machine=head,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in run.stdout.splitlines()]
    assert {r["status"] for r in records} == {"completed"} and len(records) == 3
    listed = net.cf("jobs", "list", "--address", address, "--json", machine=head)
    assert listed.returncode == 0, listed.stderr[-3000:]
    batches = {j["batch_id"] for j in json.loads(listed.stdout)["jobs"]}
    assert {*net.batches, records[0]["batch_id"]} <= batches  # one scheduler for every client


def test_the_dashboard_on_the_client_shows_the_clusters_batches(net):
    cluster = net.cluster
    command = [sys.executable, "-m", "clonefleet", "dashboard", "--port", "0"]
    proc = cluster.client.popen(
        *command, "--address", cluster.client_address, env=cluster.client_env()
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "clonefleet dashboard: URL (Ctrl-C stops)"
        if not line:  # it ended before serving: say why
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"the dashboard ended (exit {proc.returncode}): {err[-3000:]}")
        assert line.startswith("clonefleet dashboard: http://127.0.0.1:"), line
        url = line.split()[2]
        deadline = time.monotonic() + 60
        shown: set[str] = set()
        while not set(net.batches) <= shown and time.monotonic() < deadline:
            try:  # 503 until its first read of the job table
                listed = cluster.client.get_json(f"{url}api/batches")["batches"]
                shown = {b["batch_id"] for b in listed}
            except urllib.error.HTTPError as exc:
                assert exc.code == 503, exc
            time.sleep(0.05)
        assert set(net.batches) <= shown
    finally:
        cluster.client.send_signal(proc, signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "dashboard stopped" in err, err[-3000:]


def test_a_client_without_the_token_is_refused_naming_the_token_settings(net):
    out, err = net.refused.communicate(timeout=120)
    assert net.refused.returncode == 1 and not out
    assert "RAY_AUTH_TOKEN" in err and "RAY_AUTH_TOKEN_PATH" in err, err[-3000:]
    assert "docs/cluster.md" in err


def _connections(machine: Machine) -> list[tuple[str, str]]:
    """``(local, peer)`` addresses of the machine's TCP connections."""
    out = machine.run("ss", "-tnH", timeout=30).stdout.splitlines()
    pairs = []
    for line in out:
        fields = line.split()
        local, peer = (f.rsplit(":", 1)[0].strip("[]") for f in fields[3:5])
        pairs.append((local.removeprefix("::ffff:"), peer.removeprefix("::ffff:")))
    return pairs


def test_nothing_talks_outside_the_private_network(net):
    cluster = net.cluster
    own = {ipaddress.ip_address(m.ip) for m in cluster.machines.values()}
    for machine in cluster.machines.values():
        for local, peer in _connections(machine):
            for address in (ipaddress.ip_address(local), ipaddress.ip_address(peer)):
                assert address.is_loopback or address in own, (machine.name, local, peer)
            if not ipaddress.ip_address(peer).is_loopback:  # between machines: its own address
                assert local == machine.ip, (machine.name, local, peer)
    # The host's own network has no connection with the machines'.
    host = subprocess.run(["ss", "-tnH"], capture_output=True, text=True, check=False).stdout
    assert not [
        line for line in host.splitlines() if str(cluster.subnet.network_address)[:-1] in line
    ]


def test_a_cut_machine_is_unreachable_until_healed(net):
    cluster = net.cluster
    w2 = cluster.machines["w2"]
    listening = w2.run("ss", "-tlnH", timeout=30).stdout.splitlines()
    port = next(
        int(f.rsplit(":", 1)[1]) for line in listening if (f := line.split()[3]).startswith(w2.ip)
    )

    def reach(timeout_s: float) -> str:
        try:
            with socket.create_connection((w2.ip, port), timeout=timeout_s):
                return "connected"
        except TimeoutError:
            return "timed out"
        except OSError as exc:
            return exc.strerror or str(exc)

    assert cluster.head.call(lambda: reach(2.0)) == "connected"
    cluster.cut("w2")
    try:
        assert cluster.head.call(lambda: reach(0.5)) == "timed out"  # dropped, not refused
    finally:
        cluster.heal("w2")
    deadline = time.monotonic() + 10
    while (seen := cluster.head.call(lambda: reach(0.5))) != "connected":
        assert time.monotonic() < deadline, seen


KILLED = """
import sys
from clonefleet.testing import NetnsCluster
net = NetnsCluster(workers=0).start()
print(net.prefix, net.root, flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(120)
def test_a_harness_killed_with_sigkill_leaves_nothing():
    """The janitor removes the namespaces, their processes and the folder of a harness whose
    process was killed without a chance to clean up."""
    _supported()
    with subprocess.Popen(
        [sys.executable, "-c", KILLED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline().split()
        assert len(line) == 2, proc.stderr.read()[-3000:]
        prefix, root = line
        assert [n for n in _namespaces() if n.startswith(prefix)]
        assert _processes_naming(root)  # the head's Ray processes
        proc.kill()
    deadline = time.monotonic() + 30
    while [n for n in _namespaces() if n.startswith(prefix)] or _processes_naming(root):
        assert time.monotonic() < deadline, (_namespaces(), _processes_naming(root))
        time.sleep(0.05)
    assert not Path(root).exists()
