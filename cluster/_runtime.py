"""What travels to a remote cluster through Ray's runtime environment.

Definitions, skills and config travel as data inside each batch submission; the clonefleet
package itself travels as a ``py_modules`` entry, so workers without clonefleet installed (or with
another version) run the client's code. The shipped copy is a clean snapshot of the installed
package files only: never a checkout's ``.git``, tests or virtual environment.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["package_snapshot", "remote_runtime_env"]

_SUBPACKAGES = (
    "",
    "actors",
    "config",
    "scheduler",
    "definitions",
    "providers",
    "cluster",
    "testing",
    "journal",
)
_DATA = ("definitions/shipped/*.md", "definitions/fragments/*.md", "cluster/*.yaml")


@cache
def package_snapshot() -> Path:
    """Copy the importable clonefleet files into a fresh temporary ``clonefleet`` folder."""
    import clonefleet

    src = Path(clonefleet.__file__).resolve().parent
    dest = Path(tempfile.mkdtemp(prefix="clonefleet-pkg-")) / "clonefleet"
    for sub in _SUBPACKAGES:
        (dest / sub).mkdir(parents=True, exist_ok=True)
        for py in (src / sub).glob("*.py"):
            shutil.copy2(py, dest / sub / py.name)
    for pattern in _DATA:
        for f in src.glob(pattern):
            target = dest / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
    return dest


def remote_runtime_env() -> dict[str, Any] | None:
    """The job runtime environment for a remote cluster (``CLONEFLEET_SHIP_PACKAGE=0`` turns
    shipping off when every worker already has the same clonefleet installed)."""
    env_vars = {"RAY_USAGE_STATS_ENABLED": "0"}
    if os.environ.get("CLONEFLEET_SHIP_PACKAGE", "1") == "0":
        return {"env_vars": env_vars}
    return {"py_modules": [str(package_snapshot())], "env_vars": env_vars}
