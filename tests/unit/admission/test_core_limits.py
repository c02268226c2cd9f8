"""AdmissionCore against configured limits: rpm and tpm over any minute, overruns, slots held
across hosts, leases, and two configs of one scope (docs/rate-limits.md)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.admission import AdmissionCore, Demand, Grant, Limits

pytestmark = pytest.mark.timeout(60)

STEPS = (0.001, 0.01, 0.05, 0.2, 0.5, 1.0, 2.5)
"""Simulated seconds between syncs, drawn at random: bursts and pauses of every length."""


def demand(limits: Limits, *, learn: bool = False, scope: str = "s", **fields: object) -> Demand:
    return Demand(
        scope=scope,
        provider="p",
        model="m",
        configured=limits,
        learn=learn,
        **fields,  # type: ignore[arg-type]
    )


def most_in_any_minute(events: Sequence[tuple[float, float]]) -> float:
    """The largest sum of amounts admitted within any 60 s window ``[t, t + 60)``."""
    events = sorted(events)
    best, start, total = 0.0, 0, 0.0
    for t, amount in events:
        total += amount
        while events[start][0] <= t - 60.0:
            total -= events[start][1]
            start += 1
        best = max(best, total)
    return best


def drive(
    core: AdmissionCore,
    hosts: Sequence[str],
    limits: Limits,
    *,
    seed: int,
    seconds: float,
    estimates: tuple[int, int] = (1, 1),
) -> list[tuple[float, float, float]]:
    """Hosts with an endless backlog sync when told to or at random moments; each admission as
    (t, n, tokens)."""
    rng = random.Random(seed)
    now, events = 0.0, []
    while now < seconds:
        who = rng.choice(list(hosts))
        want = tuple(rng.randint(*estimates) for _ in range(40))
        (grant,) = core.sync(who, [demand(limits, want=want)], now)
        if grant.admitted:
            events.append((now, float(grant.admitted), float(sum(want[: grant.admitted]))))
        # Half the time the host comes back when the grant says, else at a random moment.
        now += grant.retry_in_s if rng.random() < 0.5 else rng.choice(STEPS)
    return events


@pytest.mark.parametrize("rpm", [1, 7, 60, 120, 600, 3000])
@pytest.mark.parametrize("seed", [1, 2])
def test_configured_rpm_is_never_exceeded_in_any_minute(rpm: int, seed: int) -> None:
    core = AdmissionCore()
    events = drive(core, ["a"], Limits(rpm=rpm), seed=seed, seconds=300.0)
    admitted = most_in_any_minute([(t, n) for t, n, _ in events])
    assert 0 < admitted <= rpm


@pytest.mark.parametrize("rpm", [7, 60, 600, 3000])
def test_a_host_that_comes_back_when_told_gets_the_whole_configured_rpm(rpm: int) -> None:
    core, now, admitted = AdmissionCore(), 0.0, 0
    while now < 120.0:
        (grant,) = core.sync("a", [demand(Limits(rpm=rpm), want=(1,) * 40)], now)
        admitted += grant.admitted if now >= 60.0 else 0
        now += grant.retry_in_s
    assert rpm * 0.97 - 1 <= admitted <= rpm  # the second minute: all of it, and no more


@pytest.mark.parametrize("rpm", [10, 120, 900])
def test_two_hosts_share_one_bucket(rpm: int) -> None:
    core = AdmissionCore()
    events = drive(core, ["a", "b"], Limits(rpm=rpm), seed=rpm, seconds=240.0)
    assert most_in_any_minute([(t, n) for t, n, _ in events]) <= rpm
    # Each host alone would be allowed the whole rpm: together they got no more than that.
    assert sum(n for _, n, _ in events) <= rpm * 240 / 60


@pytest.mark.parametrize("tpm", [6000, 60_000, 240_000])
@pytest.mark.parametrize("seed", [3, 4])
def test_configured_tpm_is_never_exceeded_in_any_minute(tpm: int, seed: int) -> None:
    core = AdmissionCore()
    capacity = tpm // 120  # a full bucket holds half a second of the rate
    events = drive(
        core, ["a", "b"], Limits(tpm=tpm), seed=seed, seconds=300.0, estimates=(1, capacity)
    )
    assert most_in_any_minute([(t, tokens) for t, _, tokens in events]) <= tpm


def test_a_request_larger_than_the_burst_goes_when_full_and_the_debt_is_paid_back() -> None:
    core = AdmissionCore()
    tpm, big = 6000, 2000  # the bucket holds 50 tokens
    events = drive(core, ["a"], Limits(tpm=tpm), seed=5, seconds=300.0, estimates=(1, big))
    assert events, "a request above the burst must still be admitted"
    # Only the last request of a minute may reach beyond it, by its excess over the burst.
    assert most_in_any_minute([(t, tokens) for t, _, tokens in events]) <= tpm + big


def test_overrun_settles_the_token_bucket() -> None:
    core = AdmissionCore()
    limits = Limits(tpm=6000)  # 50 tokens of burst, ~99 a second
    (grant,) = core.sync("a", [demand(limits, want=(50, 50))], 0.0)
    assert grant.admitted == 1  # the second waits for the bucket
    (grant,) = core.sync("a", [demand(limits, want=(50,), overrun=-50)], 0.0)
    assert grant.admitted == 1  # the first used nothing: its tokens came back
    (grant,) = core.sync("a", [demand(limits, want=(50,), overrun=150)], 0.0)
    assert grant.admitted == 0
    assert grant.retry_in_s == pytest.approx(200 / (5950 / 60), rel=1e-6)  # the debt first


def test_tokens_given_back_do_not_grow_the_burst() -> None:
    core = AdmissionCore()
    limits = Limits(tpm=6000)
    core.sync("a", [demand(limits)], 0.0)
    # Answers that used far fewer tokens than reserved, reported when the bucket is full.
    (grant,) = core.sync("a", [demand(limits, want=(50,) * 100, overrun=-100_000)], 1.0)
    assert grant.admitted == 1  # no more than a full bucket at once


def grants_for(
    core: AdmissionCore, who: str, limits: Limits, now: float, **fields: object
) -> Grant:
    (grant,) = core.sync(who, [demand(limits, **fields)], now)
    return grant


def test_slots_held_across_two_hosts_never_exceed_max_in_flight() -> None:
    limits = Limits(max_in_flight=5)
    core, rng = AdmissionCore(), random.Random(7)
    held = {"a": 0, "b": 0}
    now = 0.0
    for _ in range(2000):
        who = rng.choice(["a", "b"])
        release = rng.randint(0, held[who])
        grant = grants_for(core, who, limits, now, want=(1,) * 8, release=release)
        assert grant.slots and not grant.open
        held[who] += grant.admitted - release
        assert held["a"] + held["b"] <= 5
        now += rng.choice(STEPS[:4])
    row = core.snapshot(now)[0]
    assert row["max_in_flight"] == 5 and row["source"] == "config"


def test_releases_free_slots_and_a_silent_host_loses_its_own() -> None:
    limits = Limits(max_in_flight=3)
    core = AdmissionCore()
    assert grants_for(core, "a", limits, 0.0, want=(1,) * 3).admitted == 3
    full = grants_for(core, "b", limits, 0.0, want=(1,))
    assert full.admitted == 0 and full.retry_in_s > 0
    assert grants_for(core, "a", limits, 0.1, release=2).admitted == 0
    assert grants_for(core, "b", limits, 0.2, want=(1,) * 3).admitted == 2
    # a goes silent holding one slot; b keeps asking: the slot comes back after the lease.
    now, got = 0.2, 0
    while now < 10.0:
        now += 0.5
        got += grants_for(core, "b", limits, now, want=(1,)).admitted
    assert got == 0  # within the lease a's slot stays held
    for _ in range(4):
        now += 0.5
        got += grants_for(core, "b", limits, now, want=(1,)).admitted
    assert got == 1


def test_two_configs_of_one_scope_the_tighter_holds_until_its_host_is_gone() -> None:
    core = AdmissionCore()
    tight, loose = Limits(rpm=60), Limits(rpm=600)
    grants_for(core, "a", tight, 0.0)
    grants_for(core, "b", loose, 0.0)
    assert core.snapshot(0.0)[0]["rpm_limit"] == 60
    now, admitted = 0.0, []
    while now < 9.0:  # a keeps quiet from here on; b asks every 0.1 s
        now += 0.1
        admitted.append((now, grants_for(core, "b", loose, now, want=(1,) * 10).admitted))
    assert sum(n for _, n in admitted) <= 60 * 9.0 / 60 + 1  # a's 60 rpm held for b too
    while now < 12.0:
        now += 0.1
        grants_for(core, "b", loose, now, want=(1,) * 10)
    assert core.snapshot(now)[0]["rpm_limit"] == 600  # a's lease ran out: b's config applies
    late = 0
    while now < 22.0:
        now += 0.1
        late += grants_for(core, "b", loose, now, want=(1,) * 10).admitted
    assert late > 60  # well above what 60 rpm allows in 10 s, within 600 rpm
    assert late <= 600 * 10 / 60 + 5


def test_two_origins_of_one_host_are_two_configs() -> None:
    core = AdmissionCore()
    grants_for(core, "a", Limits(rpm=600), 0.0, origin="1")
    grants_for(core, "a", Limits(rpm=30), 0.0, origin="2")
    assert core.snapshot(0.0)[0]["rpm_limit"] == 30


LEASE = 10.0
"""The core's lease of a host's slots (seconds without a sync)."""

op = st.tuples(
    st.integers(0, 2),  # which host syncs
    st.sampled_from((0.0, 0.004, 0.05, 0.3, 1.0, 4.0, 11.0)),  # seconds since the last sync
    st.integers(0, 12),  # requests it has waiting
    st.floats(0.0, 1.0),  # share of its slots it gives back
    st.integers(1, 100),  # tokens each waiting request is estimated at
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rpm=st.sampled_from((30, 300, 2400)),
    slots=st.integers(1, 12),
    ops=st.lists(op, min_size=1, max_size=300),
)
def test_every_configured_limit_holds_at_once_for_any_hosts_syncs(
    rpm: int, slots: int, ops: list[tuple[int, float, int, float, int]]
) -> None:
    tpm = 12_000  # a bucket of 100 tokens: every estimate fits it
    limits = Limits(rpm=rpm, tpm=tpm, max_in_flight=slots)
    core = AdmissionCore()
    held, last = [0, 0, 0], [0.0, 0.0, 0.0]
    now, events = 0.0, []
    for who, step, waiting, share, estimate in ops:
        now += step
        release = round(held[who] * share)
        grant = grants_for(
            core, f"h{who}", limits, now, want=(estimate,) * waiting, release=release
        )
        held[who] += grant.admitted - release
        last[who] = now
        for other in range(3):
            if now - last[other] > LEASE:
                held[other] = 0  # gone: its slots went back
        assert sum(held) <= slots
        if grant.admitted:
            events.append((now, grant.admitted, grant.admitted * estimate))
    assert most_in_any_minute([(t, n) for t, n, _ in events]) <= rpm
    assert most_in_any_minute([(t, tokens) for t, _, tokens in events]) <= tpm
