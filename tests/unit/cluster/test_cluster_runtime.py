"""The package snapshot that travels to a cluster: made once per version and content in the
cache folder, atomically, reused across calls and processes, old ones pruned (no Ray)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clonefleet.cluster import _runtime

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setenv("CLONEFLEET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CLONEFLEET_SHIP_PACKAGE", raising=False)
    _runtime.package_snapshot.cache_clear()
    yield tmp_path / "cache"
    _runtime.package_snapshot.cache_clear()


def _snapshot_in_subprocess(cache: Path) -> str:
    code = "from clonefleet.cluster._runtime import package_snapshot; print(package_snapshot())"
    env = {**os.environ, "CLONEFLEET_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=20
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_snapshot_is_a_clean_copy_in_a_private_cache_folder(cache):
    snap = _runtime.package_snapshot()
    assert snap.name == "clonefleet" and snap.parent.parent == cache / "packages"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(snap.parent.stat().st_mode) == 0o700
    for rel in ("__init__.py", "cluster/_runtime.py", "cluster/ray-cluster.yaml"):
        assert (snap / rel).is_file()
    assert list((snap / "definitions" / "shipped").glob("*.md"))
    assert not (snap / "tests").exists() and not (snap / ".git").exists()
    assert not list(snap.rglob("*.pyc"))


def test_the_same_snapshot_is_reused_and_never_copied_again(cache):
    first = _runtime.package_snapshot()
    marker = (first / "__init__.py").stat()
    _runtime.package_snapshot.cache_clear()  # as a new command would
    assert _runtime.package_snapshot() == first
    assert (first / "__init__.py").stat().st_ino == marker.st_ino
    assert _snapshot_in_subprocess(cache) == str(first)  # another process finds it too
    assert (first / "__init__.py").stat().st_ino == marker.st_ino
    assert [p.name for p in (cache / "packages").iterdir()] == [first.parent.name]


def test_concurrent_creators_end_with_one_snapshot_and_no_leftovers(cache):
    env = {**os.environ, "CLONEFLEET_CACHE_DIR": str(cache)}
    code = "from clonefleet.cluster._runtime import package_snapshot; print(package_snapshot())"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    paths = {p.communicate(timeout=20)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    assert [p.name for p in (cache / "packages").iterdir()] == [Path(paths.pop()).parent.name]


def test_a_creator_that_loses_the_race_uses_the_winners_snapshot(cache, tmp_path):
    winner = _runtime.package_snapshot()
    before = (winner / "__init__.py").stat().st_ino
    src = tmp_path / "other-src"
    (src / "cluster").mkdir(parents=True)
    (src / "__init__.py").write_text("# the loser's copy\n")
    _runtime._build(src, [Path("__init__.py")], winner.parent.parent, winner.parent)
    assert (winner / "__init__.py").stat().st_ino == before
    assert "loser" not in (winner / "__init__.py").read_text()
    assert [p.name for p in (cache / "packages").iterdir()] == [winner.parent.name]


def test_old_snapshots_beyond_the_newest_three_are_removed(cache):
    root = cache / "packages"
    root.mkdir(parents=True)
    old = time.time() - 86400
    for i in range(5):
        (root / f"0.0.{i}-abc" / "clonefleet").mkdir(parents=True)
        os.utime(root / f"0.0.{i}-abc", (old + i, old + i))
    stale_build, fresh_build = root / ".build-dead", root / ".build-live"
    stale_build.mkdir()
    fresh_build.mkdir()
    os.utime(stale_build, (old, old))
    current = _runtime.package_snapshot().parent
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [current.name, "0.0.4-abc", "0.0.3-abc", ".build-live"]
    )


def test_the_key_names_the_version_and_changes_with_the_content(tmp_path):
    import clonefleet

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    key = _runtime._snapshot_key(src, [Path("a.py")])
    assert key.startswith(f"{clonefleet.__version__}-")
    (src / "a.py").write_text("x = 2\n")
    assert _runtime._snapshot_key(src, [Path("a.py")]) != key


def test_the_cache_folder_follows_xdg_and_home(monkeypatch, tmp_path):
    monkeypatch.delenv("CLONEFLEET_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _runtime.cache_dir() == tmp_path / "xdg" / "clonefleet"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _runtime.cache_dir() == tmp_path / "home" / ".cache" / "clonefleet"


def test_a_job_control_client_ships_no_package(cache):
    assert _runtime.remote_runtime_env(ship_package=False) == {
        "env_vars": {"RAY_USAGE_STATS_ENABLED": "0"}
    }
    assert not (cache / "packages").exists()  # nothing made for it
    shipped = _runtime.remote_runtime_env()
    assert shipped is not None and shipped["py_modules"] == [str(_runtime.package_snapshot())]


def test_shipping_can_be_turned_off_for_every_command(monkeypatch, cache):
    monkeypatch.setenv("CLONEFLEET_SHIP_PACKAGE", "0")
    assert "py_modules" not in (_runtime.remote_runtime_env() or {})
    assert not (cache / "packages").exists()


def test_every_package_folder_travels_in_the_snapshot():
    import clonefleet

    installed = Path(clonefleet.__file__).resolve().parent  # site-packages, or the checkout
    folders = {
        d.relative_to(installed)
        for d in installed.rglob("*")
        if d.is_dir() and any(d.glob("*.py")) and "__pycache__" not in d.parts
    }
    shipped = set(_runtime._package_files(installed))
    assert {d / "__init__.py" for d in folders} <= shipped
    assert Path("definitions/shipped/general-purpose.md") in shipped
