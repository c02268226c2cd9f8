"""What travels to a remote cluster through Ray's runtime environment.

Definitions, skills and config travel as data inside each batch submission; the clonefleet
package itself travels as a ``py_modules`` entry, so workers without clonefleet installed (or with
another version) run the client's code. The shipped copy is a clean snapshot of the installed
package files only: never a checkout's ``.git``, tests or virtual environment. It is made once per
installed version and content, in clonefleet's cache folder, and reused by every later command.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import shutil
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "package_snapshot", "remote_runtime_env", "tune_collector"]

_DATA = ("definitions/shipped/*.md", "definitions/fragments/*.md", "cluster/*.yaml")
KEEP_SNAPSHOTS = 3
"""Snapshots kept in the cache (the newest ones used); older ones are removed."""
_STALE_BUILD_S = 3600.0
"""A half-built snapshot older than this was left by a creator that died; it is removed."""


def cache_dir() -> Path:
    """clonefleet's cache folder: ``$CLONEFLEET_CACHE_DIR``, else ``$XDG_CACHE_HOME/clonefleet``,
    else ``~/.cache/clonefleet`` (created with mode 0700)."""
    base = os.environ.get("CLONEFLEET_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "clonefleet"
    )
    path = Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _package_files(src: Path) -> list[Path]:
    """The files of the installed package that a snapshot holds, relative to ``src``."""
    found = [py for py in src.rglob("*.py") if "__pycache__" not in py.relative_to(src).parts]
    found += [f for pattern in _DATA for f in src.glob(pattern)]
    return sorted(f.relative_to(src) for f in found)


def _snapshot_key(src: Path, files: list[Path]) -> str:
    import clonefleet

    digest = hashlib.sha256()
    for rel in files:
        digest.update(str(rel).encode() + b"\0" + (src / rel).read_bytes() + b"\0")
    return f"{clonefleet.__version__}-{digest.hexdigest()[:16]}"


@cache
def package_snapshot() -> Path:
    """The clean ``clonefleet`` folder that travels to a cluster (made once per version and
    content in ``cache_dir()/packages``, then reused).

    A snapshot is built in a temporary folder inside the cache and renamed into place, so a
    reader never sees half of one; a process that loses the race to create it uses the winner's.
    """
    import clonefleet

    src = Path(clonefleet.__file__).resolve().parent
    files = _package_files(src)
    root = cache_dir() / "packages"
    root.mkdir(mode=0o700, exist_ok=True)
    final = root / _snapshot_key(src, files)
    if not (final / "clonefleet").is_dir():
        _build(src, files, root, final)
    with contextlib.suppress(OSError):
        os.utime(final)  # in use: the newest, so pruning keeps it
    _prune(root, keep=final)
    return final / "clonefleet"


def _build(src: Path, files: list[Path], root: Path, final: Path) -> None:
    building = Path(tempfile.mkdtemp(prefix=".build-", dir=root))  # mode 0700
    try:
        for rel in files:
            target = building / "clonefleet" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, target)
        try:
            os.rename(building, final)
        except OSError:
            if not (final / "clonefleet").is_dir():
                raise  # not a lost race: something else is wrong
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _prune(root: Path, *, keep: Path) -> None:
    """Remove snapshots beyond the :data:`KEEP_SNAPSHOTS` newest (never ``keep``), and half-built
    ones an hour old."""
    now = time.time()
    snapshots: list[tuple[float, Path]] = []
    for entry in root.iterdir():
        try:
            mtime = entry.lstat().st_mtime
        except OSError:
            continue
        if entry.name.startswith(".build-"):
            if now - mtime > _STALE_BUILD_S:
                shutil.rmtree(entry, ignore_errors=True)
        elif entry != keep:
            snapshots.append((mtime, entry))
    snapshots.sort(reverse=True)
    for _, old in snapshots[KEEP_SNAPSHOTS - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def remote_runtime_env(*, ship_package: bool = True) -> dict[str, Any] | None:
    """The job runtime environment for a remote cluster.

    Args:
        ship_package: send the clonefleet package (``py_modules``); a client that only calls the
            existing scheduler actor runs no code on the workers and needs none.
            ``CLONEFLEET_SHIP_PACKAGE=0`` turns shipping off for every command, when every
            worker already has the same clonefleet installed.
    """
    env_vars = {"RAY_USAGE_STATS_ENABLED": "0"}
    if not ship_package or os.environ.get("CLONEFLEET_SHIP_PACKAGE", "1") == "0":
        return {"env_vars": env_vars}
    return {"py_modules": [str(package_snapshot())], "env_vars": env_vars}


GC_THRESHOLDS = (50_000, 50, 1000)
"""The cyclic collector's thresholds in clonefleet's long-lived processes (docs/benchmarks.md)."""


def tune_collector() -> None:
    """Make the cyclic garbage collector cheap in a process that holds many small objects.

    A clone host runs thousands of clones and the scheduler keeps a job table of as many; with
    Python's default thresholds (700, 10, 10) the collector ran every few hundred allocations
    and rescanned them, about a quarter of a clone host's CPU at 10,000 clones. Objects alive
    now (the imported modules) are moved out of its sight for good (``gc.freeze``), and it runs
    after 50,000 new container objects rather than 700; the full collection still runs only when
    the survivors have grown by a quarter (Python's own rule), so memory held by garbage cycles
    stays bounded.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
