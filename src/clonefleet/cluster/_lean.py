"""A leaner start for the embedded Ray instance: what a one-machine run does not use is not started.

:func:`lean_local_start` wraps one ``ray.init`` of an embedded instance: Ray's API server,
autoscaler monitor and (unless logs go to the driver) log monitor are not started, the node's
registration is polled every :data:`REGISTRATION_POLL_S`, and :data:`LEAN_SYSTEM_CONFIG` turns
task events and metrics off. The changes are to methods of Ray's ``Node`` class, put back when
the ``with`` block ends; ``CLONEFLEET_LEAN_RAY=0`` turns them off. Why each, and what it saves:
docs/cluster.md, "Embedded start-up".
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LEAN_ENV", "LEAN_SYSTEM_CONFIG", "REGISTRATION_POLL_S", "lean_local_start"]

LEAN_ENV = "CLONEFLEET_LEAN_RAY"
"""Set to ``0`` to start the embedded instance with everything Ray starts by default."""
REGISTRATION_POLL_S = 0.02
"""How often the new node's registration with the GCS is checked."""
REGISTRATION_WAIT_S = 30.0
"""How long the registration is waited for here before Ray's own (slower) check takes over;
Ray's check gives up 30 s after it starts, with its own error."""
LEAN_SYSTEM_CONFIG: dict[str, Any] = {
    "task_events_report_interval_ms": 0,
    "enable_metrics_collection": False,
}
"""Ray's settings for a lean embedded instance: no task events (read only through the API
server's state API), no metrics (read only through the dashboard)."""
_SKIPPED = ("start_api_server", "start_monitor")
_PATCHED = (*_SKIPPED, "start_log_monitor", "start_ray_processes")


@contextlib.contextmanager
def lean_local_start(*, logs_to_driver: bool = False) -> Iterator[dict[str, Any]]:
    """Inside this block, an embedded ``ray.init`` starts without Ray's API server and monitor
    (and without its log monitor unless ``logs_to_driver``), and notices its node's
    registration within :data:`REGISTRATION_POLL_S`; the block gets the keywords to add to
    that ``ray.init`` (none when the lean start is off)."""
    if os.environ.get(LEAN_ENV, "1") == "0":
        yield {}
        return
    from ray._private import node as ray_node

    node_cls: Any = ray_node.Node
    extra = {"_system_config": dict(LEAN_SYSTEM_CONFIG)}
    if not all(callable(node_cls.__dict__.get(name)) for name in _PATCHED):
        yield extra  # a Ray whose start-up is arranged differently: only the settings
        return
    skipped = _SKIPPED if logs_to_driver else (*_SKIPPED, "start_log_monitor")
    saved = {name: node_cls.__dict__[name] for name in (*skipped, "start_ray_processes")}
    for name in skipped:
        setattr(node_cls, name, _skip)
    node_cls.start_ray_processes = _then_wait_registered(saved["start_ray_processes"])
    try:
        yield extra
    finally:
        for name, method in saved.items():
            setattr(node_cls, name, method)


def _skip(self: Any, *args: Any, **kwargs: Any) -> None:
    """Start nothing (Ray's API server, autoscaler monitor or log monitor)."""


def _then_wait_registered(start: Callable[[Any], None]) -> Callable[[Any], None]:
    def start_ray_processes(self: Any) -> None:
        start(self)
        with contextlib.suppress(Exception):  # any surprise: Ray's own check decides
            wait_registered(self, REGISTRATION_WAIT_S)

    return start_ray_processes


def wait_registered(node: Any, timeout_s: float) -> bool:
    """Poll the GCS until ``node`` (a Ray ``Node`` whose processes were just started) has
    registered; ``False`` when it did not within ``timeout_s`` or its raylet exited first."""
    from ray._private import ray_constants

    client = node.get_gcs_client()
    node_id = str(node._node_id)
    raylets = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or []
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or any(info.process.poll() is not None for info in raylets):
            return False
        nodes = client.get_all_node_info(timeout=max(1, min(5, int(remaining))))
        if any(key.hex() == node_id for key in nodes):
            return True
        time.sleep(REGISTRATION_POLL_S)
