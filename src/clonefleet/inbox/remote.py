"""Ray shell of the inbox: the named, detached :class:`InboxActor` and how to reach it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clonefleet.cluster import NAMESPACE, SCHEDULER_NAME
from clonefleet.errors import ClonefleetError, ClusterError
from clonefleet.inbox._core import Delivery, InboxCore, InboxLimits
from clonefleet.journal import Journal
from clonefleet.vocab import skill_refs

__all__ = ["INBOX_NAME", "InboxActor", "get_or_create_inbox"]


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
    """Owns every delivery (:class:`~clonefleet.inbox._core.InboxCore`) and its journal; routes
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
