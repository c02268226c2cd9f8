"""Shared fixtures: loopback-only Ray environment and one Ray instance per test session."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("CLONEFLEET_BLOCK_LIVE", "1")


_STATE_DIR: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Journals and cluster records of the whole session go to a folder of its own, set before
    any Ray process starts (they inherit it), and removed at the end."""
    global _STATE_DIR
    if "CLONEFLEET_STATE_DIR" not in os.environ:
        _STATE_DIR = tempfile.mkdtemp(prefix="clonefleet-test-state-")
        os.environ["CLONEFLEET_STATE_DIR"] = _STATE_DIR


def pytest_unconfigure(config: pytest.Config) -> None:
    if _STATE_DIR is not None:
        shutil.rmtree(_STATE_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/ray/" in str(item.fspath):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_cluster():
    """One embedded Ray instance for the whole session (2 CPUs, dashboard off, loopback)."""
    from clonefleet.cluster import ClusterConfig, ClusterSession

    session = ClusterSession(ClusterConfig(num_cpus=2, namespace="clonefleet")).start()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def fleet(ray_cluster, tmp_path_factory):
    """A Fleet on the session's Ray instance, with an empty working directory."""
    from clonefleet import Fleet

    return Fleet(cwd=tmp_path_factory.mktemp("fleet-cwd"))
