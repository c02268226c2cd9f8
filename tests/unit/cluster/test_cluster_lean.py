"""The embedded Ray's lean start: what it changes in Ray, that it puts everything back, and its
fast registration check (function-driven fakes; no Ray instance starts here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from ray._private import node as ray_node

from clonefleet.cluster import _lean

pytestmark = pytest.mark.timeout(30)

METHODS = ("start_api_server", "start_monitor", "start_log_monitor", "start_ray_processes")


def originals() -> dict[str, Any]:
    return {name: ray_node.Node.__dict__[name] for name in METHODS}


def test_the_block_skips_what_is_unused_and_puts_ray_back_afterwards():
    before = originals()
    with _lean.lean_local_start() as extra:
        now = originals()
        assert now["start_api_server"] is _lean._skip and now["start_monitor"] is _lean._skip
        assert now["start_log_monitor"] is _lean._skip  # logs do not go to the driver
        assert now["start_ray_processes"] is not before["start_ray_processes"]
        assert extra == {"_system_config": _lean.LEAN_SYSTEM_CONFIG}
        assert extra["_system_config"] is not _lean.LEAN_SYSTEM_CONFIG  # Ray may keep it
    assert originals() == before


def test_logs_to_the_driver_keep_the_log_monitor_and_an_error_still_restores():
    before = originals()
    with pytest.raises(RuntimeError), _lean.lean_local_start(logs_to_driver=True):
        assert ray_node.Node.__dict__["start_log_monitor"] is before["start_log_monitor"]
        raise RuntimeError("ray.init failed")
    assert originals() == before


def test_turned_off_it_changes_nothing(monkeypatch):
    monkeypatch.setenv(_lean.LEAN_ENV, "0")
    before = originals()
    with _lean.lean_local_start() as extra:
        assert originals() == before and extra == {}


def test_a_ray_without_those_methods_gets_only_the_settings(monkeypatch):
    monkeypatch.delattr(ray_node.Node, "start_monitor")
    with _lean.lean_local_start() as extra:
        assert "start_monitor" not in ray_node.Node.__dict__
        assert ray_node.Node.__dict__["start_api_server"] is not _lean._skip
        assert extra == {"_system_config": _lean.LEAN_SYSTEM_CONFIG}


@dataclass
class Proc:
    code: int | None = None

    def poll(self) -> int | None:
        return self.code


@dataclass
class Info:
    process: Proc


@dataclass(frozen=True)
class Key:
    value: str

    def hex(self) -> str:
        return self.value


@dataclass
class FakeNode:
    """A node whose GCS answers with its own id from the ``registers_after``-th ask on."""

    registers_after: int
    raylet: Proc = field(default_factory=Proc)
    asks: int = 0
    _node_id: str = "ab" * 28

    def __post_init__(self) -> None:
        from ray._private import ray_constants

        self.all_processes = {ray_constants.PROCESS_TYPE_RAYLET: [Info(self.raylet)]}

    def get_gcs_client(self) -> FakeNode:
        return self

    def get_all_node_info(self, timeout: int) -> dict[Key, object]:
        assert 1 <= timeout <= 5
        self.asks += 1
        if self.asks >= self.registers_after:
            return {Key("cd" * 28): object(), Key(self._node_id): object()}
        return {Key("cd" * 28): object()}  # another node is not ours


def test_registration_is_noticed_on_the_first_answer_that_has_it():
    node = FakeNode(registers_after=4)
    assert _lean.wait_registered(node, timeout_s=5) is True
    assert node.asks == 4  # polled every REGISTRATION_POLL_S, not once a second


def test_a_dead_raylet_or_the_deadline_ends_the_wait_and_leaves_it_to_ray():
    dead = FakeNode(registers_after=10**6, raylet=Proc(code=1))
    assert _lean.wait_registered(dead, timeout_s=5) is False and dead.asks == 0
    slow = FakeNode(registers_after=10**6)
    assert _lean.wait_registered(slow, timeout_s=0.1) is False and slow.asks >= 2


def test_a_failing_check_never_fails_the_start():
    started = []

    def start(node: Any) -> None:
        started.append(node)

    class Broken:
        def get_gcs_client(self) -> Any:
            raise RuntimeError("no GCS client in this Ray")

    wrapped = _lean._then_wait_registered(start)
    node = Broken()
    wrapped(node)  # no exception: Ray's own check decides
    assert started == [node]
