"""The Python API: :class:`Fleet`, a facade over the scheduler actor.

A :class:`Fleet` connects to Ray (embedded by default), finds or creates the named scheduler
actor, plans batches on the caller's side (definitions, rendering) and forwards job control.
Ray's own errors never reach the caller: ours come back unwrapped, system errors become
:class:`~clonefleet.errors.ClusterError`. Every call on the scheduler has a deadline (see
:class:`Fleet`); calls that only read are retried while the scheduler restarts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack, cast

from clonefleet import control as api
from clonefleet.cluster import (
    CALL_TIMEOUT_S,
    START_TIMEOUT_S,
    WAIT_MARGIN_S,
    ClusterSession,
    call_with_deadline,
    client_step,
    connect_client,
    connecting_step,
    positive_seconds,
    ray_wait,
    resolve_address,
)
from clonefleet.config import Config, load_config
from clonefleet.control import Seconds
from clonefleet.errors import ClusterError, IdCollision, UsageError
from clonefleet.feed import Feeder, InFlight, ahead_for
from clonefleet.inputs import Row, RowError
from clonefleet.planning import BatchPlan as BatchPlan
from clonefleet.planning import BatchSubmission, RowsPlan, plan_rows
from clonefleet.planning import plan_batch as plan_batch

__all__ = ["Batch", "BatchPlan", "Fleet", "MapBatch", "plan_batch"]

LIST_PAGE = 1000
"""Jobs per reply when :meth:`Fleet.list_jobs` fetches a whole listing."""
LONGEST_BLOCK_S = 3600.0
"""How long the scheduler's ``job_block`` waits when given no time limit."""
MIN_FIRST_CALL_S = 0.5
"""The least the scheduler's first answer gets, however long connecting took."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """A submitted batch: its id and one job id per clone, in clone order."""

    batch_id: str
    job_ids: tuple[str, ...]


class MapBatch:
    """A definition mapped over a dataset (:meth:`Fleet.map`): one growing batch, fed rows as
    its jobs end."""

    def __init__(self, feeder: Feeder) -> None:
        self._feeder = feeder

    @property
    def batch_id(self) -> str | None:
        """The batch's id (``None`` only when no row of the dataset could be submitted)."""
        return self._feeder.batch_id

    @property
    def submitted(self) -> int:
        """Rows submitted as jobs so far."""
        return self._feeder.submitted

    def as_completed(self) -> Iterator[dict[str, Any]]:
        """Yield each row's run record (with ``key``) as its job ends, feeding the next rows
        meanwhile; a row that failed without running comes as a ``failed`` record with the
        reason. Ends once every row has its record (or, after :meth:`cancel`, every row
        submitted). Iterate it once."""
        for ended in self._feeder.run():
            yield ended.record

    def cancel(self) -> None:
        """Stop submitting rows and cancel the batch (safe from another thread)."""
        self._feeder.cancel()


def _map_rows(inputs: Iterable[Any], key: str | None) -> Iterator[Row | RowError]:
    """``inputs`` (mappings or strings) as rows numbered from 1, keyed by ``key``'s field or
    their number; an item that is neither, or lacks a usable key, is a :class:`RowError`."""
    for number, item in enumerate(inputs, 1):
        if isinstance(item, Mapping):
            data: dict[str, Any] | str = dict(item)
        elif isinstance(item, str):
            data = item
        else:
            reason = f"a {type(item).__name__}, not a mapping or a string"
            yield RowError(line=number, key=None if key else str(number), reason=reason)
            continue
        if key is None:
            yield Row(line=number, key=str(number), data=data)
            continue
        if not isinstance(data, dict):
            yield RowError(line=number, key=None, reason=f"a string has no key field {key!r}")
            continue
        if key not in data:
            yield RowError(line=number, key=None, reason=f"no key field {key!r}")
            continue
        value = data[key]
        if isinstance(value, str) and value:
            yield Row(line=number, key=value, data=data)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield Row(line=number, key=json.dumps(value), data=data)
        else:
            what = "empty" if value == "" else f"{json.dumps(value, default=str)}"
            yield RowError(
                line=number,
                key=None,
                reason=f"the key field {key!r} is {what}, not a string or number",
            )


class Fleet:
    """Run and control subagent batches.

    Args:
        address: Ray address (``None`` = embedded local Ray, or ``RAY_ADDRESS``); ``auto`` is
            the cluster ``clonefleet cluster up`` recorded, never another Ray on the machine.
        config: a :class:`Config`, a path to a config file, or ``None`` to discover one.
        cwd: the caller's directory (definitions in ``.clonefleet/subagents/`` are found here).
        num_cpus: CPUs of an embedded Ray instance.
        max_concurrency: jobs running at once in the whole fleet (default: the config's).
        call_timeout_s: deadline of each control call on the scheduler (30 s), and of
            connecting to an existing one (Ray's connection included); a new scheduler gets up
            to 120 s to answer first.
        wait_margin_s: what a waiting call (``job_block``, ``remaining``, ``events`` with
            ``wait_s``) gets on top of its own wait before it fails (2 s).
        ship_package: send this clonefleet package to a cluster's workers (``py_modules``);
            ``False`` for a client that only controls jobs (it is sent anyway when this
            Fleet creates the scheduler).

    Every call fails within its deadline; reads are retried while the scheduler restarts,
    ``submit`` and ``spawn_nested`` never are (docs/cluster.md, "A persistent local cluster",
    **Deadlines**).

    Raises:
        ClusterError: Ray cannot be started or reached (``auto`` with no cluster up), or the
            scheduler did not answer; :class:`SchedulerUnavailable` while it restarts.
        ConfigError: the config file is invalid.
    """

    _wait: Callable[[Any, float], Any]
    """Waits for one call's answer: ``(ref, seconds) -> answer`` (:func:`ray_wait`)."""
    _clock: Callable[[], float]
    _sleep: Callable[[float], None]
    _session: ClusterSession | None
    _sched: Any
    _inbox_handle: Any

    def __init__(
        self,
        address: str | None = None,
        *,
        config: Config | str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        num_cpus: int | None = None,
        max_concurrency: int | None = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
        wait_margin_s: float = WAIT_MARGIN_S,
        ship_package: bool = True,
    ) -> None:
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            # Checked before Ray starts: 0 or less would leave every job queued forever.
            raise UsageError(
                f"max_concurrency must be a whole number of 1 or more, got {max_concurrency!r}"
            )
        self._settle(config, cwd, call_timeout_s, wait_margin_s)
        begun = time.monotonic()  # connecting counts against the first call's deadline
        self.address = resolve_address(address)
        # `ClusterSession` is looked up here so a test can replace it and keep Ray from starting.
        session, existed = connect_client(
            self.address, num_cpus, ship_package=ship_package, session=ClusterSession
        )
        from clonefleet.cluster import state_dir
        from clonefleet.scheduler import journal_folder
        from clonefleet.scheduler.remote import get_or_create_scheduler

        cap = max_concurrency or self.config.limits.max_concurrency
        durability = self.config.durability
        # An embedded run keeps a journal of its own; a cluster's scheduler picks its folder on
        # the head node (unless the config names one).
        folder = (
            journal_folder(durability.journal_dir, embedded=True, base=state_dir())
            if session.embedded and durability.enabled
            else durability.journal_dir
        )
        self.journal_dir: str | None = str(folder) if session.embedded and folder else None
        try:
            handle = connecting_step(
                lambda: get_or_create_scheduler(
                    cap, journal_dir=folder, durability=durability, cluster=self.config.cluster
                )
            )
        except BaseException:
            session.stop()
            raise
        self._attach(handle, session, wait=ray_wait, clock=time.monotonic, sleep=time.sleep)
        start_s = self.call_timeout_s if existed else max(self.call_timeout_s, START_TIMEOUT_S)
        start_s = max(start_s - (self._clock() - begun), MIN_FIRST_CALL_S)
        try:
            self._ask(lambda s: s.ping.remote(), timeout_s=start_s, idempotent=True)
        except BaseException:
            session.stop()  # a Fleet that did not start leaves no connection behind
            raise

    @classmethod
    def over(
        cls,
        handle: Any,
        *,
        config: Config | str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        wait: Callable[[Any, float], Any] = ray_wait,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        call_timeout_s: float = CALL_TIMEOUT_S,
        wait_margin_s: float = WAIT_MARGIN_S,
    ) -> Fleet:
        """A Fleet over a scheduler actor ``handle`` already at hand: no connecting, no ping.

        ``config``, ``cwd``, ``call_timeout_s`` and ``wait_margin_s`` are as for :class:`Fleet`.
        ``wait(ref, seconds)`` waits for one call's answer (:func:`ray_wait`; it raises
        :class:`~clonefleet.cluster.NoAnswer` when the time is up); ``clock`` and ``sleep`` time
        the deadlines and the pauses between retries. The Fleet owns no connection:
        :meth:`close` leaves Ray as it is.
        """
        fleet = cls.__new__(cls)
        fleet._settle(config, cwd, call_timeout_s, wait_margin_s)
        fleet.address = None
        fleet._attach(handle, None, wait=wait, clock=clock, sleep=sleep)
        return fleet

    def _settle(
        self,
        config: Config | str | os.PathLike[str] | None,
        cwd: str | os.PathLike[str] | None,
        call_timeout_s: float,
        wait_margin_s: float,
    ) -> None:
        """Check the deadlines and find the caller's directory and config (before any Ray)."""
        self.call_timeout_s = positive_seconds(call_timeout_s, "call_timeout_s")
        self.wait_margin_s = positive_seconds(wait_margin_s, "wait_margin_s", zero=True)
        self.cwd = Path(cwd or Path.cwd()).resolve()
        self.config = config if isinstance(config, Config) else load_config(config, self.cwd)
        self.journal_dir = None  # an embedded run's journal folder, set on connecting

    def _attach(
        self,
        handle: Any,
        session: ClusterSession | None,
        *,
        wait: Callable[[Any, float], Any],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        """Send every call to the scheduler ``handle`` from now on, timed by ``clock``."""
        self._sched, self._session = handle, session
        self._wait, self._clock, self._sleep = wait, clock, sleep
        self._inbox_handle = None

    def wait_ready(self, timeout_s: float = 120.0) -> int:
        """Wait until the scheduler's warm clone hosts are up; returns how many are.

        Not needed before ``spawn`` (a batch simply starts when its hosts are up); useful to
        keep start-up out of a measurement.
        """
        return cast(int, self._ask(lambda s: s.warm_ready.remote(), timeout_s=timeout_s))

    @property
    def embedded(self) -> bool:
        """Whether this Fleet started its own Ray instance (which :meth:`close` stops)."""
        return self._session is not None and self._session.embedded

    def _ask(
        self,
        call: Callable[[Any], Any],
        *,
        timeout_s: float | None = None,
        wait_s: float | None = None,
        idempotent: bool = False,
    ) -> Any:
        """Make one call on the scheduler actor (``lambda s: s.method.remote(...)``) and wait
        for it until its deadline: ``timeout_s``, else ``wait_s`` plus :attr:`wait_margin_s`
        for a call that waits on the scheduler's side, else :attr:`call_timeout_s`. Our errors
        come back unwrapped, Ray's become :class:`ClusterError`; an ``idempotent`` call is made
        again while the scheduler is unavailable (restarting), until the deadline."""
        if timeout_s is None:
            timeout_s = self.call_timeout_s if wait_s is None else wait_s + self.wait_margin_s
        return call_with_deadline(
            lambda seconds_left: self._wait(
                client_step(lambda: call(self._sched), seconds_left()), seconds_left()
            ),
            timeout_s,
            idempotent=idempotent,
            clock=self._clock,
            sleep=self._sleep,
        )

    # -- batches -------------------------------------------------------------------------
    def spawn(self, agent: str, prompt: str, count: int = 1, **options: Any) -> Batch:
        """Validate, render and start a counted batch of ``count`` clones of ``agent``.

        Nothing starts unless every clone rendered. ``options`` are those of :func:`plan_batch`
        (``model``, ``cwd``, ``approve_chdir``, ``variables``, ``subagents_dirs``,
        ``sim_script``, ``clones_per_actor``, ``max_concurrency``, ``budget_tokens``,
        ``budget_usd``).

        Raises:
            UsageError: bad count, cwd, model or budget.
            DefinitionError: unknown or invalid agent, render failure.
        """
        return self.submit(
            plan_batch(agent, prompt, count, config=self.config, caller_cwd=self.cwd, **options)
        )

    def map(
        self,
        agent: str,
        prompt: str,
        inputs: Iterable[Any],
        key: str | None = None,
        *,
        ahead: int | None = None,
        unique_keys: bool = False,
        **options: Any,
    ) -> MapBatch:
        """Run ``agent`` once per item of ``inputs``, each clone seeing its item as ``input``.

        ``inputs`` is any iterable of mappings or strings, a generator too: it is read as room
        frees up, a slice at a time, never whole. Each row's key is its ``key`` field's value
        (a number as its JSON text), or its 1-based number without ``key``. A row that is
        neither a mapping nor a string, lacks its key, repeats a key seen before or fails to
        render fails alone. ``options`` are those of :func:`plan_batch` but ``rows`` and
        ``batch_id``. ``ahead`` is the number of rows kept submitted and not yet ended; by
        default as few as keep the rate of ends at its highest, found as rows end, and never
        more than twice the cap or at least 1,000 (:class:`~clonefleet.feed.InFlight`). The
        first slice is submitted before this returns.

        Repeated keys are found with a 64-bit hash of each key seen (16-32 bytes a key, the
        keys themselves not kept: :class:`~clonefleet.feed.SeenKeys`; two keys sharing a hash
        is negligible). ``unique_keys=True`` says the keys are known to differ: nothing is
        kept, and a key repeated in a later slice is not looked for (both rows run; a repeat
        within one slice still fails its planning, an error of the whole map).

        Raises:
            UsageError, DefinitionError: as :meth:`spawn` (bad options, unknown agent, a
                template none of the first rows renders): nothing started.
        """
        for name in ("rows", "batch_id", "count"):
            if name in options:
                raise UsageError(f"Fleet.map takes no {name!r}: the rows come from inputs")
        if ahead is not None and (
            isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 1
        ):
            raise UsageError(f"ahead must be a whole number of 1 or more, got {ahead!r}")
        inflight = None
        if ahead is None:
            cap = options.get("max_concurrency") or self.list_jobs(limit=1)["capacity"].get(
                "max_concurrency"
            )
            ahead = ahead_for(cap)
            inflight = InFlight(ahead)

        def plan(rows: Sequence[tuple[str, Any]], batch_id: str | None, first: int) -> RowsPlan:
            return plan_rows(
                agent,
                prompt,
                rows,
                config=self.config,
                caller_cwd=self.cwd,
                batch_id=batch_id,
                first_index=first,
                total=first + len(rows),
                **options,
            )

        feeder = Feeder(
            _map_rows(inputs, key),
            plan,
            self,
            agent=agent,
            ahead=ahead,
            check_keys=not unique_keys,
            source="inputs",
            inflight=inflight,
        )
        feeder.start()
        return MapBatch(feeder)

    def submit(self, plan: BatchPlan, open: bool = False) -> Batch:
        """Start a batch planned with :func:`plan_batch` (drawing new ids if one is taken).

        An ``open`` batch grows: :meth:`extend` adds parts to it, and it is not done (``wait``,
        ``remaining``, ``job_block`` on its id) until :meth:`close_batch` or its last part.
        """
        return self._send(plan, lambda s, blob: s.submit.remote(blob, open))

    def extend(self, plan: BatchPlan, last: bool = False) -> Batch:
        """Add a part to an open batch: ``plan`` made by :func:`plan_batch` with the batch's
        ``batch_id``. Its jobs run under the batch's clones per host, cap and budget;
        ``last`` closes the batch with this part. Returns the part's job ids.

        Raises:
            UsageError: no such batch, or it was cancelled or is closed.
        """
        return self._send(plan, lambda s, blob: s.extend.remote(blob, last))

    def close_batch(self, batch_id: str) -> bool:
        """Say an open batch takes no more parts (idempotent); returns whether it was open.

        Raises:
            UsageError: no such batch.
        """
        return cast(bool, self._ask(lambda s: s.close_batch.remote(batch_id), idempotent=True))

    def _send(self, plan: BatchPlan, call: Callable[[Any, bytes], Any]) -> Batch:
        for _ in range(5):
            try:
                out = self._submit(plan.submission, call)
            except IdCollision:
                plan = plan.redraw()
                continue
            return Batch(batch_id=out["batch_id"], job_ids=tuple(out["job_ids"]))
        raise ClusterError("could not draw unused job ids in 5 tries")

    def _submit(self, sub: BatchSubmission, call: Callable[[Any, bytes], Any]) -> api.Submitted:
        # Pickled here, once: the scheduler keeps these bytes in its journal as they are
        # (a batch of 10,000 clones is pickled by the client rather than by the scheduler).
        from ray import cloudpickle

        blob = cloudpickle.dumps(sub)
        return cast(api.Submitted, self._ask(lambda s: call(s, blob)))

    # -- messages to running clones -------------------------------------------------------
    def _ask_inbox(self, call: Callable[[Any], Any], *, idempotent: bool) -> Any:
        """Like :meth:`_ask`, on the inbox actor (created by the scheduler on first use)."""
        if self._inbox_handle is None:
            limits = self.config.limits
            self._inbox_handle = self._ask(lambda s: s.inbox.remote(limits))
        inbox = self._inbox_handle
        return call_with_deadline(
            lambda seconds_left: self._wait(
                client_step(lambda: call(inbox), seconds_left()), seconds_left()
            ),
            self.call_timeout_s,
            idempotent=idempotent,
            clock=self._clock,
            sleep=self._sleep,
        )

    def message(self, job_id: str, text: str) -> dict[str, Any]:
        """Send ``text`` to a job's clone: it enters the clone's context as a user message at
        its next turn boundary. Returns ``{delivery_id, status: "queued"}`` once the delivery
        is on disk; :meth:`delivery` tells what became of it.

        Raises:
            UnknownJobError: no such job.
            UsageError: the job has ended, an ``@skill:`` reference is refused, the message is
                too long or a queue is full (``limits.max_message_chars``,
                ``limits.max_queued_messages_per_job``, ``limits.max_queued_messages``).
        """
        out = self._ask_inbox(lambda i: i.send.remote(job_id, text), idempotent=False)
        return cast(dict[str, Any], out)

    def delivery(self, delivery_id: str) -> dict[str, Any]:
        """A delivery's state: ``queued``, ``delivered`` (in its clone's context) or
        ``undelivered`` (its job ended first)."""
        out = self._ask_inbox(lambda i: i.delivery.remote(delivery_id), idempotent=True)
        return cast(dict[str, Any], out)

    # -- job control: clonefleet.control.JobControl, synchronously -----------------------
    def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> api.Submitted:
        """Start a batch on behalf of a running job, as its ``subagent`` tool would.

        Raises:
            UsageError: parent not running, depth past ``limits.max_depth``, bad count or cwd.
            DefinitionError: unknown agent or render failure (nothing started).
        """
        out = self._ask(lambda s: s.spawn_nested.remote(request, parent_job_id))
        return cast(api.Submitted, out)

    def job_status(self, job_id: str) -> api.JobStatus:
        """A job's current status; ``UnknownJobError`` for an unknown id."""
        out = self._ask(lambda s: s.job_status.remote(job_id), idempotent=True)
        return cast(api.JobStatus, out)

    def job_result(self, job_id: str) -> api.RunRecord:
        """The finished job's record; ``UsageError`` while it runs."""
        out = self._ask(lambda s: s.job_result.remote(job_id), idempotent=True)
        return cast(api.RunRecord, out)

    def job_cancel(self, job_id: str) -> api.JobStatus:
        """Cancel a job and its descendants (idempotent)."""
        return cast(api.JobStatus, self._ask(lambda s: s.job_cancel.remote(job_id)))

    def cancel_many(self, ids: Sequence[str]) -> int:
        """Cancel jobs or whole batches (and descendants) in one call; returns how many were
        still running (queued ones end at once)."""
        return cast(int, self._ask(lambda s: s.cancel_many.remote(list(ids))))

    def job_block(
        self, job_ids: Sequence[str], wait_seconds: Seconds = None, timeout_seconds: Seconds = None
    ) -> api.BlockResult:
        """Wait for every job (or batch id) to finish, or the time to run out (the shorter of
        the two limits; an hour without either). Fails :attr:`wait_margin_s` after that."""
        ids = list(job_ids)
        limits = [x for x in (wait_seconds, timeout_seconds) if x is not None]
        wait_s = max(min(limits, default=LONGEST_BLOCK_S), 0.0)
        left = self._countdown(wait_s)
        out = self._ask(
            lambda s: s.job_block.remote(ids, None, left()), wait_s=wait_s, idempotent=True
        )
        return cast(api.BlockResult, out)

    def _countdown(self, wait_s: float) -> Callable[[], float]:
        """What is left of a wait of ``wait_s`` starting now: a try made again after the
        scheduler restarted waits only for the rest."""
        end = self._clock() + wait_s
        return lambda: max(end - self._clock(), 0.0)

    def remaining(self, ids: Sequence[str], wait_seconds: float = 0.0) -> int:
        """How many of the jobs (or batches' jobs) have not ended yet (after waiting up to
        ``wait_seconds`` for them to; fails :attr:`wait_margin_s` after that)."""
        left = self._countdown(wait_seconds)
        out = self._ask(
            lambda s: s.remaining.remote(list(ids), left()),
            wait_s=wait_seconds if wait_seconds > 0 else None,
            idempotent=True,
        )
        return cast(int, out)

    def list_jobs(self, **filters: Unpack[api.JobFilter]) -> api.JobListing:
        """Jobs matching every filter given, with the fleet's capacity and usage totals.

        With ``limit`` (and ``cursor``, the ``next_cursor`` of the page before), one page of at
        most ``limit`` jobs. Without either, every match, fetched a page of
        :data:`LIST_PAGE` at a time (no one reply holds them all) and returned together.
        """
        if filters.get("limit") is not None or filters.get("cursor") is not None:
            out = self._ask(lambda s: s.list_jobs.remote(**filters), idempotent=True)
            return cast(api.JobListing, out)
        pages = self.iter_pages(**filters)
        listing = next(pages)
        for page in pages:
            listing["jobs"].extend(page["jobs"])
            listing["totals"]["batches"].update(page["totals"]["batches"])
            listing["totals"]["fleet"] = page["totals"]["fleet"]
            listing["capacity"], listing["next_cursor"] = page["capacity"], None
        return listing

    def iter_pages(self, **filters: Unpack[api.JobFilter]) -> Iterator[api.JobListing]:
        """Yield the listing page by page (``limit`` jobs a page, :data:`LIST_PAGE` by default)
        from ``cursor`` on, until a page has no ``next_cursor``."""
        query = {**filters, "limit": filters.get("limit") or LIST_PAGE}
        while True:
            page = cast(
                api.JobListing,
                self._ask(lambda s: s.list_jobs.remote(**query), idempotent=True),
            )
            yield page
            if page.get("next_cursor") is None:  # (a scheduler from before paging has none)
                return
            query["cursor"] = page["next_cursor"]

    def totals(self, batch: str | None = None) -> api.UsageTotals:
        """Token usage and cost of the fleet, and of ``batch`` when given (with its budget);
        see ``docs/json.md``."""
        totals = self.list_jobs(batch=batch, limit=1)["totals"]
        if batch is None:
            totals["batches"] = {}
        return totals

    def rate_limits(self) -> list[dict[str, Any]]:
        """Each provider's and model's rate limit as the cluster's limiter sees it: requests
        and tokens per minute now, the limit in force and where it came from, requests waiting
        and refusals (one row per scope, ``docs/json.md``, "Rate limits"); empty when no
        limiter runs yet."""
        try:
            out = self._ask(lambda s: s.rate_limits.remote(), idempotent=True)
        except AttributeError:  # a scheduler from before rate limits has no such method
            return []
        return cast(list[dict[str, Any]], out)

    def expand(self, ids: Sequence[str]) -> list[str]:
        """Job ids, with batch ids replaced by their jobs'."""
        out = self._ask(lambda s: s.expand.remote(list(ids)), idempotent=True)
        return cast(list[str], out)

    def events(self, target: api.Target = None, **query: Unpack[api.EventQuery]) -> api.EventPage:
        """Events after ``cursor``: ``{events: [...], cursor: next}`` (with ``wait_s``, fails
        :attr:`wait_margin_s` after that wait)."""
        wait_s = query.get("wait_s", 0.0)
        left = self._countdown(wait_s)
        out = self._ask(
            lambda s: s.events.remote(target, **{**query, "wait_s": left()}),
            wait_s=wait_s if wait_s > 0 else None,
            idempotent=True,
        )
        return cast(api.EventPage, out)

    def follow(
        self, target: str, *, level: str = "lifecycle", wait_s: float = 0.5, cursor: int = 0
    ) -> Iterator[dict[str, Any]]:
        """Yield events of ``target`` after ``cursor`` as they come, until all its jobs have
        ended."""
        while True:
            page = self.events(target, cursor=cursor, level=level, wait_s=wait_s)
            cursor = page["cursor"]
            yield from page["events"]
            if not page["events"] and self.remaining([target]) == 0:
                tail = self.events(target, cursor=cursor, level=level)
                yield from tail["events"]
                return

    def history(
        self,
        target: api.Target = None,
        *,
        level: str = "lifecycle",
        cursor: int = 0,
        page: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield every event of ``target`` recorded so far after ``cursor``, page by page of at
        most ``page`` events (5,000 by default; events the scheduler spilled to its journal
        included)."""
        while True:
            query: api.EventQuery = {"cursor": cursor, "level": level}
            if page is not None:
                query["limit"] = page
            page_out = self.events(target, **query)
            yield from page_out["events"]
            if not page_out["events"] or page_out["cursor"] <= cursor:
                return
            cursor = page_out["cursor"]

    def close(self) -> None:
        """Disconnect; an embedded Ray instance (and its actors) stops here."""
        if self._session is not None:
            self._session.stop()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
