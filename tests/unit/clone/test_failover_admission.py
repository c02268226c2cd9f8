"""The failover layer with a fleet-wide gate: a rate-limited refusal waits for capacity on the same
candidate (not an attempt, no failover) unless ``fail_over_on_rate_limit``; the wait is bounded
by ``max_wait_s`` (docs/rate-limits.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from clonefleet.admission import CandidateGate, HostGates, Limits
from clonefleet.clone import Candidate, FailoverModel
from clonefleet.errors import AllModelsFailed, ModelHTTPError
from clonefleet.providers import ModelRequest, ModelResponse
from clonefleet.testing import FakeClock, FunctionModel, reply

pytestmark = pytest.mark.timeout(30)

REQ = ModelRequest(model="", messages=())


def steps(
    *outcomes: ModelResponse | Exception, then: ModelResponse | Exception | None = None
) -> FunctionModel:
    """A model answering or raising each outcome in turn, then ``then`` for ever."""
    left = list(outcomes)

    def answer(req: ModelRequest) -> ModelResponse:
        step = left.pop(0) if left else then
        assert step is not None, "the model was asked once too often"
        if isinstance(step, Exception):
            raise step
        return step

    return FunctionModel(answer)


class Fleet:
    """One host's gates and what the failover layer told its callbacks."""

    def __init__(self) -> None:
        self.gates = HostGates("h", None)
        self.clock = FakeClock()
        self.moves: list[tuple[str, str]] = []
        self.limited: list[tuple[str, int]] = []

    def candidates(
        self, *models: FunctionModel, retries: int = 0, max_wait_s: float = 5.0
    ) -> list[Candidate]:
        return [
            Candidate(
                key=f"m{i}",
                wire_name=f"wire{i}",
                model=model,
                provider="p",
                max_retries=retries,
                gate=self.gate(f"wire{i}", max_wait_s),
            )
            for i, model in enumerate(models)
        ]

    def gate(self, wire: str, max_wait_s: float) -> CandidateGate:
        scope = self.gates.scope(f"p@x/{wire}", "p", wire, Limits(max_in_flight=4), False, 16)
        return CandidateGate(self.gates, (scope,), max_wait_s)

    def failover(self, cands: Sequence[Candidate], **options: bool) -> FailoverModel:
        return FailoverModel(
            cands,
            sleep=self.clock.sleep,
            on_failover=lambda a, b, _why: self.moves.append((a, b)),
            on_rate_limited=lambda cand, err: self.limited.append((cand.key, err.status)),
            **options,
        )


def in_flight(cands: Sequence[Candidate]) -> int:
    return sum(scope.in_flight for c in cands if c.gate for scope in c.gate.scopes)


async def test_a_rate_limited_refusal_waits_on_the_same_candidate_and_is_not_an_attempt() -> None:
    fleet = Fleet()
    model_a = steps(
        ModelHTTPError(429, retry_after_s=0.0), ModelHTTPError(429, retry_after_s=0.0), reply("ok")
    )
    model_b = steps()
    cands = fleet.candidates(model_a, model_b, retries=0)  # no retries: an attempt would fail
    resp = await fleet.failover(cands).request(REQ)
    assert resp.text == "ok" and resp.model == "m0"
    assert fleet.moves == [] and model_b.calls == []
    assert fleet.limited == [("m0", 429), ("m0", 429)]
    assert fleet.clock.sleeps == []  # the gate waited, not a backoff
    assert len(model_a.calls) == 3 and in_flight(cands) == 0
    assert fleet.gates.snapshot()[0]["rate_limited"] == 2
    await fleet.gates.aclose()


async def test_fail_over_on_rate_limit_moves_to_the_next_candidate() -> None:
    fleet = Fleet()
    model_a = steps(then=ModelHTTPError(429, retry_after_s=0.0))
    model_b = steps(reply("from b"))
    cands = fleet.candidates(model_a, model_b)
    resp = await fleet.failover(cands, fail_over_on_rate_limit=True).request(REQ)
    assert resp.model == "m1" and resp.text == "from b"
    assert fleet.moves == [("m0", "m1")] and fleet.limited == [("m0", 429)]
    assert len(model_a.calls) == 1 and in_flight(cands) == 0
    await fleet.gates.aclose()


async def test_the_capacity_wait_is_bounded_and_then_the_last_refusal_is_raised() -> None:
    fleet = Fleet()
    always = steps(then=ModelHTTPError(429, "slow down", retry_after_s=10.0))
    cands = fleet.candidates(always, max_wait_s=0.1)
    began = time.monotonic()
    with pytest.raises(AllModelsFailed) as info:
        await fleet.failover(cands).request(REQ)
    assert time.monotonic() - began < 3.0
    cause = info.value.cause
    assert cause is not None and "HTTP 429" in cause["summary"]
    assert cause["waited_s"] > 0 and cause["attempts"] == 1
    assert cause["candidates"][0]["last_status"] == 429
    assert "HTTP 429" in info.value.failures["m0"]
    assert len(always.calls) == 1  # the provider's pause held every later send back
    assert fleet.limited == [("m0", 429)] and in_flight(cands) == 0
    await fleet.gates.aclose()


async def test_a_503_with_retry_after_waits_for_capacity() -> None:
    fleet = Fleet()
    model = steps(ModelHTTPError(503, retry_after_s=0.0), reply("ok"))
    cands = fleet.candidates(model, retries=0)
    resp = await fleet.failover(cands).request(REQ)
    assert resp.text == "ok" and fleet.limited == [("m0", 503)] and fleet.clock.sleeps == []
    await fleet.gates.aclose()


async def test_a_503_without_retry_after_is_retried_with_backoff_as_before() -> None:
    fleet = Fleet()
    model_a = steps(ModelHTTPError(503), ModelHTTPError(503))
    model_b = steps(reply("from b"))
    cands = fleet.candidates(model_a, model_b, retries=1)
    resp = await fleet.failover(cands).request(REQ)
    assert resp.model == "m1" and len(model_a.calls) == 2  # max_retries=1: two attempts
    assert fleet.clock.sleeps == [0.25] and fleet.limited == []
    assert fleet.moves == [("m0", "m1")] and in_flight(cands) == 0
    await fleet.gates.aclose()


async def test_a_spending_cap_429_is_not_a_rate_limit() -> None:
    fleet = Fleet()
    model_a = steps(ModelHTTPError(429, "quota", spend_cap=True, error_type="insufficient_quota"))
    model_b = steps(reply("from b"))
    cands = fleet.candidates(model_a, model_b, retries=2)
    resp = await fleet.failover(cands).request(REQ)
    assert resp.model == "m1" and len(model_a.calls) == 1
    assert fleet.limited == [] and fleet.clock.sleeps == [] and fleet.moves == [("m0", "m1")]
    assert in_flight(cands) == 0
    await fleet.gates.aclose()


@pytest.mark.parametrize(
    ("err", "limited"),
    [
        (ModelHTTPError(429), True),
        (ModelHTTPError(429, retry_after_s=3.0), True),
        (ModelHTTPError(429, spend_cap=True), False),
        (ModelHTTPError(529), True),
        (ModelHTTPError(500, error_type="overloaded_error"), True),
        (ModelHTTPError(503, retry_after_s=1.0), True),
        (ModelHTTPError(503), False),
        (ModelHTTPError(500), False),
        (ModelHTTPError(400), False),
    ],
)
def test_which_refusals_mean_wait_for_capacity(err: ModelHTTPError, limited: bool) -> None:
    assert err.rate_limited is limited


async def test_no_capacity_within_max_wait_fails_with_a_timeout_naming_the_setting() -> None:
    fleet = Fleet()
    model = steps(then=reply("never sent"))
    cands = fleet.candidates(model, max_wait_s=0.05)
    gate = cands[0].gate
    assert gate is not None
    # Another clone holds every slot of the model.
    held = [await gate.admit(REQ, time.monotonic() + 1.0) for _ in range(4)]
    with pytest.raises(AllModelsFailed) as info:
        await fleet.failover(cands).request(REQ)
    assert "admission.max_wait_s" in info.value.failures["m0"] and model.calls == []
    cause = info.value.cause
    assert cause is not None and cause["candidates"][0]["error_type"] == "CapacityTimeout"
    assert cause["waited_s"] > 0
    for ticket in held:
        gate.abandoned(ticket)
    await fleet.gates.aclose()


async def test_a_request_cancelled_while_sent_gives_its_slot_back() -> None:
    fleet = Fleet()
    sent = asyncio.Event()

    async def hangs(req: ModelRequest) -> ModelResponse:
        sent.set()
        await asyncio.Event().wait()  # an answer that never comes
        raise AssertionError("unreachable")

    cands = fleet.candidates(FunctionModel(hangs))
    task = asyncio.create_task(fleet.failover(cands).request(REQ))
    await asyncio.wait_for(sent.wait(), 3.0)
    assert in_flight(cands) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert in_flight(cands) == 0
    gate = cands[0].gate
    assert gate is not None
    # All 4 slots of the model can be held again: the cancelled request's came back.
    deadline = time.monotonic() + 3.0
    held = [await gate.admit(REQ, deadline) for _ in range(4)]
    for ticket in held:
        gate.abandoned(ticket)
    await fleet.gates.aclose()
