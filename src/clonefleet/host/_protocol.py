"""The calls a scheduler makes on a clone host, declared once.

:class:`HostCalls` is what every host answers; :class:`PlacedHost` and :class:`WatchedHost` are
what a host in its own process adds (its cluster node, and a call that returns when it dies).
The Ray-backed host and its actor (``clonefleet.host.remote``), the in-process hosts of
``clonefleet.testing`` and :class:`~clonefleet.host.HostCore` (the same calls, synchronous where
nothing is awaited) offer exactly these signatures;
``tests/unit/host/test_host_calls.py`` checks each of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from clonefleet.clone import CloneSpec
from clonefleet.config import Config
from clonefleet.control import JobControl
from clonefleet.providers import SimScript

__all__ = ["AskingHostFactory", "HostCalls", "HostFactory", "PlacedHost", "WatchedHost"]


class HostCalls(Protocol):
    """A clone host as the scheduler sees it.

    Every call may raise :class:`~clonefleet.errors.ClusterError` when the host is gone.
    """

    host_id: str
    """The scheduler's name for the host (``h1``, ``h2``...)."""

    async def start(
        self,
        specs: Sequence[CloneSpec],
        config: Config,
        sim_script: SimScript | None = None,
        resume: Mapping[str, dict[str, Any]] | None = None,
    ) -> int:
        """Start one clone per spec and return how many were asked for; a job with an entry
        in ``resume`` continues from that checkpoint."""
        ...

    async def cancel(self, job_ids: Sequence[str]) -> list[str]:
        """Cancel clones; returns the ids that were still running (or not yet started) here."""
        ...

    async def deliver(self, items: Sequence[Mapping[str, Any]]) -> int:
        """Hand messages (``{delivery_id, job_id, text}``) to clones of this host; returns how
        many were handed."""
        ...

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        """The buffered events (``{job_id, event}``), waiting up to ``wait_s`` for the first."""
        ...

    async def plan(self, planner: Callable[[], tuple[CloneSpec, ...]]) -> tuple[CloneSpec, ...]:
        """Run a nested spawn's rendering on this host, off its event loop, and return the
        specs; the render's own errors come back as they are."""
        ...

    async def close(self) -> None:
        """Stop the host's clones and free it (a Ray host's process ends)."""
        ...


@runtime_checkable
class PlacedHost(Protocol):
    """A host that knows the cluster node it runs on (hosts in their own process)."""

    async def node_id(self) -> str:
        """The node's id; answering also means the host has started."""
        ...


@runtime_checkable
class WatchedHost(Protocol):
    """A host whose death can be awaited (the scheduler replaces idle ones that die)."""

    async def watch(self) -> None:
        """Return only when the host is gone, raising :class:`~clonefleet.errors.ClusterError`."""
        ...


HostFactory = Callable[[str, JobControl], HostCalls]
"""Makes a host for ``(host_id, control)``; ``control`` is the in-process job control (the
scheduler core itself; a Ray-backed host reaches the scheduler actor by name instead)."""

AskingHostFactory = Callable[[str, JobControl, Mapping[str, float]], HostCalls]
"""Makes a host that asks the cluster for resources (``cluster.host_resources``): for
``(host_id, control, resources)``. Such a host may wait for a node before it starts."""
