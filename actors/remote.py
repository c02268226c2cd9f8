"""Ray shells of the clone side: :class:`CloneHostActor` and its facade :class:`CloneHost`.

The actor only turns picklable specs into live objects and forwards calls to
:class:`~clonefleet.actors._host.HostCore`; the facade turns Ray's system errors into ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from ..cluster import NAMESPACE, SCHEDULER_NAME
from ..config import Config
from ..errors import ClonefleetError, ClusterError
from ..providers import SimScript
from ._host import HostCore
from ._spec import CloneSpec

__all__ = ["CloneHost", "CloneHostActor"]


@ray.remote(num_cpus=0, max_concurrency=64, max_restarts=0)
class CloneHostActor:
    """Hosts many clones as asyncio tasks in one worker process."""

    def __init__(self) -> None:
        # Import what every clone needs now, while the host is only warming up, so the first
        # batch does not pay for it (about a second on a busy 2-core machine).
        from .. import providers
        from . import _loop  # noqa: F401

        providers.preload()

        self._core: HostCore | None = None

    def _host(self) -> HostCore:
        # Loop-bound objects (events, HTTP clients) are made on first use inside the actor's loop.
        if self._core is None:
            self._core = HostCore(control=SchedulerControl())
        return self._core

    async def start(
        self, specs: list[CloneSpec], config: Config, sim_script: SimScript | None = None
    ) -> int:
        self._host().start(specs, config, sim_script)
        return len(specs)

    async def cancel(self, job_ids: list[str]) -> list[str]:
        return self._host().cancel(job_ids)

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        return await self._host().drain(wait_s)

    async def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    async def aclose(self) -> None:
        if self._core is not None:
            await self._core.aclose()


class SchedulerControl:
    """Job control for spawning clones, backed by the named scheduler actor."""

    def __init__(self) -> None:
        self._handle: Any = None

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self._handle is None:
            self._handle = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
        try:
            return await getattr(self._handle, method).remote(*args, **kwargs)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ClonefleetError):
                raise cause from None
            raise ClusterError(f"scheduler call {method} failed: {type(exc).__name__}") from None
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise ClusterError(f"the scheduler is unavailable: {type(exc).__name__}") from None

    async def spawn(self, request: dict[str, Any], parent_job_id: str) -> dict[str, Any]:
        return await self._call("spawn_nested", request, parent_job_id)

    async def job_status(self, job_id: str) -> dict[str, Any]:
        return await self._call("job_status", job_id)

    async def job_result(self, job_id: str) -> dict[str, Any]:
        return await self._call("job_result", job_id)

    async def job_cancel(self, job_id: str) -> dict[str, Any]:
        return await self._call("job_cancel", job_id)

    async def job_block(
        self, job_ids: list[str], wait_seconds: float | None, timeout_seconds: float | None
    ) -> dict[str, Any]:
        return await self._call("job_block", job_ids, wait_seconds, timeout_seconds)

    async def list_jobs(self, **filters: Any) -> dict[str, Any]:
        return await self._call("list_jobs", **filters)


class CloneHost:
    """Facade over one :class:`CloneHostActor`: awaitables in, our errors out."""

    def __init__(self, handle: Any, host_id: str) -> None:
        self.handle, self.host_id = handle, host_id

    @classmethod
    def create(cls, host_id: str, *, options: dict[str, Any] | None = None) -> CloneHost:
        handle = CloneHostActor.options(name=None, **(options or {})).remote()
        return cls(handle, host_id)

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self.handle, method).remote(*args)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise ClusterError(f"clone host {self.host_id} is gone: {type(exc).__name__}") from None

    async def start(
        self, specs: Sequence[CloneSpec], config: Config, sim_script: SimScript | None = None
    ) -> int:
        return await self._call("start", list(specs), config, sim_script)

    async def cancel(self, job_ids: Sequence[str]) -> list[str]:
        return await self._call("cancel", list(job_ids))

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        return await self._call("drain", wait_s)

    async def node_id(self) -> str:
        return await self._call("node_id")

    def kill(self) -> None:
        ray.kill(self.handle, no_restart=True)
