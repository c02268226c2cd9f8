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
        "import importlib.util as u, clonefleet.scheduler, clonefleet.clone, clonefleet.definitions, clonefleet.cluster;"
        "print([n for n in ('scheduler', 'clone', 'definitions', 'cluster') if u.find_spec(n) is not None])"
    )
    assert run_py(code, tmp_path) == "[]"


def test_pure_core_does_not_import_ray(tmp_path):
    code = (
        "import sys, clonefleet, clonefleet.clone, clonefleet.scheduler, clonefleet.definitions, clonefleet.testing;"
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
"""The checkout; the package's source is ``src/clonefleet``."""
SOURCE = REPO / "src" / "clonefleet"


def test_every_folder_of_the_package_is_a_package():
    import tomllib

    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert found == {"find": {"where": ["src"]}}
    folders = {
        d.relative_to(SOURCE)
        for d in SOURCE.rglob("*")
        if d.is_dir() and any(d.glob("*.py")) and "__pycache__" not in d.parts
    }
    assert {Path("clone/tools"), Path("scheduler"), Path("cluster")} <= folders
    assert all((SOURCE / d / "__init__.py").is_file() for d in folders)
