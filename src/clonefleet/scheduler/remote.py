"""Ray shells of the scheduler: the named, detached :class:`SchedulerActor` and Ray-backed hosts.

The actor forwards every call to :class:`~clonefleet.scheduler._core.SchedulerCore`; the only
Ray-specific work here is creating clone-host actors (spread over the cluster's nodes) and
killing them when their clones are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack, cast

import ray
from ray import cloudpickle
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clonefleet import control as api
from clonefleet.admission.remote import admission_snapshot, get_or_create_admission
from clonefleet.clone import state_of
from clonefleet.cluster import NAMESPACE, SCHEDULER_NAME, read_state, state_dir, tune_collector
from clonefleet.config import ClusterConfig, DurabilityConfig, LimitsConfig
from clonefleet.control import Seconds
from clonefleet.errors import ClusterError, UsageError
from clonefleet.host import is_gated
from clonefleet.host.remote import CloneHost
from clonefleet.inbox import InboxLimits
from clonefleet.inbox.remote import INBOX_NAME, get_or_create_inbox
from clonefleet.journal import Journal, Replay
from clonefleet.planning import BatchSubmission, Placement, autoscaled
from clonefleet.scheduler._core import SchedulerCore
from clonefleet.scheduler._durable import Durable, read_table
from clonefleet.scheduler._mail import check_message
from clonefleet.scheduler._recovery import housekeeping, restore

__all__ = ["SCHEDULER_NAME", "NAMESPACE", "SchedulerActor", "get_or_create_scheduler"]

RATE_LIMITS_TIMEOUT_S = 2.0
"""How long :meth:`SchedulerActor.rate_limits` waits for the limiter before answering none."""


class RayInboxLink:
    """:class:`~clonefleet.scheduler._mail.InboxLink` over the inbox actor's handle; Ray's
    errors become :class:`ClusterError`."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def _ask(self, call: Callable[[Any], Any]) -> Any:
        try:
            return await call(self._handle)
        except (RayActorError, RayTaskError) as exc:
            raise ClusterError(f"the inbox is unavailable: {type(exc).__name__}") from None

    async def acked(self, delivery_ids: list[str]) -> None:
        await self._ask(lambda h: h.acked.remote(delivery_ids))

    async def ended(self, job_ids: list[str]) -> list[dict[str, Any]]:
        return cast(list[dict[str, Any]], await self._ask(lambda h: h.ended.remote(job_ids)))

    async def resend(self, jobs: list[tuple[str, list[str]]]) -> None:
        await self._ask(lambda h: h.resend.remote(jobs))


class SchedulerActor:
    """Owns the fleet's job table; the :class:`~clonefleet.control.JobControl` methods forward
    to the core. A Ray actor (see :func:`get_or_create_scheduler`): one per cluster, named and
    detached, restarted by Ray when its process dies; it then rebuilds its table from its
    journal (``journal_dir``; default: ``journal/`` in the state folder of the head node)."""

    def __init__(
        self,
        max_concurrency: int | None = None,
        warm_hosts: int | None = None,
        journal_dir: str | None = None,
        durability: DurabilityConfig | None = None,
        cluster: ClusterConfig | None = None,
    ) -> None:
        # The job table and event log hold hundreds of thousands of small objects in a big batch;
        # with the default thresholds the collector rescans them all every few thousand
        # allocations, which showed up as pauses of a few hundred milliseconds.
        tune_collector()
        self._max_concurrency = max_concurrency
        self._warm = warm_hosts
        self._durability = durability or DurabilityConfig()
        self._placement = Placement(cluster)
        chosen = journal_dir or self._durability.journal_dir
        self._journal_dir = str(Path(chosen).expanduser() if chosen else _cluster_journal())
        self._core: SchedulerCore | None = None
        self._restored: dict[str, int] = {}
        self._limiter_started = False
        self._housekeeping: asyncio.Task[None] | None = None
        # A scheduler Ray restarted resumes its journal's unfinished jobs at once, without
        # waiting for a client to call: it calls itself.
        with contextlib.suppress(Exception):
            ray.get_runtime_context().current_actor.ping.remote()
        self._nodes: list[str] = []
        self._nodes_at = 0.0
        self._next = 0

    def _refresh_nodes(self) -> None:
        if time.monotonic() - self._nodes_at < 5.0 and self._nodes:
            return
        listed = ray.nodes()
        self._placement.autoscaled = autoscaled(listed)
        alive = [n for n in listed if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        self._nodes = sorted(n["NodeID"] for n in alive)
        self._nodes_at = time.monotonic()
        if self._core is not None:
            self._core.cpus = int(sum(n["Resources"]["CPU"] for n in alive)) or 1
            self._core.nodes = len(alive) or 1

    def _host(self, host_id: str, control: api.JobControl) -> CloneHost:
        """Hosts go round-robin over the alive nodes with CPUs, so a batch covers every node.
        ``control`` is the core's in-process job control: a host actor reaches this actor by
        name instead (see :class:`~clonefleet.host.remote.SchedulerControl`)."""
        self._refresh_nodes()
        node = self._nodes[self._next % len(self._nodes)] if self._nodes else None
        self._next += 1
        return CloneHost.create(host_id, node_id=node)

    def _asking_host(
        self, host_id: str, control: api.JobControl, resources: Mapping[str, float]
    ) -> CloneHost:
        """A host asking the cluster for ``resources`` (``cluster.host_resources``): Ray puts
        it where they are free, or keeps it pending (an autoscaler's demand) until a node has
        them."""
        return CloneHost.create(host_id, resources=resources)

    def _c(self) -> SchedulerCore:
        """The core, made on the first call (inside the actor's event loop): the journal is
        opened and replayed, warm hosts start, and unfinished jobs are queued again."""
        if self._core is None:
            durability = self._durability
            journal, replay = None, Replay()
            if durability.enabled:
                journal, replay = Journal.open(
                    self._journal_dir, segment_bytes=durability.segment_bytes
                )
                journal.start_background()
            self._core = SchedulerCore(
                self._host,
                max_concurrency=self._max_concurrency,
                durable=Durable(journal, cloudpickle.dumps),
                durability=durability,
                placement=self._placement,
                asking_factory=self._asking_host,
            )
            self._nodes_at = 0.0
            self._refresh_nodes()
            # One warm host per CPU: a batch then starts without waiting for worker processes.
            self._core.warm(self._warm if self._warm is not None else self._core.cpus)
            with contextlib.suppress(ValueError):  # an inbox from before a restart
                self._core.mail.link = RayInboxLink(ray.get_actor(INBOX_NAME, namespace=NAMESPACE))
            self._restored = dict(restore(self._core, read_table(replay), cloudpickle.loads))
            self._housekeeping = asyncio.get_running_loop().create_task(housekeeping(self._core))
        return self._core

    async def ping(self) -> str:
        self._c()  # creating the core warms the host pool while the caller renders its batch
        return "ok"

    async def submit(self, sub: BatchSubmission | bytes, open: bool = False) -> api.Submitted:
        """Start a batch; given as its pickle (``Fleet`` sends that), the same bytes go to the
        journal, so the batch is pickled once, by the client. An ``open`` batch takes more
        parts (:meth:`extend`) until it is closed."""
        core = self._c()
        self._refresh_nodes()  # a batch sizes its hosts from the cluster as it is now
        sub, blob = self._unpickle(sub, "submit")
        return await core.submit(sub, blob, open=open)

    async def extend(self, sub: BatchSubmission | bytes, last: bool = False) -> api.Submitted:
        """Add a part to an open batch (see :meth:`SchedulerCore.extend`)."""
        core = self._c()
        self._refresh_nodes()
        sub, blob = self._unpickle(sub, "extend")
        return await core.extend(sub, blob, last=last)

    async def close_batch(self, batch_id: str) -> bool:
        """Close an open batch (see :meth:`SchedulerCore.close_batch`)."""
        return await self._c().close_batch(batch_id)

    def _unpickle(
        self, sub: BatchSubmission | bytes, call: str
    ) -> tuple[BatchSubmission, bytes | None]:
        blob = None
        if isinstance(sub, bytes):
            blob, sub = sub, cloudpickle.loads(sub)
        if not isinstance(sub, BatchSubmission):
            raise UsageError(f"{call} takes a batch submission")
        if not self._limiter_started and is_gated(sub.config):
            # Its process starts while the batch's hosts do; their first requests wait for it.
            get_or_create_admission()
            self._limiter_started = True
        return sub, blob

    async def warm_ready(self) -> int:
        return await self._c().warm_ready()

    async def health(self) -> dict[str, Any]:
        """The scheduler's own state: its process, journal, what it restored and what it could
        not keep (for ``cluster status`` and fault drills)."""
        core = self._c()
        journal = core.durable.journal
        return {
            "pid": os.getpid(),
            "journal_dir": self._journal_dir,
            "journal_bytes": journal.size_bytes() if journal is not None else 0,
            "journal_damage": list(core.journal_damage),
            "journal_failures": list(core.durable.failures),
            "restored": dict(self._restored),
            "warm_hosts_replaced": core.hosts.replaced,
            "hosts_asking": self._placement.ask(),
            "autoscaled": self._placement.autoscaled,
            "hosts_given_up": self._placement.given_up,
            "jobs": len(core.jobs),
        }

    async def rate_limits(self) -> list[dict[str, Any]]:
        """The cluster limiter's view of every provider and model scope (docs/json.md, "Rate
        limits"); empty when no limiter runs or it did not answer within
        :data:`RATE_LIMITS_TIMEOUT_S` (never raises: the view is only shown)."""
        try:
            return await asyncio.wait_for(admission_snapshot(), RATE_LIMITS_TIMEOUT_S)
        except Exception:
            return []

    # -- messaging (the inbox actor calls these) -----------------------------------------
    async def inbox(self, limits: LimitsConfig | None = None) -> Any:
        """The inbox actor, created next to this scheduler on first use (its journal beside
        this one's); ``limits`` (the first caller's) bound its queues."""
        core = self._c()
        bounds = limits or LimitsConfig()
        handle = get_or_create_inbox(
            f"{self._journal_dir}.inbox",
            InboxLimits(
                max_message_chars=bounds.max_message_chars,
                max_queued_per_job=bounds.max_queued_messages_per_job,
                max_queued=bounds.max_queued_messages,
            ),
        )
        core.mail.link = RayInboxLink(handle)
        return handle

    async def check_message(
        self, job_id: str, text: str, refs: list[str], sender: str | None = None
    ) -> None:
        check_message(self._c().table, job_id, text, refs, sender)

    async def route(self, items: list[dict[str, Any]]) -> list[str]:
        core = self._c()
        if core.mail.link is None:
            core.mail.link = RayInboxLink(ray.get_actor(INBOX_NAME, namespace=NAMESPACE))
        return await core.mail.route(items)

    async def undelivered(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self._c().mail.note_undelivered(str(item["job_id"]), str(item["delivery_id"]))

    async def checkpoint_of(self, job_id: str) -> dict[str, Any] | None:
        """A running job's latest checkpoint as shipped here (for tests and drills)."""
        return state_of(self._c().table.checkpoint_of(job_id))

    async def kill_idle_hosts(self) -> int:
        """Fault injection: kill every idle warm host's actor (as a crash would); returns how
        many. The pool notices and replaces them."""
        idle = [h for h in self._c().hosts.idle if isinstance(h, CloneHost)]
        for host in idle:
            host.kill()
        return len(idle)

    async def kill_host_of(self, job_id: str) -> bool:
        """Fault injection for tests and chaos drills: kill the actor hosting ``job_id``."""
        host = self._c().hosts.host_of(job_id)
        if not isinstance(host, CloneHost):
            return False
        host.kill()
        return True

    # -- clonefleet.control.JobControl ----------------------------------------------------
    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> api.Submitted:
        return await self._c().spawn_nested(request, parent_job_id)

    async def job_status(self, job_id: str) -> api.JobStatus:
        return await self._c().job_status(job_id)

    async def job_result(self, job_id: str) -> api.RunRecord:
        return await self._c().job_result(job_id)

    async def job_cancel(self, job_id: str) -> api.JobStatus:
        return await self._c().job_cancel(job_id)

    async def cancel_many(self, ids: Sequence[str]) -> int:
        return await self._c().cancel_many(ids)

    async def job_block(
        self, job_ids: Sequence[str], wait_seconds: Seconds = None, timeout_seconds: Seconds = None
    ) -> api.BlockResult:
        return await self._c().job_block(job_ids, wait_seconds, timeout_seconds)

    async def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        return await self._c().remaining(ids, wait_seconds)

    async def list_jobs(self, **filters: Unpack[api.JobFilter]) -> api.JobListing:
        return await self._c().list_jobs(**filters)

    async def expand(self, ids: Sequence[str]) -> list[str]:
        return await self._c().expand(ids)

    async def events(
        self, target: api.Target = None, **query: Unpack[api.EventQuery]
    ) -> api.EventPage:
        return await self._c().events(target, **query)


_SCHEDULER_ACTOR = ray.remote(SchedulerActor)


def get_or_create_scheduler(
    max_concurrency: int | None = None,
    warm_hosts: int | None = None,
    *,
    journal_dir: str | None = None,
    durability: DurabilityConfig | None = None,
    cluster: ClusterConfig | None = None,
) -> Any:
    """The fleet's scheduler actor handle, created detached on first use.

    It runs on the head node (where its journal is), and Ray restarts it whenever its process
    dies; calls in flight then fail (the client retries what is safe to retry).
    """
    return _SCHEDULER_ACTOR.options(
        num_cpus=0,
        max_concurrency=1000,
        name=SCHEDULER_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_restarts=-1,
        max_task_retries=0,
        scheduling_strategy=_head_node(),
    ).remote(max_concurrency, warm_hosts, journal_dir, durability, cluster)


def _cluster_journal() -> Path:
    """The journal folder of this cluster on the head node: ``journal/`` in the state folder for
    the cluster ``clonefleet cluster up`` recorded (so ``jobs`` reads it when that cluster is
    down, and the next one resumes it), ``journals/<GCS address>/`` for any other cluster, so
    two clusters on one machine never share one."""
    gcs = str(ray.get_runtime_context().gcs_address)
    recorded = read_state()
    if recorded is not None and recorded.get("address") == gcs:
        return state_dir() / "journal"
    return state_dir() / "journals" / gcs.replace(":", "-").replace("/", "-")


def _head_node() -> Any:
    """Hard affinity to the head node (where the journal's folder is), or the default."""
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
    return "DEFAULT"
