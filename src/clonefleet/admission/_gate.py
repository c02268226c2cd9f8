"""A host's side of admission: the gates its clones pass before each model request
(docs/rate-limits.md).

:class:`HostGates` keeps one :class:`HostScope` per scope. A request waits in its scope's
queue until a sync with the limiter admits it; one task per host makes those syncs, for every
scope at once, so that no request pays a remote call of its own. An open scope (nothing limits
it) lets requests through at once and only reports what happened, about once a second. When
the limiter cannot be reached, a limiter of the host's own takes over (configured limits then
hold per host rather than fleet-wide).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from clonefleet.admission._core import AdmissionCore
from clonefleet.admission._scope import Announced, Demand, Grant, Limits

__all__ = ["HostGates", "HostScope", "SyncSource", "Ticket"]

SyncSource = Callable[[str, list[Demand]], Awaitable[list[Grant]]]
"""The limiter as a host reaches it: ``(host_id, demands) -> grants``."""

REPORT_EVERY_S = 1.0
"""How often a host reports what its open scopes saw."""
FLEET_RETRY_S = 1.0
"""After a sync the fleet's limiter did not answer, it is asked again no sooner than this."""
RELEASE_AFTER_S = 0.02
"""Slots a host no longer needs go back this soon (released together)."""
MAX_WANT = 512
"""Waiting requests one sync asks for per scope at most."""


class HostScope:
    """One scope as a host sees it: the requests waiting, and what to report at the next sync."""

    def __init__(
        self, name: str, provider: str, model: str | None, limits: Limits, learn: bool, probe: int
    ) -> None:
        self.name, self.provider, self.model = name, provider, model
        self.limits, self.learn, self.probe = limits, learn, probe
        self.open = False
        """Nothing limits the scope (the limiter said so at the last sync)."""
        self.queue: deque[tuple[int, asyncio.Future[int], HostScope]] = deque()
        """Each waiting request: its raw token estimate, what its admission answers (the
        estimate charged), and the scope whose :attr:`ratio` scales the estimate."""
        self.in_flight = 0
        self.retry_at = 0.0
        self.origin = "1"
        """Tells this host's scopes of one name apart at the limiter."""
        self.told = False
        """A limit this scope's answers announced has reached the limiter."""
        self.answers = 0
        """Answers that taught :attr:`ratio`."""
        self.ratio = 1.0
        """Tokens answers used per token estimated (a moving average; a model's scope)."""
        self.release_at = 0.0
        """When the oldest slot not yet given back was freed."""
        self._reset()

    def _reset(self) -> None:
        self.urgent = False
        """Sync now, whatever the scope waits for: a refusal, or a first limit heard."""
        self.release = self.answered = self.headerless = self.refused = self.owed = 0
        self.tokens = self.overrun = self.sent = 0
        self.retry_after_s: float | None = None
        self.announced: Announced | None = None

    @property
    def has_news(self) -> bool:
        return bool(self.release or self.answered or self.refused or self.sent or self.announced)

    def demand(self) -> Demand:
        """What to tell the limiter now; the counters start again from zero."""
        demand = Demand(
            scope=self.name,
            origin=self.origin,
            provider=self.provider,
            model=self.model,
            configured=self.limits,
            learn=self.learn,
            probe=self.probe,
            want=tuple(
                _scaled(raw, teacher) for raw, _, teacher in itertools.islice(self.queue, MAX_WANT)
            ),
            release=self.release + self.owed,
            tokens=self.tokens,
            overrun=self.overrun,
            sent=self.sent,
            answered=self.answered,
            headerless=self.headerless,
            refused=self.refused,
            retry_after_s=self.retry_after_s,
            announced=self.announced,
            waiting=len(self.queue),
            in_flight=self.in_flight,
        )
        self._reset()
        return demand

    def grant(self, grant: Grant, now: float) -> None:
        """Let the admitted requests go, oldest first."""
        self.open = grant.open
        admitted = len(self.queue) if grant.open else grant.admitted
        while admitted and self.queue:
            raw, waiter, teacher = self.queue.popleft()
            admitted -= 1
            if waiter.done():  # its clone stopped waiting: give the capacity back
                self.release += 0 if grant.open else 1
                continue
            waiter.set_result(_scaled(raw, teacher))
        self.retry_at = now + grant.retry_in_s


def _scaled(raw: int, teacher: HostScope) -> int:
    """A raw token estimate scaled by what answers taught (the same as the limiter was told)."""
    return max(1, round(raw * teacher.ratio))


def _least_left(old: Announced | None, new: Announced) -> Announced:
    """The newest limits, with the least left that any answer since the last sync reported."""
    if old is None:
        return new

    def least(a: int | None, b: int | None) -> int | None:
        return b if a is None else a if b is None else min(a, b)

    return dataclasses.replace(
        new,
        requests_left=least(old.requests_left, new.requests_left),
        tokens_left=least(old.tokens_left, new.tokens_left),
    )


@dataclass(slots=True)
class Ticket:
    """One admitted request: the scopes it passed and whether each holds a slot."""

    scopes: tuple[HostScope, ...]
    held: tuple[bool, ...]
    estimate: int


class HostGates:
    """The gates of one host's clones and the task that syncs them with the limiter."""

    def __init__(
        self,
        host_id: str,
        source: SyncSource | None,
        *,
        safety: float = 0.95,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host_id = host_id
        self._source = source
        self._own = AdmissionCore(safety=safety)
        """The fallback limiter (also the only one when there is no ``source``)."""
        self._clock = clock
        self._scopes: dict[tuple[str, Limits, bool, int], HostScope] = {}
        """Each scope by name and the settings of the config that made it (batches of two
        configs on one host each have their own)."""
        self._kick: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._synced_at = 0.0
        self._retry_fleet_at = 0.0
        """Until then, after a failed sync, the host's own limiter answers without asking."""
        self.degraded = False
        """The limiter could not be reached at the last sync: the host's own one answered."""

    def scope(
        self, name: str, provider: str, model: str | None, limits: Limits, learn: bool, probe: int
    ) -> HostScope:
        """The host's scope of that name, made on first use."""
        key = (name, limits, learn, probe)
        scope = self._scopes.get(key)
        if scope is None:
            scope = self._scopes[key] = HostScope(name, provider, model, limits, learn, probe)
            scope.origin = str(sum(1 for k in self._scopes if k[0] == name))
        return scope

    async def admit(self, scopes: Sequence[HostScope], estimate: int) -> Ticket:
        """Wait until every scope admits one request of ``estimate`` tokens (a raw estimate:
        the last scope's :attr:`HostScope.ratio`, learned from answers, scales it)."""
        held: list[bool] = []
        teacher = scopes[-1]
        charged = _scaled(estimate, teacher)
        try:
            for scope in scopes:
                if scope.open:
                    scope.sent += 1
                    held.append(False)
                else:
                    charged = await self._wait(scope, estimate, teacher)
                    held.append(True)
                scope.in_flight += 1
        except BaseException:
            self._done(Ticket(tuple(scopes[: len(held)]), tuple(held), charged))
            raise
        return Ticket(tuple(scopes), tuple(held), charged)

    async def _wait(self, scope: HostScope, estimate: int, teacher: HostScope) -> int:
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (estimate, waiter, teacher)
        scope.queue.append(entry)
        self._wake()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                scope.release += 1  # admitted just as its clone stopped
            else:
                with contextlib.suppress(ValueError):
                    scope.queue.remove(entry)
            raise

    def answered(self, ticket: Ticket, tokens: int, announced: Announced | None) -> None:
        """The request was answered, using ``tokens``; ``announced``: its limit headers."""
        for scope in ticket.scopes:
            scope.answered += 1
            scope.tokens += tokens
            scope.overrun += tokens - ticket.estimate
            if announced is None:
                scope.headerless += 1
        if announced is not None and ticket.scopes:
            model = ticket.scopes[-1]  # limits are the model's
            if not model.told or model.open:
                model.told = model.urgent = True  # the limiter hears of a limit at once
                self._wake()
            model.announced = _least_left(model.announced, announced)
        self._done(ticket)

    def refused(
        self, ticket: Ticket, retry_after_s: float | None, announced: Announced | None
    ) -> None:
        """The provider refused the request for its rate; the limiter hears at once."""
        for scope in ticket.scopes:
            scope.refused += 1
            scope.urgent = True
            if retry_after_s is not None:
                scope.retry_after_s = max(scope.retry_after_s or 0.0, retry_after_s)
            scope.open = False  # wait for the limiter's word before sending more
        if announced is not None and ticket.scopes:
            ticket.scopes[-1].announced = announced
        self._done(ticket)
        self._wake()

    def abandoned(self, ticket: Ticket) -> None:
        """The request failed for another reason, or its clone stopped."""
        self._done(ticket)

    def _done(self, ticket: Ticket) -> None:
        for scope, held in zip(ticket.scopes, ticket.held, strict=False):
            scope.in_flight -= 1
            if held:
                if not scope.release:
                    scope.release_at = self._clock()
                scope.release += 1
                if not scope.queue:
                    self._wake()

    # -- the sync task ---------------------------------------------------------------------

    def _wake(self) -> None:
        if self._kick is None:
            self._kick = asyncio.Event()
        self._kick.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        kick = self._kick
        assert kick is not None
        while True:
            timeout = self._next_wait()
            if timeout is None:
                return  # nothing waits and nothing to report: the next request restarts it
            if timeout > 0:
                kick.clear()
                try:
                    # Not wait_for: on Python 3.11 it swallows a cancel that comes as the kick
                    # does, and aclose() would then wait for ever.
                    async with asyncio.timeout(timeout):
                        await kick.wait()
                    continue  # something changed: look again
                except TimeoutError:
                    pass
            await self.sync_now()

    def _next_wait(self) -> float | None:
        now = self._clock()
        waits = []
        for scope in self._scopes.values():
            if scope.urgent:
                waits.append(0.0)
            elif scope.queue:
                waits.append(max(scope.retry_at - now, 0.0))
            elif scope.release:
                waits.append(max(scope.release_at + RELEASE_AFTER_S - now, 0.0))
            elif scope.has_news or scope.in_flight:
                waits.append(max(self._synced_at + REPORT_EVERY_S - now, 0.0))
        return min(waits) if waits else None

    async def sync_now(self) -> None:
        """One sync of every scope with something to say or to ask."""
        scopes = list(self._scopes.values())  # a clone may add one while the limiter answers
        demands = [scope.demand() for scope in scopes]
        if not demands:
            return
        self._synced_at = self._clock()
        grants: list[Grant] | None = None
        if self._source is not None and self._synced_at >= self._retry_fleet_at:
            try:
                grants = await self._source(self.host_id, demands)
                self.degraded = False
            except Exception:  # the limiter is unreachable: the host's own answers
                self.degraded = True
                self._retry_fleet_at = self._clock() + FLEET_RETRY_S
        if grants is None:
            grants = self._own.sync(self.host_id, demands, self._clock())
            if self._source is not None:
                # The fleet's limiter still counts these slots as held: it hears of their
                # release at the next sync it answers.
                for scope, demand in zip(scopes, demands, strict=True):
                    scope.owed += demand.release
        now = self._clock()
        for scope, grant in zip(scopes, grants, strict=True):
            scope.grant(grant, now)

    def snapshot(self) -> list[dict[str, object]]:
        """The host's own limiter's view (used when the fleet's cannot be reached)."""
        return self._own.snapshot(self._clock())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
