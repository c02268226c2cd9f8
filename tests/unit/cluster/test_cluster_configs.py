"""The shipped cluster configs (``clonefleet.cluster``): the Ray cluster launcher YAML and the
KubeRay ``RayCluster`` manifest carry the fields clonefleet relies on.

Both files are read as package data, so these tests also check that they are installed. Ray's own
launcher schema (``ray/autoscaler/ray-schema.json``) is read from the installed Ray without
importing it.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

pytestmark = pytest.mark.timeout(20)

ROOT = Path(__file__).resolve().parents[3]
IMAGE = re.compile(
    r"^(?P<repo>[^:@\s]+):(?P<version>[^-\s]+)-ray(?P<ray>\d+\.\d+\.\d+)-py(?P<py>3)(?P<minor>\d+)$"
)
"""``<registry>/clonefleet:<clonefleet version>-ray<ray version>-py3<minor>``."""
GCS_PORT, CLIENT_PORT = 6379, 10001


def shipped(name: str) -> dict[str, Any]:
    text = (
        importlib.resources.files("clonefleet.cluster").joinpath(name).read_text(encoding="utf-8")
    )
    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{name} is not a YAML mapping"
    return data


@pytest.fixture(scope="module")
def launcher() -> dict[str, Any]:
    return shipped("ray-cluster.yaml")


@pytest.fixture(scope="module")
def kuberay() -> dict[str, Any]:
    return shipped("kuberay-raycluster.yaml")


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def ray_range(project: dict[str, Any]) -> SpecifierSet:
    reqs = [Requirement(r) for r in project["dependencies"]]
    ray = [r for r in reqs if r.name == "ray"]
    assert len(ray) == 1, "pyproject.toml names ray once"
    return ray[0].specifier


def containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def head_container(manifest: dict[str, Any]) -> dict[str, Any]:
    found = [
        c
        for c in manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
        if c["name"] == "ray-head"
    ]
    assert len(found) == 1, "the head group has one container named ray-head"
    return found[0]


def commands(config: dict[str, Any], key: str) -> str:
    return " ".join(" ".join(c.split()) for c in config[key])


# -- Ray cluster launcher ------------------------------------------------------------------
def test_launcher_config_passes_rays_own_schema(launcher):
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations, "ray is a dependency of clonefleet"
    schema_path = (
        Path(next(iter(spec.submodule_search_locations))) / "autoscaler" / "ray-schema.json"
    )
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    jsonschema.validate(launcher, schema)


def test_launcher_has_a_head_type_and_worker_types_with_cpus_and_bounds(launcher):
    types = launcher["available_node_types"]
    head = launcher["head_node_type"]
    assert head in types
    workers = {name: t for name, t in types.items() if name != head}
    assert workers, "at least one worker node type"
    for name, node_type in types.items():
        assert isinstance(node_type["resources"].get("CPU"), int), (
            f"{name}: resources.CPU sets the CPUs clonefleet counts"
        )
    for name, node_type in workers.items():
        assert (
            0 <= node_type["min_workers"] <= node_type["max_workers"] <= launcher["max_workers"]
        ), name
    assert sum(t["min_workers"] for t in workers.values()) <= launcher["max_workers"]
    assert sum(t["resources"]["CPU"] * t["min_workers"] for t in workers.values()) > 0, (
        "the smallest cluster has CPUs for clone hosts"
    )


def test_launcher_starts_ray_with_client_port_autoscaler_and_no_dashboard(launcher):
    head = commands(launcher, "head_start_ray_commands")
    worker = commands(launcher, "worker_start_ray_commands")
    assert "ray start --head" in head
    assert f"--port={GCS_PORT}" in head
    assert f"--ray-client-server-port={CLIENT_PORT}" in head
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert "--include-dashboard=false" in head
    assert f"--address=$RAY_HEAD_IP:{GCS_PORT}" in worker


def test_launcher_turns_usage_stats_off_on_every_node(launcher):
    assert "-e RAY_USAGE_STATS_ENABLED=0" in launcher["docker"]["run_options"]
    assert "-e GRPC_ENABLE_FORK_SUPPORT=0" in launcher["docker"]["run_options"]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert "--disable-usage-stats" in commands(launcher, key), key


# -- KubeRay ---------------------------------------------------------------------------------
def test_kuberay_manifest_is_an_autoscaling_raycluster_with_head_and_worker_groups(kuberay):
    assert kuberay["apiVersion"] == "ray.io/v1"
    assert kuberay["kind"] == "RayCluster"
    spec = kuberay["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["headGroupSpec"]["template"]["spec"]["containers"]
    assert spec["workerGroupSpecs"], "at least one worker group"
    names = [g["groupName"] for g in spec["workerGroupSpecs"]]
    assert len(names) == len(set(names)), "worker group names are unique"


def test_kuberay_worker_groups_have_ordered_replica_bounds(kuberay):
    for group in kuberay["spec"]["workerGroupSpecs"]:
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group[
            "groupName"
        ]
    assert any(g["minReplicas"] > 0 for g in kuberay["spec"]["workerGroupSpecs"]), (
        "the smallest cluster has worker pods"
    )


def test_kuberay_every_group_sets_num_cpus_matching_its_cpu_limit(kuberay):
    spec = kuberay["spec"]
    head_cpus = spec["headGroupSpec"]["rayStartParams"]["num-cpus"]
    assert isinstance(head_cpus, str) and head_cpus.isdigit(), "rayStartParams values are strings"
    for group in spec["workerGroupSpecs"]:
        num_cpus = group["rayStartParams"]["num-cpus"]
        assert isinstance(num_cpus, str) and int(num_cpus) > 0, group["groupName"]
        (container,) = group["template"]["spec"]["containers"]
        assert str(container["resources"]["limits"]["cpu"]) == num_cpus, (
            f"{group['groupName']}: num-cpus equals the CPU limit"
        )


def test_kuberay_head_serves_gcs_and_ray_client_with_the_dashboard_off(kuberay):
    params = kuberay["spec"]["headGroupSpec"]["rayStartParams"]
    head = head_container(kuberay)
    ports = {p["containerPort"]: p.get("name") for p in head["ports"]}
    assert ports.get(GCS_PORT) == "gcs"
    assert ports.get(CLIENT_PORT) == "client"
    assert params.get("port", str(GCS_PORT)) == str(GCS_PORT)
    assert params.get("ray-client-server-port", str(CLIENT_PORT)) == str(CLIENT_PORT)
    assert params["include-dashboard"] == "false"
    assert 8265 not in ports, "no dashboard port is exposed"
    for probe in ("readinessProbe", "livenessProbe"):
        command = " ".join(head[probe]["exec"]["command"])
        assert "8265" not in command, f"{probe} must not wait for the dashboard, which is off"


def test_kuberay_turns_usage_stats_off_in_every_container(kuberay):
    envs = [c.get("env", []) for c in containers(kuberay)] + [
        kuberay["spec"]["autoscalerOptions"].get("env", [])
    ]
    for env in envs:
        assert {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"} in env
        assert {"name": "GRPC_ENABLE_FORK_SUPPORT", "value": "0"} in env


# -- the image -------------------------------------------------------------------------------
def test_both_configs_run_one_clonefleet_image_of_the_ray_version_pyproject_allows(
    launcher, kuberay, project
):
    images = {c["image"] for c in containers(kuberay)} | {launcher["docker"]["image"]}
    assert len(images) == 1, f"one image everywhere, got {sorted(images)}"
    match = IMAGE.match(images.pop())
    assert match, "image is <registry>/clonefleet:<version>-ray<ray version>-py3<minor>"
    assert match["repo"].rsplit("/", 1)[-1] == "clonefleet"
    assert match["version"] == project["version"]
    ray_version = kuberay["spec"]["rayVersion"]
    assert match["ray"] == ray_version
    assert Version(ray_version) in ray_range(project)
    assert f"3.{match['minor']}" in SpecifierSet(project["requires-python"])


def test_readme_dockerfile_builds_that_image_from_rays_image_with_clonefleet_installed(kuberay):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = IMAGE.match(head_container(kuberay)["image"])
    assert match
    base = f"FROM rayproject/ray:{match['ray']}-py{match['py']}{match['minor']}"
    assert base in readme, f"the README's Dockerfile starts {base!r}"
    dockerfile = readme[readme.index(base) :].split("```", 1)[0]
    installs = re.findall(r"RUN pip install ([^\n&;]*)", dockerfile)
    assert any("clonefleet" in args for args in installs), "the Dockerfile pip-installs clonefleet"
    assert "RAY_USAGE_STATS_ENABLED=0" in dockerfile
    assert "GRPC_ENABLE_FORK_SUPPORT=0" in dockerfile
