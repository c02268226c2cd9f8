"""What a new clone host asks Ray for, so that an autoscaler grows the cluster for a big batch.

Pure: :class:`Placement` reads ``cluster.*`` (:class:`~clonefleet.config.ClusterConfig`), what
the scheduler last saw of the cluster's nodes and a clock, and answers what the next busy host
asks for and how many clones it holds at most. A host that asks for resources no node has free
waits for Ray to place it (an autoscaler adds a node for it); one still waiting after
``cluster.host_wait_s`` is given up (:meth:`Placement.unplaced`), its clones go to the hosts that
run, and new hosts ask for nothing for as long again, so a cluster that cannot grow does not make
every batch wait. docs/cluster.md, "Capacity".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from clonefleet.config import ClusterConfig

__all__ = ["NODE_GROUP_LABEL", "PENDING_NOTICE_S", "Placement", "autoscaled"]

NODE_GROUP_LABEL = "ray.io/node-group"
"""The label Ray gives a node started for one of an autoscaler's node types (``RAY_NODE_TYPE_NAME``
in its environment: the cluster launcher, KubeRay and Ray's fake multi-node provider set it)."""

PENDING_NOTICE_S = 5.0
"""How long a host asking for resources may take to start before its jobs get a ``host_pending``
event: a host whose resources are free starts in a second or two."""


def autoscaled(nodes: Iterable[Mapping[str, Any]]) -> bool:
    """Whether an alive node of ``ray.nodes()`` was started for an autoscaler's node type."""
    return any(n.get("Alive") and (n.get("Labels") or {}).get(NODE_GROUP_LABEL) for n in nodes)


class Placement:
    """What the next busy clone host asks for (see the module's docstring).

    Args:
        settings: the scheduler's ``cluster`` settings.
        clock: monotonic seconds.
    """

    def __init__(
        self, settings: ClusterConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or ClusterConfig()
        self._clock = clock
        self.autoscaled = False
        """Whether the cluster was last seen with a node an autoscaler started (the scheduler's
        Ray shell sets it from the nodes it lists)."""
        self._short_until = -1.0
        self.given_up = 0
        """Hosts given up on because Ray did not place them in time (for status and tests)."""

    @property
    def asking(self) -> bool:
        """Whether busy hosts ask for ``cluster.host_resources`` (``autoscale`` says so, and
        there is something to ask for); a shortage does not change this."""
        mode = self.settings.autoscale
        wanted = mode == "on" or (mode == "auto" and self.autoscaled)
        return wanted and bool(self.settings.host_resources)

    @property
    def short(self) -> bool:
        """Whether a host was given up on within the last ``cluster.host_wait_s``."""
        return self._clock() < self._short_until

    def ask(self) -> dict[str, float]:
        """What the next busy host asks Ray for; empty: nothing (it goes to a node that exists,
        like an idle warm host)."""
        if not self.asking or self.short:
            return {}
        return dict(self.settings.host_resources)

    def cap(self) -> int | None:
        """Most clones per new host while hosts ask for resources, else ``None``."""
        return self.settings.max_clones_per_host if self.asking and not self.short else None

    @property
    def wait_s(self) -> float:
        """How long a host asking for resources may wait to be placed."""
        return self.settings.host_wait_s

    def unplaced(self) -> None:
        """A host was not placed within :attr:`wait_s`: new hosts ask for nothing, and hold
        as many clones as before, for :attr:`wait_s` from now."""
        self.given_up += 1
        self._short_until = self._clock() + self.settings.host_wait_s
