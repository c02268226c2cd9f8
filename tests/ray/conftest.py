"""Fixtures of the Ray tests: running the ``clonefleet`` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

RunCli = Callable[..., subprocess.CompletedProcess[str]]


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
