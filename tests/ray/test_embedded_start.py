"""The embedded Ray instance the test session runs on started lean (docs/cluster.md)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.readme_smoke]


def test_the_embedded_instance_runs_without_the_processes_it_does_not_use(ray_cluster, fleet):
    import ray
    from ray._private import node as ray_node
    from ray._private import ray_constants as rc
    from ray._private import worker

    from clonefleet.cluster import _lean

    assert ray_cluster.embedded
    running = set(worker._global_node.all_processes)
    assert {rc.PROCESS_TYPE_GCS_SERVER, rc.PROCESS_TYPE_RAYLET} <= running
    assert not running & {
        rc.PROCESS_TYPE_DASHBOARD,
        rc.PROCESS_TYPE_MONITOR,
        rc.PROCESS_TYPE_LOG_MONITOR,
    }
    # The change to Ray's start-up was only for that start.
    assert ray_node.Node.__dict__["start_monitor"] is not _lean._skip
    assert ray_node.Node.__dict__["start_api_server"] is not _lean._skip
    # Without them, clones run as ever: one batch, every job through the scheduler and hosts.
    batch = fleet.spawn("general-purpose", "Lean {{ clone.index }}", count=4)
    assert fleet.job_block([batch.batch_id], timeout_seconds=45)["done"]
    assert ray.is_initialized()
