"""Ray shells of the clone side: :class:`CloneHostActor`, its facade :class:`CloneHost`, and
:class:`SchedulerControl`, the job control its clones use.

The actor only turns picklable specs into live objects and forwards calls to
:class:`~clonefleet.host.HostCore`; the facades turn Ray's system errors into ours. The actor and
:class:`CloneHost` answer the calls of :class:`~clonefleet.host.HostCalls` with its signatures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack, cast

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clonefleet import control as api
from clonefleet.admission.remote import remote_source
from clonefleet.clone import CloneSpec
from clonefleet.cluster import NAMESPACE, SCHEDULER_NAME, tune_collector
from clonefleet.config import Config
from clonefleet.control import Seconds
from clonefleet.errors import ClonefleetError, ClusterError
from clonefleet.host._core import HostCore
from clonefleet.providers import SimScript

__all__ = [
    "CloneHost",
    "CloneHostActor",
    "SchedulerControl",
]


_DRAIN_EVERY_S = 0.02
"""Least time between two event batches a host hands the scheduler (see ``HostCore``): at
thousands of clones a drain per handful of events made hundreds of actor calls a second."""


class CloneHostActor:
    """Hosts many clones as asyncio tasks in one worker process (a Ray actor: see
    :data:`_HOST_ACTOR`)."""

    def __init__(self) -> None:
        # Import what every clone needs now, while the host is only warming up, so the first
        # batch does not pay for it (about a second on a busy 2-core machine). The clone loop
        # came with this module's import of the host core.
        from clonefleet import providers

        providers.preload()
        tune_collector()

        self._core: HostCore | None = None

    def _host(self) -> HostCore:
        # Loop-bound objects (events, HTTP clients) are made on first use inside the actor's loop.
        if self._core is None:
            self._core = HostCore(
                control=SchedulerControl(),
                drain_every_s=_DRAIN_EVERY_S,
                admission=remote_source(),
            )
        return self._core

    async def start(
        self,
        specs: Sequence[CloneSpec],
        config: Config,
        sim_script: SimScript | None = None,
        resume: Mapping[str, dict[str, Any]] | None = None,
    ) -> int:
        return self._host().start(specs, config, sim_script, resume)

    async def cancel(self, job_ids: Sequence[str]) -> list[str]:
        return self._host().cancel(job_ids)

    async def deliver(self, items: Sequence[Mapping[str, Any]]) -> int:
        return self._host().deliver(items)

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        return await self._host().drain(wait_s)

    async def plan(self, planner: Callable[[], tuple[CloneSpec, ...]]) -> tuple[CloneSpec, ...]:
        return await self._host().plan(planner)

    async def node_id(self) -> str:
        node: str = ray.get_runtime_context().get_node_id()
        return node

    async def watch(self) -> None:
        """Never returns: the caller learns of this host's death when the call fails."""
        await asyncio.Event().wait()

    async def close(self) -> None:
        if self._core is not None:
            await self._core.aclose()


_HOST_ACTOR = ray.remote(CloneHostActor)
_HOST_OPTIONS: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 64, "max_restarts": 0}
"""Every clone host: no CPU reserved unless it asks for resources (its clones mostly wait on
models), many concurrent calls, and no restart (a dead host's jobs end as crashed)."""


def resource_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray actor options asking for ``resources`` (``cluster.host_resources``): ``CPU``,
    ``GPU`` and ``memory`` are Ray's own options, any other name a custom resource."""
    own = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
    options: dict[str, Any] = {"num_cpus": 0}
    custom: dict[str, float] = {}
    for name, amount in resources.items():
        if name in own:
            options[own[name]] = int(amount) if name == "memory" else amount
        else:
            custom[name] = amount
    if custom:
        options["resources"] = custom
    return options


_Call = Callable[[Any], Any]
"""One call on an actor handle: ``lambda actor: actor.method.remote(...)``, returning its ref."""


class SchedulerControl:
    """:class:`~clonefleet.control.JobControl` for clones that spawn: each method forwards to
    the named scheduler actor."""

    def __init__(self) -> None:
        self._handle: Any = None

    async def _ask(self, call: _Call) -> Any:
        """Make one call on the scheduler actor and await it; our errors come back unwrapped,
        Ray's become :class:`ClusterError`."""
        if self._handle is None:
            self._handle = ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)
        try:
            return await call(self._handle)
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ClonefleetError):
                raise cause from None
            name = getattr(exc, "function_name", "")
            raise ClusterError(f"scheduler call {name} failed: {type(exc).__name__}") from None
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise ClusterError(f"the scheduler is unavailable: {type(exc).__name__}") from None

    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> api.Submitted:
        return cast(
            api.Submitted, await self._ask(lambda s: s.spawn_nested.remote(request, parent_job_id))
        )

    async def job_status(self, job_id: str) -> api.JobStatus:
        return cast(api.JobStatus, await self._ask(lambda s: s.job_status.remote(job_id)))

    async def job_result(self, job_id: str) -> api.RunRecord:
        return cast(api.RunRecord, await self._ask(lambda s: s.job_result.remote(job_id)))

    async def job_cancel(self, job_id: str) -> api.JobStatus:
        return cast(api.JobStatus, await self._ask(lambda s: s.job_cancel.remote(job_id)))

    async def cancel_many(self, ids: Sequence[str]) -> int:
        return cast(int, await self._ask(lambda s: s.cancel_many.remote(list(ids))))

    async def job_block(
        self, job_ids: Sequence[str], wait_seconds: Seconds = None, timeout_seconds: Seconds = None
    ) -> api.BlockResult:
        ids = list(job_ids)
        out = await self._ask(lambda s: s.job_block.remote(ids, wait_seconds, timeout_seconds))
        return cast(api.BlockResult, out)

    async def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        return cast(int, await self._ask(lambda s: s.remaining.remote(list(ids), wait_seconds)))

    async def list_jobs(self, **filters: Unpack[api.JobFilter]) -> api.JobListing:
        out = await self._ask(lambda s: s.list_jobs.remote(**filters))
        return cast(api.JobListing, out)

    async def expand(self, ids: Sequence[str]) -> list[str]:
        return cast(list[str], await self._ask(lambda s: s.expand.remote(list(ids))))

    async def events(
        self, target: api.Target = None, **query: Unpack[api.EventQuery]
    ) -> api.EventPage:
        out = await self._ask(lambda s: s.events.remote(target, **query))
        return cast(api.EventPage, out)

    async def message(self, job_id: str, text: str, *, sender: str) -> dict[str, Any]:
        """The ``message_subagent`` tool: queue ``text`` for ``job_id``, a descendant of the
        sender's job, through the inbox actor."""
        inbox = await self._ask(lambda s: s.inbox.remote())
        try:
            return cast(dict[str, Any], await inbox.send.remote(job_id, text, sender))
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ClonefleetError):
                raise cause from None
            raise ClusterError(f"the inbox failed: {type(exc).__name__}") from None
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise ClusterError(f"the inbox is unavailable: {type(exc).__name__}") from None


class CloneHost:
    """Facade over one :class:`CloneHostActor`: awaitables in, our errors out."""

    def __init__(self, handle: Any, host_id: str) -> None:
        self.handle, self.host_id = handle, host_id
        self._node: str | None = None

    @classmethod
    def create(
        cls,
        host_id: str,
        *,
        node_id: str | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> CloneHost:
        """Start a host actor: on ``node_id`` or not at all (hard affinity: when that node has
        died the host's calls fail, and the scheduler moves its jobs), else spread. A host
        asking for ``resources`` is spread wherever they are free, and waits for them (a node
        an autoscaler adds) when none has them."""
        strategy: Any = "SPREAD"
        if node_id is not None and not resources:
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        options = {**_HOST_OPTIONS, **resource_options(resources or {})}
        options["scheduling_strategy"] = strategy
        return cls(_HOST_ACTOR.options(name=None, **options).remote(), host_id)

    async def _ask(self, call: _Call) -> Any:
        """Make one call on the host actor and await it; a host that is gone raises
        :class:`ClusterError`."""
        try:
            return await call(self.handle)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
            raise ClusterError(f"clone host {self.host_id} is gone: {type(exc).__name__}") from None

    async def start(
        self,
        specs: Sequence[CloneSpec],
        config: Config,
        sim_script: SimScript | None = None,
        resume: Mapping[str, dict[str, Any]] | None = None,
    ) -> int:
        ckpts = dict(resume) if resume else None
        return cast(
            int, await self._ask(lambda h: h.start.remote(list(specs), config, sim_script, ckpts))
        )

    async def cancel(self, job_ids: Sequence[str]) -> list[str]:
        return cast(list[str], await self._ask(lambda h: h.cancel.remote(list(job_ids))))

    async def deliver(self, items: Sequence[Mapping[str, Any]]) -> int:
        batch = [dict(item) for item in items]
        return cast(int, await self._ask(lambda h: h.deliver.remote(batch)))

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._ask(lambda h: h.drain.remote(wait_s)))

    async def plan(self, planner: Callable[[], tuple[CloneSpec, ...]]) -> tuple[CloneSpec, ...]:
        """The render's own errors (a ``TemplateError``...) come back unwrapped, anything else
        as :class:`ClusterError`."""
        try:
            out = await self._ask(lambda h: h.plan.remote(planner))
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ClonefleetError):
                raise cause from None
            raise ClusterError(
                f"clone host {self.host_id} failed to plan: {type(exc).__name__}"
            ) from None
        return cast(tuple[CloneSpec, ...], out)

    async def node_id(self) -> str:
        """The host's node, asked once."""
        if self._node is None:
            self._node = cast(str, await self._ask(lambda h: h.node_id.remote()))
        return self._node

    async def watch(self) -> None:
        await self._ask(lambda h: h.watch.remote())

    async def close(self) -> None:
        # A finished host's process is freed at once: a batch of thousands must not keep idle
        # Python processes around.
        self.kill()

    def kill(self) -> None:
        """End the host actor's process now (its running clones die with it)."""
        ray.kill(self.handle, no_restart=True)
