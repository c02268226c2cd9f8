"""The installed layout: one import package, a pure core free of Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_py(code: str, cwd) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_subpackages_import_from_any_directory_and_nothing_lands_top_level(tmp_path):
    code = (
        "import importlib.util as u, clonefleet.scheduler, clonefleet.actors, clonefleet.definitions, clonefleet.cluster;"
        "print([n for n in ('scheduler', 'actors', 'definitions', 'cluster') if u.find_spec(n) is not None])"
    )
    assert run_py(code, tmp_path) == "[]"


def test_pure_core_does_not_import_ray(tmp_path):
    code = (
        "import sys, clonefleet, clonefleet.actors, clonefleet.scheduler, clonefleet.definitions, clonefleet.testing;"
        "print('ray' in sys.modules)"
    )
    assert run_py(code, tmp_path) == "False"


def test_cli_help_explains_run(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "clonefleet", "run", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    assert "--count" in out.stdout and "--json" in out.stdout and "clones" in out.stdout


REPO = Path(__file__).resolve().parents[2]
"""The checkout: the repository root is the package's source folder."""


def _subpackages() -> set[str]:
    skip = {"tests", "benchmarks", "build", "docs", "dist"}
    return {
        p.parent.name
        for p in REPO.glob("*/__init__.py")
        if p.parent.name not in skip and not p.parent.name.startswith(".")
    }


def test_every_subpackage_is_packaged_and_shipped_to_remote_clusters():
    import tomllib

    import clonefleet
    from clonefleet.cluster import _runtime

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    subpackages = _subpackages()
    assert {"actors", "providers", "scheduler", "definitions", "cluster"} <= subpackages
    assert set(listed) == {"clonefleet"} | {f"clonefleet.{p}" for p in subpackages}
    assert set(_runtime._SUBPACKAGES) == {""} | subpackages
    installed = Path(clonefleet.__file__).resolve().parent  # site-packages, or the checkout
    assert all((installed / p / "__init__.py").is_file() for p in subpackages)
