"""A client of a persistent cluster: `--address auto` finds only `cluster up`'s cluster, every
call has a deadline (a frozen scheduler included), `jobs` ships nothing, `cluster down` is fast.

Each test that needs a cluster starts one with `clonefleet cluster up` and its own state folder
(`CLONEFLEET_STATE_DIR` in the test's temporary folder) and always takes it down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from clonefleet.cluster import _local
from clonefleet.errors import ClusterError

pytestmark = pytest.mark.timeout(240)

HANG = "default:\n" + "  - {hang: true}\n" * 10
"""A simulation script whose clones wait on the model (a minute per attempt, ten attempts)."""


def _clonefleet(
    *args: str, cwd: Path, env: Mapping[str, str], timeout: float = 150
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``python -m clonefleet ARGS``; also how long it took."""
    full = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **env}
    if "RAY_ADDRESS" not in env:
        full.pop("RAY_ADDRESS", None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "clonefleet", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - started


@dataclass(frozen=True, slots=True, kw_only=True)
class Up:
    """A cluster `cluster up` started, with a detached batch of hanging clones."""

    env: dict[str, str]
    work: Path
    daemon_pid: int
    batch_id: str

    def run(self, *args: str, **extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
        return _clonefleet(*args, cwd=self.work, env={**self.env, **extra})

    def scheduler_pid(self) -> int:
        """The scheduler actor's process, found among the daemon's session."""
        for pid in _local.session_pids(self.daemon_pid):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::SchedulerActor"):
                    return pid
            except OSError:
                continue
        raise AssertionError("no scheduler process in the cluster's session")


@contextmanager
def _cluster_up(base: Path, clones: int) -> Iterator[Up]:
    env = {"CLONEFLEET_STATE_DIR": str(base / "state"), "CLONEFLEET_CACHE_DIR": str(base / "cache")}
    work = base / "work"
    work.mkdir(parents=True)
    (work / "hang.yaml").write_text(HANG)
    try:
        up, _ = _clonefleet("cluster", "up", "--cpus-per-node", "1", "--json", cwd=work, env=env)
        assert up.returncode == 0, up.stderr
        detach, _ = _clonefleet(
            *("run", "general-purpose", "--prompt", "wait", "--count", str(clones)),
            *("--detach", "--address", "auto", "--json", "--sim-script", "hang.yaml"),
            cwd=work,
            env=env,
        )
        assert detach.returncode == 0, detach.stderr
        yield Up(
            env=env,
            work=work,
            daemon_pid=int(json.loads(up.stdout)["pid"]),
            batch_id=json.loads(detach.stdout)["batch_id"],
        )
    finally:
        _clonefleet("cluster", "down", cwd=work, env=env, timeout=60)


@contextmanager
def _frozen(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with _cluster_up(tmp_path_factory.mktemp("cluster-client"), clones=2) as up:
        yield up


def test_auto_without_a_cluster_fails_fast_and_never_joins_an_embedded_ray(
    ray_cluster, tmp_path, monkeypatch
):
    import ray

    embedded = ray.get_runtime_context().gcs_address  # this process runs an embedded Ray
    (tmp_path / "hang.yaml").write_text(HANG)
    env = {"CLONEFLEET_STATE_DIR": str(tmp_path / "state")}
    request = ("run", "general-purpose", "--prompt", "x", "--detach", "--sim-script", "hang.yaml")
    for extra_args, extra_env in ((("--address", "auto"), {}), ((), {"RAY_ADDRESS": "auto"})):
        done, took = _clonefleet(*request, *extra_args, cwd=tmp_path, env={**env, **extra_env})
        assert done.returncode == 1, done.stderr
        assert "`clonefleet cluster up`" in done.stderr
        assert took < 3.0

    from clonefleet import Fleet

    monkeypatch.setenv("CLONEFLEET_STATE_DIR", str(tmp_path / "state"))
    started = time.monotonic()
    with pytest.raises(ClusterError, match="`clonefleet cluster up`"):
        Fleet("auto", cwd=tmp_path)
    assert time.monotonic() - started < 1.0
    assert ray.get_runtime_context().gcs_address == embedded


def test_a_process_on_one_ray_refuses_another_clusters_address(ray_cluster, tmp_path, monkeypatch):
    import socket

    from clonefleet import Fleet

    monkeypatch.setenv("CLONEFLEET_STATE_DIR", str(tmp_path / "state"))
    with socket.create_server(("127.0.0.1", 0)) as other:
        address = f"127.0.0.1:{other.getsockname()[1]}"
        _local._write_token(_local.token_path())
        record = {"address": address, "pid": os.getpid(), "ready": True}
        _local.state_path().write_text(json.dumps(record))
        with pytest.raises(ClusterError, match="already connected to Ray at"):
            Fleet("auto", cwd=tmp_path)


def test_jobs_wait_returns_within_its_timeout_plus_two_seconds_when_the_scheduler_is_frozen(
    cluster,
):
    with _frozen(cluster.scheduler_pid()):
        done, took = cluster.run("jobs", "wait", cluster.batch_id, "--timeout", "3")
    assert done.returncode == 1
    assert "did not answer within" in done.stderr and "frozen" in done.stderr
    assert took <= 3 + 2
    listing, _ = cluster.run("jobs", "list", "--json")  # thawed: answers again
    assert listing.returncode == 0, listing.stderr


def test_jobs_wait_on_a_healthy_scheduler_returns_at_its_timeout(cluster):
    done, took = cluster.run("jobs", "wait", cluster.batch_id, "--timeout", "2")
    assert done.returncode == 1 and "timed out after 2s" in done.stderr
    assert 1.9 <= took <= 2 + 2  # counted from the process's start


_FROZEN_BLOCK = """
import json, os, signal, sys, time
from clonefleet import Fleet
from clonefleet.errors import ClusterError
fleet = Fleet("auto", ship_package=False)
os.kill(int(sys.argv[1]), signal.SIGSTOP)
started = time.monotonic()
try:
    fleet.job_block([sys.argv[2]], timeout_seconds=2)
    out = {"error": None}
except ClusterError as exc:
    out = {"error": str(exc)}
finally:
    os.kill(int(sys.argv[1]), signal.SIGCONT)
out["took"] = time.monotonic() - started
fleet.close()
print(json.dumps(out))
"""


def test_fleet_job_block_fails_its_wait_plus_margin_after_the_scheduler_freezes(cluster):
    # In a process of its own: this one may be connected to the session's embedded Ray.
    pid = cluster.scheduler_pid()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FROZEN_BLOCK, str(pid), cluster.batch_id],
            cwd=cluster.work,
            env={**os.environ, **cluster.env},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert "did not answer within 4 s" in out["error"]
    assert out["took"] <= 2 + 2 + 0.5


def test_job_control_commands_ship_no_package(cluster, tmp_path):
    fresh_cache = tmp_path / "cache"
    for args in (
        ("jobs", "list"),
        ("jobs", "status", cluster.batch_id),
        ("events", cluster.batch_id),
    ):
        done, _ = cluster.run(*args, CLONEFLEET_CACHE_DIR=str(fresh_cache))
        assert done.returncode == 0, done.stderr
    assert not (fresh_cache / "packages").exists()
    snapshots = list((Path(cluster.env["CLONEFLEET_CACHE_DIR"]) / "packages").iterdir())
    assert len(snapshots) == 1  # `run --detach` made the one it shipped


def test_cluster_down_ends_a_busy_cluster_within_five_seconds(tmp_path):
    with _cluster_up(tmp_path, clones=4) as up:
        deadline = time.monotonic() + 90
        while True:
            listing, _ = up.run("jobs", "list", "--json")
            assert listing.returncode == 0, listing.stderr
            if json.loads(listing.stdout)["capacity"]["running"] >= 1:
                break
            assert time.monotonic() < deadline, "no job started"
        before = _local.session_pids(up.daemon_pid)
        down, took = up.run("cluster", "down", "--json")
        assert down.returncode == 0, down.stderr
        stopped = json.loads(down.stdout)
        assert stopped["stopped"] is True
        assert stopped["running_jobs_ended"] == 4  # none of the 4 had ended (read from the journal)
        assert took < 5.0
        assert len(before) > 5 and _local.session_pids(up.daemon_pid) == []
        assert not (tmp_path / "state" / "cluster.json").exists()


_RESTARTED_BLOCK = """
import json, os, signal, sys, threading, time
from clonefleet import Fleet
fleet = Fleet("auto", ship_package=False)
killer = threading.Timer(0.5, os.kill, (int(sys.argv[1]), signal.SIGKILL))
started = time.monotonic()
killer.start()
out = fleet.job_block([sys.argv[2]], timeout_seconds=6)
took = time.monotonic() - started
listing = fleet.list_jobs()
fleet.close()
print(json.dumps({"done": out["done"], "took": took, "jobs": len(listing["jobs"])}))
"""


def test_a_wait_in_flight_when_the_scheduler_restarts_is_made_again_within_its_deadline(
    tmp_path,
):
    with _cluster_up(tmp_path, clones=1) as up:
        before = up.scheduler_pid()
        done = subprocess.run(
            [sys.executable, "-c", _RESTARTED_BLOCK, str(before), up.batch_id],
            cwd=up.work,
            env={**os.environ, **up.env},
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.splitlines()[-1])
        assert out["took"] <= 6 + 2 and out["jobs"] == 1
        assert up.scheduler_pid() != before  # Ray restarted it; the wait went on with the new one
