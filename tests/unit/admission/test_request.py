"""A candidate's gate as the failover layer uses it: token estimates, limits read from real
header sets, and admission within a deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from clonefleet.admission import (
    Announced,
    CandidateGate,
    HostGates,
    Limits,
    announced_from,
    estimate_tokens,
)
from clonefleet.errors import ModelTimeout
from clonefleet.providers import Message, ModelRequest, ToolSpec, read_limits
from clonefleet.testing import reply

pytestmark = pytest.mark.timeout(30)

NOW = 1_767_225_600.0
"""2026-01-01T00:00:00Z, seconds since the epoch."""


def request(*texts: str, tools: int = 0, max_tokens: int | None = None) -> ModelRequest:
    return ModelRequest(
        model="m",
        messages=tuple(Message(role="user", content=t) for t in texts),
        tools=tuple(ToolSpec(name=f"t{i}", description="", parameters={}) for i in range(tools)),
        max_tokens=max_tokens,
    )


def test_estimate_counts_characters_tools_and_the_answer_allowance() -> None:
    assert estimate_tokens(request()) == 64  # an answer's allowance when none is set
    assert estimate_tokens(request("x" * 400, "y" * 41)) == 100 + 10 + 64
    assert estimate_tokens(request("x" * 40, tools=3, max_tokens=1000)) == 10 + 300 + 1000


def test_openai_headers_give_requests_and_tokens_per_minute() -> None:
    headers = {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "29000",
        "x-ratelimit-reset-tokens": "2s",
    }
    told = announced_from(read_limits(headers, NOW), NOW)
    assert told == Announced(
        rpm=500, tpm=30000, requests_left=499, tokens_left=29000, empty_for_s=None
    )


def test_an_empty_openai_window_says_when_it_refills() -> None:
    headers = {
        "X-RateLimit-Limit-Requests": "60",
        "X-RateLimit-Remaining-Requests": "0",
        "X-RateLimit-Reset-Requests": "1.5s",
    }
    told = announced_from(read_limits(headers, NOW), NOW)
    assert told is not None and told.rpm == 60 and told.tpm is None
    assert told.requests_left == 0 and told.empty_for_s == pytest.approx(1.5)


def test_anthropic_headers_with_input_tokens_stand_for_tokens() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:01Z",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:02Z",
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "8000",
    }
    told = announced_from(read_limits(headers, NOW), NOW)
    assert told == Announced(
        rpm=50, tpm=40000, requests_left=49, tokens_left=39000, empty_for_s=None
    )


def test_anthropic_combined_tokens_win_over_input_tokens() -> None:
    headers = {
        "anthropic-ratelimit-tokens-limit": "90000",
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:04Z",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
    }
    told = announced_from(read_limits(headers, NOW), NOW)
    assert told is not None and told.rpm is None
    assert told.tpm == 90000 and told.tokens_left == 0
    assert told.empty_for_s == pytest.approx(4.0)


def test_no_limit_reported_is_nothing_to_announce() -> None:
    assert announced_from(None, NOW) is None
    assert announced_from(read_limits({"content-type": "application/json"}, NOW), NOW) is None
    only_left = {"x-ratelimit-remaining-requests": "3"}  # how much is left, of no known limit
    assert announced_from(read_limits(only_left, NOW), NOW) is None


async def test_a_candidate_gate_without_capacity_before_its_deadline_raises_a_timeout() -> None:
    gates = HostGates("h", None)
    scope = gates.scope("p@x/m", "p", "m", Limits(max_in_flight=1), False, 16)
    gate = CandidateGate(gates, (scope,), max_wait_s=0.05)
    held = await gate.admit(request("hi"), time.monotonic() + 1.0)
    began = time.monotonic()
    with pytest.raises(ModelTimeout, match="admission.max_wait_s"):
        await gate.admit(request("hi"), time.monotonic() + 0.05)
    assert time.monotonic() - began < 1.0
    assert not scope.queue  # the request that gave up left the queue
    gate.abandoned(held)
    await gates.aclose()


async def test_answers_teach_the_gate_how_many_tokens_a_request_uses() -> None:
    gates = HostGates("h", None)
    scope = gates.scope("p@x/m", "p", "m", Limits(max_in_flight=4), False, 16)
    gate = CandidateGate(gates, (scope,))
    req = request("x" * 400)  # estimated at 164 tokens
    for _ in range(30):
        ticket = await gate.admit(req, time.monotonic() + 1.0)
        gate.answered(ticket, reply("ok", tokens=41), req)  # 82 used: half the estimate
    assert scope.ratio == pytest.approx(0.5, abs=0.01)
    ticket = await gate.admit(req, time.monotonic() + 1.0)
    assert ticket.estimate == 82
    gate.abandoned(ticket)
    assert scope.in_flight == 0
    await gates.aclose()


async def test_a_waiting_request_is_charged_what_answers_taught_by_the_time_it_goes() -> None:
    gates = HostGates("h", None)
    scope = gates.scope("p@x/m", "p", "m", Limits(max_in_flight=1), False, 16)
    gate = CandidateGate(gates, (scope,))
    req = request("x" * 400)  # estimated at 164 tokens
    first = await gate.admit(req, time.monotonic() + 1.0)
    assert first.estimate == 164
    second = asyncio.create_task(gate.admit(req, time.monotonic() + 3.0))
    await asyncio.sleep(0.01)
    assert not second.done()
    gate.answered(first, reply("ok", tokens=41), req)  # the first answer used half: 82
    assert scope.ratio == 0.5  # the first answer sets the ratio
    ticket = await asyncio.wait_for(second, 3.0)
    assert ticket.estimate == 82
    gate.abandoned(ticket)
    await gates.aclose()


async def test_an_open_scope_admits_at_once_whatever_the_deadline() -> None:
    gates = HostGates("h", None)
    scope = gates.scope("p@x/m", "p", "m", Limits(), False, 16)
    gate = CandidateGate(gates, (scope,), max_wait_s=0.05)
    first = await gate.admit(request("hi"), time.monotonic() + 1.0)  # asks: nothing limits it
    assert scope.open and first.held == (True,)
    late = await gate.admit(request("hi"), time.monotonic() - 1.0)  # past its deadline
    assert late.held == (False,)
    gate.abandoned(first)
    gate.abandoned(late)
    assert scope.in_flight == 0
    await gates.aclose()
