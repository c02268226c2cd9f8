"""Shared fixtures: loopback-only Ray environment and one Ray instance per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("CLONEFLEET_BLOCK_LIVE", "1")


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
