"""The rules of docs/architecture.md, checked on the source of every module.

The doc is the source of truth: its table of packages (what each part may import, inside and
outside clonefleet) is parsed here, and each rule of its list has one test below, looked up by
the rule's name. Imports are read with :mod:`ast` (nothing is imported), counting those behind
``TYPE_CHECKING`` and inside functions.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "src" / "clonefleet"
"""The package's source in the checkout (what is checked), whether or not it is the copy installed."""
DOC = REPO / "docs" / "architecture.md"
TESTS = REPO / "tests" / "unit"


# -- the doc ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of the doc's table of packages."""

    part: str
    may_import: frozenset[str]
    in_remote_only: frozenset[str]
    """Parts only ``remote.py`` modules of this part may import."""
    outside: frozenset[str] | None
    """Distributions allowed besides the standard library; ``None``: any."""
    ray: str
    """Where Ray may be imported: ``no``, ``anywhere``, ``remote.py`` or ``inside functions``."""


_TICKED = re.compile(r"`([^`]+)`")


def _part_name(cell: str) -> str:
    (name,) = _TICKED.findall(cell)
    return name.removesuffix("/").removesuffix(".py")


def _may_import(cell: str) -> tuple[frozenset[str], frozenset[str]]:
    if cell == "nothing":
        return frozenset(), frozenset()
    names, remote_only = set(), set()
    for item in cell.split(", "):
        match = re.fullmatch(r"`(\w+)`( in `remote\.py`)?", item)
        assert match, f"cannot read {item!r} in the table's 'may import' column"
        names.add(match[1])
        if match[2]:
            remote_only.add(match[1])
    return frozenset(names), frozenset(remote_only)


def _outside(cell: str) -> tuple[frozenset[str] | None, str]:
    if cell.startswith("standard library"):
        return frozenset(_TICKED.findall(cell)), "no"
    ray = {
        "any": "anywhere",
        "any but Ray": "no",
        "any; Ray in `remote.py`": "remote.py",
        "any; Ray inside functions": "inside functions",
    }
    assert cell in ray, f"cannot read {cell!r} in the table's 'outside clonefleet' column"
    return None, ray[cell]


def _read_table(text: str) -> dict[str, Row]:
    lines = text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("<!-- layers:"))
    rows: dict[str, Row] = {}
    for line in lines[at + 3 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"a row of the table has {len(cells)} cells: {line}"
        part = _part_name(cells[0])
        names, remote_only = _may_import(cells[2])
        outside, ray = _outside(cells[3])
        rows[part] = Row(part, names, remote_only, outside, ray)
    return rows


def _read_rules(text: str) -> dict[str, str]:
    """The doc's rules: name -> text."""
    section = text.split("### The rules", 1)[1].split("\n#", 1)[0]
    items = re.split(r"\n\d+\. ", section)[1:]
    rules = {}
    for item in items:
        match = re.match(r"\*\*([^*]+)\*\*:(.*)", item.split("\n\n")[0], re.S)
        assert match, f"a rule without a bold name: {item[:60]}"
        rules[match[1]] = " ".join(match[2].split())
    return rules


DOC_TEXT = DOC.read_text()
TABLE = _read_table(DOC_TEXT)
RULES = _read_rules(DOC_TEXT)


# -- the code --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    target: str
    """The module named (``from a.b import c`` names ``a.b``)."""
    names: tuple[str, ...]
    line: int
    in_function: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["clonefleet", *parts])


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _walk(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        yield child, in_function
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _walk(child, inner)


def _imports(module: str, path: Path) -> list[Import]:
    """Every import in the file, relative ones resolved to absolute names."""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node, in_function in _walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(a.name, (), node.lineno, in_function) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            names = tuple(a.name for a in node.names)
            found.append(Import(target, names, node.lineno, in_function))
    return found


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _part(module: str) -> str:
    """The part of the table a module belongs to."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _parts_named(imp: Import) -> set[str]:
    """The parts of clonefleet an import reaches (``from clonefleet import control`` reaches
    ``control``; the package ``clonefleet`` itself is no part)."""
    parts = imp.target.split(".")
    if parts[0] != "clonefleet":
        return set()
    if len(parts) > 1:
        return {parts[1]}
    return {n for n in imp.names if f"clonefleet.{n}" in MODULES}


def _modules_named(imp: Import) -> set[str]:
    """The modules of clonefleet an import reaches: the longest existing prefix of its target,
    and each imported name that is itself a module."""
    out = set()
    parts = imp.target.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in MODULES:
            out.add(".".join(parts[:i]))
            break
    out |= {f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in MODULES}
    return out


def _folders() -> list[Path]:
    return sorted({p.parent for p in MODULES.values()})


CASES = sorted(MODULES)


# -- the rules -------------------------------------------------------------------------------


def test_table_is_the_code():
    in_code = {_part(m) for m in MODULES}
    assert in_code == set(TABLE), (
        f"missing from the table: {sorted(in_code - set(TABLE))}; "
        f"not in the code: {sorted(set(TABLE) - in_code)}"
    )
    for row in TABLE.values():
        assert row.may_import <= set(TABLE), (row.part, sorted(row.may_import - set(TABLE)))
    graph = {row.part: set(row.may_import) for row in TABLE.values()}
    assert not [c for c in _cycles(graph) if len(c) > 1], "the table's layers have a cycle"


@pytest.mark.parametrize("module", CASES)
def test_imports_follow_the_table(module: str):
    row = TABLE[_part(module)]
    remote = MODULES[module].name == "remote.py"
    bad = []
    for imp in IMPORTS[module]:
        for other in _parts_named(imp) - {row.part}:
            if other not in row.may_import:
                bad.append(f"line {imp.line}: {imp.target} ({other} is not in its row)")
            elif other in row.in_remote_only and not remote:
                bad.append(f"line {imp.line}: {imp.target} outside a remote.py module")
    assert not bad, bad


@pytest.mark.parametrize("module", CASES)
def test_outside_imports_follow_the_table(module: str):
    row = TABLE[_part(module)]
    remote = MODULES[module].name == "remote.py"
    bad = []
    for imp in IMPORTS[module]:
        top = imp.target.split(".")[0]
        if top in ("clonefleet", "__future__") or top in sys.stdlib_module_names:
            continue
        if top == "ray":
            ok = row.ray == "anywhere" or (row.ray == "remote.py" and remote)
            ok = ok or (row.ray == "inside functions" and imp.in_function)
        else:
            ok = row.outside is None or top in row.outside
        if not ok:
            bad.append(f"line {imp.line}: {imp.target}")
    assert not bad, bad


@pytest.mark.parametrize("module", CASES)
def test_no_private_module_across_packages(module: str):
    own = _part(module)
    bad = []
    for imp in IMPORTS[module]:
        for target in _modules_named(imp) | {imp.target}:
            parts = target.split(".")
            if parts[0] != "clonefleet" or len(parts) < 3 or parts[1] == own:
                continue
            if any(p.startswith("_") for p in parts[2:]):
                bad.append(f"line {imp.line}: {target}")
    assert not bad, bad


def _exported_cases() -> list[tuple[str, str, str, int]]:
    """``(importer, module, name, line)`` for each name one part imports from another's module."""
    cases = []
    for module, imports in IMPORTS.items():
        for imp in imports:
            parts = imp.target.split(".")
            if parts[0] != "clonefleet" or len(parts) < 2 or parts[1] == _part(module):
                continue
            if any(p.startswith("_") for p in parts[2:]) or imp.target not in MODULES:
                continue  # a private module: the rule above
            cases += [(module, imp.target, n, imp.line) for n in imp.names]
    return cases


@pytest.mark.parametrize("target", sorted({c[1] for c in _exported_cases()}))
def test_exported_means_listed(target: str):
    module = importlib.import_module(target)
    exported = set(getattr(module, "__all__", ()))
    missing = [
        f"{importer}:{line} {name}"
        for importer, t, name, line in _exported_cases()
        if t == target and name not in exported and f"{target}.{name}" not in MODULES
    ]
    assert not missing, missing


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of a graph (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((w for w in edges if w not in index or w in on_stack), None)
            if nxt is not None and nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
            elif nxt is not None:
                low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(sorted(component))
    return out


def module_graph() -> dict[str, set[str]]:
    """Which modules each module imports; a module's own packages (its ancestors) left out."""
    graph = {}
    for module, imports in IMPORTS.items():
        targets = set().union(*(_modules_named(i) for i in imports)) if imports else set()
        graph[module] = {t for t in targets if t != module and not module.startswith(t + ".")}
    return graph


def test_no_import_cycle():
    cycles = [c for c in _cycles(module_graph()) if len(c) > 1]
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_small_folders():
    (limit,) = map(int, re.findall(r"more than (\d+) modules", RULES["small folders"]))
    big = {}
    for folder in _folders():
        count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
        if count > limit:
            big[str(folder.relative_to(ROOT))] = count
    assert not big, big


def test_no_vague_module_names():
    vague = {n.lstrip("_") for n in _TICKED.findall(RULES["no vague module names"])}
    assert vague, "the rule names no vague name"
    bad = [m for m in MODULES if m.rsplit(".", 1)[-1].lstrip("_") in vague]
    assert not bad, bad


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_tests_mirror_the_packages():
    folders = [p for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__"]
    bad = [str(f.relative_to(TESTS)) for f in folders if not (ROOT / f.relative_to(TESTS)).is_dir()]
    assert not bad, f"test folders naming no package: {bad}"
    for path in _test_files():
        rel = path.relative_to(TESTS)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        for imp in _imports("tests", path):
            for target in _modules_named(imp) | {imp.target}:
                parts = target.split(".")
                if parts[0] != "clonefleet" or len(parts) < 3 or parts[1] == own:
                    continue
                if any(p.startswith("_") for p in parts[2:]):
                    bad.append(f"{rel}:{imp.line} {target}")
    assert not bad, bad


RULE_TESTS: dict[str, Callable[..., None]] = {
    "table is the code": test_table_is_the_code,
    "imports follow the table": test_imports_follow_the_table,
    "outside imports follow the table": test_outside_imports_follow_the_table,
    "no private module across packages": test_no_private_module_across_packages,
    "exported means listed": test_exported_means_listed,
    "no import cycle": test_no_import_cycle,
    "small folders": test_small_folders,
    "no vague module names": test_no_vague_module_names,
    "tests mirror the packages": test_tests_mirror_the_packages,
}


def test_each_rule_of_the_doc_has_its_test():
    assert set(RULES) == set(RULE_TESTS)
