"""Ray shells of the clone side: :class:`CloneHostActor`, its facade :class:`CloneHost`, and
:class:`SchedulerControl`, the job control its clones use.

The actor only turns picklable specs into live objects and forwards calls to
:class:`~clonefleet.actors._host.HostCore`; the facades turn Ray's system errors into ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack, cast

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import control as api
from ..cluster import NAMESPACE, SCHEDULER_NAME, tune_collector
from ..config import Config
from ..control import Seconds
from ..errors import ClonefleetError, ClusterError
from ..journal import Journal
from ..providers import SimScript
from ..vocab import skill_refs
from ._host import HostCore
from ._inbox import Delivery, InboxCore, InboxLimits
from ._spec import CloneSpec

__all__ = [
    "INBOX_NAME",
    "CloneHost",
    "CloneHostActor",
    "InboxActor",
    "SchedulerControl",
    "get_or_create_inbox",
]


_DRAIN_EVERY_S = 0.02
"""Least time between two event batches a host hands the scheduler (see ``HostCore``): at
thousands of clones a drain per handful of events made hundreds of actor calls a second."""


class CloneHostActor:
    """Hosts many clones as asyncio tasks in one worker process (a Ray actor: see
    :data:`_HOST_ACTOR`)."""

    def __init__(self) -> None:
        # Import what every clone needs now, while the host is only warming up, so the first
        # batch does not pay for it (about a second on a busy 2-core machine).
        from .. import providers
        from . import _loop  # noqa: F401

        providers.preload()
        tune_collector()

        self._core: HostCore | None = None

    def _host(self) -> HostCore:
        # Loop-bound objects (events, HTTP clients) are made on first use inside the actor's loop.
        if self._core is None:
            self._core = HostCore(control=SchedulerControl(), drain_every_s=_DRAIN_EVERY_S)
        return self._core

    async def start(
        self,
        specs: list[CloneSpec],
        config: Config,
        sim_script: SimScript | None = None,
        checkpoints: dict[str, dict[str, Any]] | None = None,
    ) -> int:
        self._host().start(specs, config, sim_script, checkpoints)
        return len(specs)

    async def cancel(self, job_ids: list[str]) -> list[str]:
        return self._host().cancel(job_ids)

    async def deliver(self, items: list[dict[str, Any]]) -> int:
        return self._host().deliver(items)

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        return await self._host().drain(wait_s)

    async def plan(self, planner: Callable[[], Any]) -> Any:
        return await self._host().plan(planner)

    async def node_id(self) -> str:
        node: str = ray.get_runtime_context().get_node_id()
        return node

    async def watch(self) -> None:
        """Never returns: the caller learns of this host's death when the call fails."""
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        if self._core is not None:
            await self._core.aclose()


_HOST_ACTOR = ray.remote(CloneHostActor)
_HOST_OPTIONS: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 64, "max_restarts": 0}
"""Every clone host: no CPU reserved (its clones mostly wait on models), many concurrent calls,
and no restart (a dead host's jobs end as crashed)."""

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

    @classmethod
    def create(cls, host_id: str, *, options: dict[str, Any] | None = None) -> CloneHost:
        handle = _HOST_ACTOR.options(**_HOST_OPTIONS, name=None, **(options or {})).remote()
        return cls(handle, host_id)

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
        checkpoints: Mapping[str, dict[str, Any]] | None = None,
    ) -> int:
        """Start ``specs`` on the host; a job with an entry in ``checkpoints`` resumes from it."""
        ckpts = dict(checkpoints) if checkpoints else None
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
        """Render a nested spawn on this host (see :meth:`HostCore.plan`); the render's own
        errors (a ``TemplateError``...) come back unwrapped, anything else as
        :class:`ClusterError`."""
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
        return cast(str, await self._ask(lambda h: h.node_id.remote()))

    async def watch(self) -> None:
        """Return only when the host is gone, raising :class:`ClusterError`."""
        await self._ask(lambda h: h.watch.remote())

    def kill(self) -> None:
        ray.kill(self.handle, no_restart=True)


INBOX_NAME = "inbox"
"""The inbox actor's name in :data:`~clonefleet.cluster.NAMESPACE`."""
ROUTE_GATHER_S = 0.01
"""Messages sent within this long are routed together, in one call to the scheduler."""
HOUSEKEEPING_ROUNDS = 120
"""Rounds of the routing loop (half a second each) between housekeeping passes."""
SETTLED_KEPT_S = 7 * 24 * 3600.0
"""How long a delivered or undelivered delivery can still be looked up."""
COMPACT_BYTES = 64 * 1024 * 1024
"""Journal size past which the inbox rewrites it as one snapshot of what it still holds."""
REROUTE_S = 2.0
"""A delivery still queued this long after it was last routed is routed again (its clone may
have moved, or the inbox restarted); clones skip what they already took."""


class InboxActor:
    """Owns every delivery (:class:`~clonefleet.actors._inbox.InboxCore`) and its journal; routes
    queued deliveries through the scheduler, which knows where each job runs. A Ray actor (see
    :func:`get_or_create_inbox`): named, detached, restarted by Ray, rebuilt from its journal."""

    def __init__(self, journal_dir: str, limits: InboxLimits | None = None) -> None:
        self._dir, self._limits = journal_dir, limits or InboxLimits()
        self._core: InboxCore | None = None
        self._journal: Journal | None = None
        self._routed: dict[str, float] = {}
        self._outbox: list[Delivery] = []
        self._loop_task: asyncio.Task[None] | None = None
        self.damage: list[str] = []
        with contextlib.suppress(Exception):  # restarted: rebuild and route without a caller
            ray.get_runtime_context().current_actor.ping.remote()

    def _c(self) -> InboxCore:
        if self._core is None:
            journal, replay = Journal.open(self._dir)
            journal.start_background()
            core = InboxCore(self._limits, journal)
            core.restore(replay.records)
            self._core, self._journal = core, journal
            self.damage = [str(d) for d in replay.damage]
            self._loop_task = asyncio.get_running_loop().create_task(self._reroute())
        return self._core

    async def ping(self) -> str:
        self._c()
        return "ok"

    async def send(self, job_id: str, text: str, sender: str | None = None) -> dict[str, Any]:
        """Queue a message for a job: checked (limits, the job, its ``@skill:`` references),
        recorded on disk, then routed. Our errors (``UnknownJobError``, ``UsageError``) say why
        nothing was queued. A ``sender`` job (the ``message_subagent`` tool) may message only
        its own descendants."""
        core = self._c()
        core.check(job_id, text)
        try:
            await _scheduler().check_message.remote(job_id, text, skill_refs(text), sender)
        except RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ClonefleetError):
                raise cause from None
            raise ClusterError(f"the scheduler could not check the message: {exc}") from None
        delivery = core.accept(job_id, text)
        assert self._journal is not None
        await self._journal.commit()
        self._outbox.append(delivery)
        if len(self._outbox) == 1:  # the first of a group: route the group shortly, in one call
            asyncio.get_running_loop().create_task(self._route_outbox())
        return {"delivery_id": delivery.delivery_id, "status": delivery.state}

    async def _route_outbox(self) -> None:
        await asyncio.sleep(ROUTE_GATHER_S)
        group, self._outbox = self._outbox, []
        await self._route(group)

    async def delivery(self, delivery_id: str) -> dict[str, Any]:
        return self._c().get(delivery_id).view()

    async def acked(self, delivery_ids: list[str]) -> None:
        # Answered once on disk: a caller that heard back never sends it again, and an
        # acknowledgement lost with this process would leave its delivery queued for good (its
        # clone skips a delivery routed to it again, without a second acknowledgement).
        if self._c().acked(delivery_ids):
            await self._commit()

    async def ended(self, job_ids: list[str]) -> list[dict[str, Any]]:
        done = self._c().ended(job_ids)
        if done:
            await self._commit()
        return [{"delivery_id": d.delivery_id, "job_id": d.job_id} for d in done]

    async def _commit(self) -> None:
        assert self._journal is not None
        await self._journal.commit()

    async def resend(self, jobs: list[tuple[str, list[str]]]) -> None:
        core = self._c()
        await self._route([d for job_id, have in jobs for d in core.to_resend(job_id, have)])

    async def _route(self, deliveries: list[Delivery]) -> None:
        """Hand deliveries to the scheduler in one call; the jobs it says have ended get their
        queued deliveries marked undelivered (and the scheduler logs that)."""
        if not deliveries:
            return
        now = time.monotonic()
        for d in deliveries:
            self._routed[d.delivery_id] = now
        try:
            ended = await _scheduler().route.remote([d.wire() for d in deliveries])
        except (RayActorError, RayTaskError, ValueError):
            return  # the scheduler is restarting: the reroute loop tries again
        if ended:
            gone = self._c().ended(ended)
            items = [{"delivery_id": d.delivery_id, "job_id": d.job_id} for d in gone]
            with contextlib.suppress(RayActorError, RayTaskError, ValueError):
                await _scheduler().undelivered.remote(items)

    async def _reroute(self) -> None:
        """Route again what stayed queued for :data:`REROUTE_S` (all of it after a restart);
        now and then, forget old settled deliveries and compact the journal."""
        rounds = 0
        while True:
            core = self._c()
            now = time.monotonic()
            stale = [
                d for d in core.waiting() if now - self._routed.get(d.delivery_id, 0.0) >= REROUTE_S
            ]
            await self._route(stale)
            rounds += 1
            if rounds % HOUSEKEEPING_ROUNDS == 0:
                await self._housekeeping(core)
            await asyncio.sleep(REROUTE_S / 4)

    async def _housekeeping(self, core: InboxCore) -> None:
        try:
            core.evict_settled(time.time() - SETTLED_KEPT_S)
            if self._journal is not None and self._journal.size_bytes() > COMPACT_BYTES:
                await self._journal.compact(core.snapshot())
        except Exception as exc:  # tried again at the next round; the deliveries are unharmed
            self.damage = [*self.damage[-19:], f"housekeeping: {type(exc).__name__}: {exc}"]


def _scheduler() -> Any:
    return ray.get_actor(SCHEDULER_NAME, namespace=NAMESPACE)


_INBOX_ACTOR = ray.remote(InboxActor)


def get_or_create_inbox(journal_dir: str, limits: InboxLimits | None = None) -> Any:
    """The fleet's inbox actor handle, created detached on first use (on the node of the caller,
    which is the scheduler's: the head node)."""
    return _INBOX_ACTOR.options(
        num_cpus=0,
        max_concurrency=1000,
        name=INBOX_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False
        ),
    ).remote(journal_dir, limits)
