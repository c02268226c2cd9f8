"""The fleet-wide limiter: every host's demands in, grants out (docs/rate-limits.md).

:class:`AdmissionCore` holds one :class:`ScopeState` per scope (a provider, or one of its
models) and answers a host's :meth:`~AdmissionCore.sync`: what it saw since its last one
(answers, refusals, limit headers, tokens used, slots given back) and the token estimates of
the requests it has waiting. It admits as many of those, oldest first, as every limit in force
allows now. Pure: the caller passes ``now`` (monotonic seconds); the Ray actor in
``remote.py`` and a host's fallback both run one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from clonefleet.admission._scope import (
    FORGET_S,
    LEASE_S,
    MAX_PAUSE_S,
    OPEN_WINDOW,
    REFUSAL_CUT,
    Demand,
    Grant,
    LearnedRate,
    Limits,
    ScopeState,
)

__all__ = ["AdmissionCore"]

_SLOT_RETRY_S = 0.05
"""When to ask again while every slot is held (a release wakes the host sooner)."""
_MIN_RETRY_S = 0.005
RECOVER_AFTER_S = 5.0
"""Seconds without a refusal after which a cut share of an announced limit starts to recover."""
RECOVERY = 0.001
"""The cut share grows by this much of itself with each answer after that."""
_HOLD_S = 1.0
"""Refusals this soon after a cut answer the old rate and cut nothing more."""


class AdmissionCore:
    """The limiter of every scope; ``safety`` is the share of announced limits followed."""

    def __init__(self, *, safety: float = 0.95) -> None:
        self._safety = safety
        self._scopes: dict[str, ScopeState] = {}

    def sync(self, who: str, demands: Sequence[Demand], now: float) -> list[Grant]:
        """Take in host ``who``'s reports and admit what it waits for, scope by scope."""
        grants = []
        for demand in demands:
            host = f"{who}|{demand.origin}"
            scope = self._scope(host, demand, now)
            scope.seen[host] = scope.last_seen = now
            scope.waiting[host], scope.in_flight[host] = demand.waiting, demand.in_flight
            if demand.release:
                scope.held[host] = max(0, scope.held.get(host, 0) - demand.release)
            self._learn(scope, demand, now)
            grants.append(self._admit(host, scope, demand.want, now))
        self._expire(now)
        return grants

    def _scope(self, host: str, demand: Demand, now: float) -> ScopeState:
        scope = self._scopes.get(demand.scope)
        if scope is None:
            scope = ScopeState(demand.scope, demand.provider, demand.model, learn=demand.learn)
            scope.safety = self._safety
            if demand.learn and demand.model is not None and demand.configured.rpm is None:
                scope.window = 1  # nothing known yet: one request asks (see _learn)
            self._scopes[demand.scope] = scope
        if scope.configured_by.get(host) != demand.configured:
            scope.configured_by[host] = demand.configured
            self._configure(scope, now)
        elif scope.requests is None and scope.tokens is None:
            scope.reshape(now)
        return scope

    @staticmethod
    def _configure(scope: ScopeState, now: float) -> None:
        """The configured limits in force: the tightest of every host's batch config (two
        batches sharing a scope exceed neither's)."""
        limits = Limits()
        for each in scope.configured_by.values():
            limits = limits.tighter(each)
        scope.configured = limits
        scope.reshape(now)

    def _learn(self, scope: ScopeState, demand: Demand, now: float) -> None:
        if demand.answered:
            scope.answers.add(now, demand.answered)
            if scope.cut < 1.0 and now > scope.cut_at + RECOVER_AFTER_S:
                # A followed share cut by refusals comes back while none come.
                scope.cut = min(1.0, scope.cut * (1.0 + RECOVERY) ** min(demand.answered, 1000))
                scope.reshape(now)
            if scope.adaptive is not None:
                scope.adaptive.answered(demand.answered)
                scope.reshape(now)
        if demand.sent:
            scope.sent.add(now, demand.sent)
        if demand.tokens:
            scope.used.add(now, demand.tokens)
        if demand.overrun and scope.tokens is not None:
            scope.tokens.refill(now)
            # Tokens given back fill the bucket no further than full (no larger burst).
            level = scope.tokens.level - demand.overrun
            scope.tokens.level = min(level, scope.tokens.capacity)
        if demand.announced is not None and scope.learn:
            self._announced(scope, demand, now)
        if demand.refused:
            self._refused(scope, demand, now)
        if scope.window is not None and scope.learn and demand.answered:
            # A first answer without limit headers opens the window to the configured probe;
            # then it grows by one per answer (doubling each round trip).
            if demand.headerless and scope.announced is None:
                scope.window = max(scope.window, demand.probe)
            scope.window += demand.answered
            if scope.window >= OPEN_WINDOW and scope.announced is None and scope.adaptive is None:
                scope.window = None

    def _announced(self, scope: ScopeState, demand: Demand, now: float) -> None:
        told = demand.announced
        assert told is not None
        first = scope.announced is None
        if first:
            scope.cut_at = now  # refusals of the probe's requests answer it, not this limit
        scope.announced = told
        scope.window = None  # the provider says its limit: no probing
        scope.adaptive = None
        scope.reshape(now)
        if first:
            # The probe used some of it: start from what the provider said was left, less what
            # is still in flight (admitted after the answers that said so).
            flying = sum(scope.in_flight.values())
            answers = scope.answers.total(now)
            tokens_each = scope.used.total(now) / answers if answers else 0.0
            for bucket, left in (
                (scope.requests, told.requests_left),
                (scope.tokens, told.tokens_left),
            ):
                if bucket is not None and left is not None:
                    each = 1.0 if bucket is scope.requests else tokens_each
                    bucket.level = min(bucket.level, float(left) - flying * each)
        # Later, ``requests_left``/``tokens_left`` and ``empty_for_s`` were true when the
        # provider admitted the request, a round trip ago, and more has been sent since:
        # following them would count those twice. The limits are what the buckets use.

    def _refused(self, scope: ScopeState, demand: Demand, now: float) -> None:
        scope.refused_total += demand.refused
        scope.refusals.add(now, demand.refused)
        if demand.retry_after_s is not None:
            pause = min(max(demand.retry_after_s, 0.0), MAX_PAUSE_S)
            scope.paused_until = max(scope.paused_until, now + pause)
        if not scope.learn or now < scope.cut_at + _HOLD_S:
            return
        scope.cut_at = now
        if scope.announced is not None:
            scope.cut = max(0.5, scope.cut * REFUSAL_CUT)
        else:
            answered = scope.answers.recent_per_minute(now, 2)
            first = scope.adaptive is None
            if scope.adaptive is None:
                sent = scope.sent.recent_per_minute(now, 2)
                scope.adaptive = LearnedRate(max(answered, sent / 2, 1.0))
                scope.window = None
            scope.adaptive.refused(answered, first)
        scope.reshape(now)

    def _admit(self, host: str, scope: ScopeState, want: Sequence[int], now: float) -> Grant:
        if scope.paused_until != -math.inf and now >= scope.paused_until:
            scope.paused_until = -math.inf
        slot_limit = scope.slot_limit()
        if scope.open:
            if want:
                scope.sent.add(now, len(want))
            return Grant(scope.name, len(want), open=True)
        if now < scope.paused_until:
            return Grant(scope.name, 0, retry_in_s=scope.paused_until - now, slots=True)
        held = sum(scope.held.values())
        requests, tokens = scope.requests, scope.tokens
        for bucket in (requests, tokens):
            if bucket is not None:
                bucket.refill(now)
        admitted, retry = 0, 0.0
        for estimate in want:
            if slot_limit is not None and held >= slot_limit:
                retry = _SLOT_RETRY_S
                break
            wait = max(
                requests.wait_s(1.0) if requests is not None else 0.0,
                tokens.wait_s(float(estimate)) if tokens is not None else 0.0,
            )
            if wait > 0:
                retry = wait
                break
            if requests is not None:
                requests.level -= 1.0
            if tokens is not None:
                tokens.level -= float(estimate)
            admitted += 1
            held += 1
        if admitted:
            scope.held[host] = scope.held.get(host, 0) + admitted
            scope.sent.add(now, admitted)
        return Grant(scope.name, admitted, retry_in_s=max(retry, _MIN_RETRY_S), slots=True)

    def _expire(self, now: float) -> None:
        for name, scope in list(self._scopes.items()):
            gone = [h for h, at in scope.seen.items() if now - at > LEASE_S]
            for host in gone:
                for table in (scope.seen, scope.held, scope.waiting, scope.in_flight):
                    table.pop(host, None)
                scope.configured_by.pop(host, None)
            if gone:
                self._configure(scope, now)
            if not scope.seen and now - scope.last_seen > FORGET_S:
                del self._scopes[name]  # unused for long: learn it again

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """Every scope as the live view, ``jobs list``, the dashboard and ``events`` show it
        (docs/json.md, "Rate limits")."""
        rows = []
        for scope in sorted(self._scopes.values(), key=lambda s: s.name):
            rpm, tpm = scope.rpm_limit(), scope.tpm_limit()
            rows.append(
                {
                    "scope": scope.name,
                    "provider": scope.provider,
                    "model": scope.model,
                    "source": scope.source(),
                    "rpm_limit": None if rpm is None else round(rpm, 1),
                    "tpm_limit": None if tpm is None else round(tpm, 1),
                    "max_in_flight": scope.slot_limit(),
                    "rpm_now": round(scope.sent.total(now), 1),
                    "tpm_now": round(scope.used.total(now), 1),
                    "in_flight": sum(scope.in_flight.values()),
                    "waiting": sum(scope.waiting.values()),
                    "rate_limited": scope.refused_total,
                    "rate_limited_last_min": round(scope.refusals.total(now)),
                    "paused_s": round(max(scope.paused_until - now, 0.0), 3),
                }
            )
        return rows
