"""The host calls are declared once (clonefleet.host.HostCalls, PlacedHost, WatchedHost) and
every host offers exactly them: same names, parameters and annotations; async everywhere but in
HostCore, which is synchronous where it awaits nothing."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

import clonefleet
from clonefleet.host import HostCalls, HostCore, PlacedHost, WatchedHost
from clonefleet.host.remote import CloneHost, CloneHostActor
from clonefleet.testing import InstantHost, LocalHost, public_methods, signature_shape

PROTOCOLS = (HostCalls, PlacedHost, WatchedHost)
DECLARED = {
    name: member
    for protocol in PROTOCOLS
    for name, member in vars(protocol).items()
    if inspect.isfunction(member) and not name.startswith("_")
}
CALLS = {name for name in DECLARED if name in vars(HostCalls)}

IMPLEMENTERS: dict[type, tuple[set[str], set[str] | None]] = {
    CloneHost: (CALLS | {"node_id", "watch"}, {"create", "kill"}),
    CloneHostActor: (CALLS | {"node_id", "watch"}, set()),
    LocalHost: (CALLS | {"watch"}, {"kill"}),
    InstantHost: (CALLS, {"factory"}),
    HostCore: (CALLS - {"close"}, None),
}
"""Each host: the declared calls it answers, and its public methods besides them (a host call
added outside the protocol fails here; ``None``: not checked, for the core the shells wrap)."""

SYNC = {HostCore: {"start", "cancel", "deliver"}}
"""Calls an implementer answers synchronously (the pure core: they await nothing)."""

NAMED = (CloneHost, LocalHost, InstantHost)
"""Hosts handed to the scheduler: each is made with its ``host_id``."""


def test_the_protocol_is_the_host_calls():
    assert set(DECLARED) == {
        "start",
        "cancel",
        "deliver",
        "drain",
        "plan",
        "close",
        "node_id",
        "watch",
    }
    assert all(inspect.iscoroutinefunction(m) for m in DECLARED.values())
    assert all(m.__doc__ for m in DECLARED.values())
    assert "host_id" in typing.get_type_hints(HostCalls)


CASES = [(cls, name) for cls, (names, _) in IMPLEMENTERS.items() for name in sorted(names)]


@pytest.mark.parametrize(("host", "name"), CASES, ids=[f"{c.__name__}.{n}" for c, n in CASES])
def test_each_host_offers_the_declared_call_with_its_signature(host, name):
    method = inspect.getattr_static(host, name, None)
    assert inspect.isfunction(method), f"{host.__name__} lacks {name}"
    assert signature_shape(method) == signature_shape(DECLARED[name])
    assert inspect.iscoroutinefunction(method) is (name not in SYNC.get(host, ()))


@pytest.mark.parametrize(
    "host", [c for c, (_, extras) in IMPLEMENTERS.items() if extras is not None], ids=repr
)
def test_each_host_has_no_public_method_beyond_the_calls_and_its_allow_list(host):
    names, extras = IMPLEMENTERS[host]
    assert extras is not None
    assert public_methods(host) == names | extras


@pytest.mark.parametrize("host", NAMED, ids=lambda c: c.__name__)
def test_each_host_the_scheduler_holds_is_made_with_its_id(host):
    assert "host_id" in inspect.signature(host.__init__).parameters


def test_the_runtime_checks_tell_ray_hosts_from_in_process_ones():
    assert issubclass(CloneHost, PlacedHost) and issubclass(CloneHost, WatchedHost)
    assert issubclass(LocalHost, WatchedHost) and not issubclass(LocalHost, PlacedHost)
    assert not issubclass(InstantHost, WatchedHost) and not issubclass(InstantHost, PlacedHost)


def test_no_other_protocol_declares_a_host_call():
    """The calls are written out once: no ``Protocol`` elsewhere in the package declares one."""
    root = Path(clonefleet.__file__).parent
    home = root / "host" / "_protocol.py"
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == home:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if not any(b.split("[")[0].endswith("Protocol") for b in bases):
                continue
            names = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            if names & {"deliver", "drain", "plan", "node_id", "watch"}:
                found.append(f"{path.relative_to(root)}: {node.name}")
    assert not found, found
