"""Fixtures of the Ray tests: running the ``clonefleet`` command in a subprocess, and calling
the named scheduler and inbox actors directly (to read their state or inject faults)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

RunCli = Callable[..., subprocess.CompletedProcess[str]]
ActorCall = Callable[..., Any]


def _run(
    *args: str, cwd: Path, timeout: float = 150, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        **(env or {}),
    }
    full.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "clonefleet", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
    )


@pytest.fixture
def cli_run() -> RunCli:
    """``cli_run(*args, cwd=..., timeout=150, env=None)`` runs ``python -m clonefleet ARGS`` in
    ``cwd`` (its own embedded Ray unless ``--address`` says otherwise; ``RAY_ADDRESS`` is
    cleared) and returns the finished process with its output."""
    return _run


@pytest.fixture
def cli(
    cli_run: RunCli, tmp_path: Path
) -> Iterator[tuple[Callable[..., subprocess.CompletedProcess[str]], Path]]:
    """``(run, work)``: ``run(*args, timeout=150)`` runs the command in ``tmp_path/work`` with
    its own state folder, ``tmp_path/state`` (its own ``cluster up`` record and journal); a
    cluster it started is stopped at the end."""
    env = {"CLONEFLEET_STATE_DIR": str(tmp_path / "state")}
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        return cli_run(*args, cwd=work, timeout=timeout, env=env)

    yield run, work
    run("cluster", "down", timeout=90)


def _actor_call(name: str) -> ActorCall:
    """``call(method, *args, timeout=30)``: the named actor's ``method``, waited for as a Fleet
    waits (:func:`~clonefleet.cluster.ray_wait`: our errors unwrapped, Ray's turned into ours)."""

    def call(method: str, *args: Any, timeout: float = 30.0) -> Any:
        import ray

        from clonefleet.cluster import NAMESPACE, ray_wait

        actor = ray.get_actor(name, namespace=NAMESPACE)
        return ray_wait(getattr(actor, method).remote(*args), timeout)

    return call


@pytest.fixture
def scheduler_call() -> ActorCall:
    """``scheduler_call(method, *args, timeout=30)`` calls the named scheduler actor (found
    anew each time: the name outlives a restart) and returns its answer."""
    from clonefleet.cluster import SCHEDULER_NAME

    return _actor_call(SCHEDULER_NAME)


@pytest.fixture
def inbox_call() -> ActorCall:
    """``inbox_call(method, *args, timeout=30)`` calls the named inbox actor (the scheduler
    creates it at the first message) and returns its answer."""
    from clonefleet.inbox.remote import INBOX_NAME

    return _actor_call(INBOX_NAME)
