"""Ray shell of admission: the cluster's one limiter (:class:`AdmissionActor`), named and
detached, and how hosts and the scheduler reach it (docs/rate-limits.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import ray

from clonefleet.admission._core import AdmissionCore
from clonefleet.admission._gate import SyncSource
from clonefleet.admission._scope import Demand, Grant
from clonefleet.cluster import NAMESPACE

__all__ = [
    "ADMISSION_NAME",
    "AdmissionActor",
    "admission_snapshot",
    "get_or_create_admission",
    "remote_source",
]

ADMISSION_NAME = "admission"
"""The limiter actor's name in :data:`~clonefleet.cluster.NAMESPACE`."""
SYNC_TIMEOUT_S = 10.0
"""A sync unanswered this long is given up: the host's own limiter answers instead."""


class AdmissionActor:
    """Holds the cluster's :class:`AdmissionCore`. Its state is what it learned; after a restart
    it learns again (configured limits come with every sync)."""

    def __init__(self, safety: float = 0.95) -> None:
        self._core = AdmissionCore(safety=safety)

    async def sync(self, host: str, demands: Sequence[Demand]) -> list[Grant]:
        return self._core.sync(host, demands, time.monotonic())

    async def snapshot(self) -> list[dict[str, Any]]:
        return self._core.snapshot(time.monotonic())


_ACTOR = ray.remote(AdmissionActor)


def get_or_create_admission() -> Any:
    """The cluster's limiter actor handle, created detached on first use."""
    return _ACTOR.options(
        num_cpus=0,
        max_concurrency=1000,
        name=ADMISSION_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=0,
    ).remote()


def remote_source() -> SyncSource:
    """A host's way to the limiter actor, looked up (or created) on the first sync, which
    waits for it to start (a configured limit must hold from the first request on)."""
    handle: Any = None

    async def sync(host: str, demands: list[Demand]) -> list[Grant]:
        nonlocal handle
        if handle is None:
            handle = get_or_create_admission()
        try:
            grants: list[Grant] = await asyncio.wait_for(
                handle.sync.remote(host, demands), SYNC_TIMEOUT_S
            )
        except BaseException:
            handle = None  # look it up again next time
            raise
        return grants

    return sync


async def admission_snapshot() -> list[dict[str, Any]]:
    """The limiter's view of every scope; empty when no limiter runs yet."""
    try:
        handle = ray.get_actor(ADMISSION_NAME, namespace=NAMESPACE)
    except ValueError:
        return []
    rows: list[dict[str, Any]] = await asyncio.wait_for(handle.snapshot.remote(), SYNC_TIMEOUT_S)
    return rows
