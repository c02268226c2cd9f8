"""What a clone host that asks for ``cluster.host_resources`` passes to Ray (no Ray started)."""

from __future__ import annotations

import pytest

from clonefleet.host.remote import resource_options

pytestmark = pytest.mark.timeout(30)


def test_cpu_gpu_and_memory_are_rays_own_options_and_the_rest_custom_resources():
    options = resource_options({"CPU": 1.0, "GPU": 0.5, "memory": 2e9, "clone_host": 1.0})
    assert options == {
        "num_cpus": 1.0,
        "num_gpus": 0.5,
        "memory": 2_000_000_000,
        "resources": {"clone_host": 1.0},
    }


def test_a_custom_resource_alone_asks_for_no_cpu():
    assert resource_options({"clone_host": 1}) == {"num_cpus": 0, "resources": {"clone_host": 1}}
    assert resource_options({}) == {"num_cpus": 0}
