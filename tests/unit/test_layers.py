"""The layering rules of docs/architecture.md, checked on the source of every module.

Each module's imports are read with :mod:`ast` (nothing is imported), relative imports are resolved
to absolute names, and the rules are checked:

- no package imports another package's private (underscore) modules; it imports the names that
  package exports in its ``__init__``, and every such name is in that package's ``__all__``;
- each package imports only the packages its layer may use (definitions never import clones, the
  scheduler or providers; providers never import clones or the scheduler; and so on);
- Ray is imported only by ``*/remote.py`` modules and ``cluster/``;
- the vocabulary module imports nothing but the standard library.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import clonefleet

ROOT = Path(clonefleet.__file__).resolve().parent
PACKAGES = (
    "cli",
    "clone",
    "host",
    "inbox",
    "planning",
    "config",
    "scheduler",
    "definitions",
    "providers",
    "cluster",
    "testing",
    "journal",
    "dashboard",
    "permissions",
    "bench",
)

_RUNTIME = {"errors", "config", "vocab", "control", "providers", "permissions"}
"""What every layer from the clones up may use."""

ALLOWED: dict[str, set[str]] = {
    "vocab": set(),
    "control": set(),
    "permissions": {"errors", "vocab"},
    "errors": {"vocab"},
    "config": {"errors", "vocab", "permissions"},
    "definitions": {"errors", "config", "vocab", "permissions"},
    "providers": {"errors", "config", "vocab"},
    "clone": _RUNTIME | {"journal"},
    "host": _RUNTIME | {"clone", "cluster", "journal"},
    "inbox": {"errors", "vocab", "control", "cluster", "journal"},
    "planning": _RUNTIME | {"clone", "definitions"},
    "scheduler": _RUNTIME
    | {"clone", "host", "inbox", "planning", "definitions", "cluster", "journal"},
    "cluster": {"errors", "config", "vocab", "journal"},
    "journal": {"errors"},
    "testing": _RUNTIME
    | {"clone", "host", "inbox", "planning", "definitions", "scheduler", "journal"},
    # A client like the command line: it reads the fleet through a Fleet (or a fake) it is given.
    "dashboard": {"fleet", "errors", "config", "vocab", "control", "cluster"},
    # `clonefleet bench`: a client of the Fleet; its Ray baseline lives in bench/remote.py.
    "bench": {"fleet", "errors", "config", "vocab", "providers"},
}
"""Which top-level parts of clonefleet each part may import (itself always allowed)."""

RAY_ALLOWED = ("cluster",)
"""Packages allowed to import Ray anywhere; elsewhere only ``remote.py`` modules may."""


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(["clonefleet", *parts]), path))
    return out


def _imports(module: str, path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    """``(absolute module, imported names, line)`` of every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((a.name, (), node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names)
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not node.module:
                # ``from . import x``: each name is a module of the anchor package
                found.extend((f"{target}.{n}", (), node.lineno) for n in names)
            else:
                found.append((target, names, node.lineno))
    return found


def _part(module: str) -> str:
    """The top-level part of clonefleet a module belongs to (``root`` for the package itself)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return parts[1]


MODULES = _modules()


def test_every_package_is_found():
    names = {m for m, _ in MODULES}
    assert {f"clonefleet.{p}" for p in PACKAGES} <= names
    assert "clonefleet.vocab" in names


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_no_private_module_of_another_package_is_imported(module: str, path: Path):
    own = _part(module)
    bad = []
    for target, _names, line in _imports(module, path):
        parts = target.split(".")
        if parts[0] != "clonefleet" or len(parts) < 3:
            continue
        if parts[1] != own and any(p.startswith("_") for p in parts[2:]):
            bad.append(f"{path.name}:{line} imports {target}")
    assert not bad, bad


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_each_part_imports_only_the_layers_below_it(module: str, path: Path):
    own = _part(module)
    if own not in ALLOWED:
        return  # the root package (CLI, Fleet) may use every part
    bad = []
    for target, _names, line in _imports(module, path):
        parts = target.split(".")
        if parts[0] != "clonefleet" or len(parts) < 2:
            continue
        other = parts[1]
        if other != own and other not in ALLOWED[own]:
            bad.append(f"{path.name}:{line} imports {target}")
        if other == "cluster" and own != "cluster" and not path.name == "remote.py":
            bad.append(f"{path.name}:{line} imports {target} outside a remote.py shell")
    assert not bad, bad


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_ray_is_imported_only_by_shells_and_cluster(module: str, path: Path):
    if _part(module) in RAY_ALLOWED or path.name == "remote.py":
        return
    if module in ("clonefleet.fleet", "clonefleet.cli.control", "clonefleet.cli.program"):
        return  # the facade imports Ray lazily, inside the calls that need it
    bad = [
        f"{path.name}:{line} imports {t}"
        for t, _n, line in _imports(module, path)
        if t == "ray" or t.startswith("ray.")
    ]
    assert not bad, bad


def test_vocabulary_imports_only_the_standard_library():
    path = ROOT / "vocab.py"
    for target, _names, line in _imports("clonefleet.vocab", path):
        top = target.split(".")[0]
        assert top == "__future__" or top in sys.stdlib_module_names, f"line {line}: {target}"


@pytest.mark.parametrize("package", PACKAGES)
def test_names_other_parts_import_are_exported(package: str):
    exported = set(importlib.import_module(f"clonefleet.{package}").__all__)
    missing = []
    for module, path in MODULES:
        if _part(module) == package:
            continue
        for target, names, line in _imports(module, path):
            if target == f"clonefleet.{package}":
                missing.extend(
                    f"{path.name}:{line} {n}" for n in names if n not in exported and n != "*"
                )
    assert not missing, missing
