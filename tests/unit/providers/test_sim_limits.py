"""The simulated provider's rate limits, pure: token buckets on a fake clock, request costs, the
limit headers of both wire formats, and the in-process simulated model's 429s."""

from __future__ import annotations

import pytest

from clonefleet.errors import ModelHTTPError
from clonefleet.providers import (
    Message,
    ModelRequest,
    Role,
    SimBrain,
    SimScript,
    SimulatedModel,
)
from clonefleet.providers.sim._limits import (
    DEFAULT_ANSWER_TOKENS,
    Admission,
    SimLimiter,
    SimLimits,
    Snapshot,
    anthropic_limit_headers,
    go_duration,
    openai_limit_headers,
    request_cost,
    rfc3339,
)

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _admitted(limiter: SimLimiter, n: int, cost: int = 1, model: str = "m") -> int:
    return sum(limiter.admit(model, cost).admitted for _ in range(n))


def test_the_request_bucket_lets_a_burst_through_then_refills_at_rpm():
    clock = FakeClock()
    limiter = SimLimiter(SimLimits(rpm=600, burst=5), clock)  # 10 requests a second
    assert _admitted(limiter, 8) == 5
    refused = limiter.admit("m", 1)
    assert not refused.admitted and refused.binding == "requests"
    assert refused.retry_after_s == pytest.approx(0.1)
    clock.advance(0.1)
    assert _admitted(limiter, 3) == 1
    clock.advance(10)  # a long idle spell refills only up to the burst
    assert _admitted(limiter, 10) == 5


def test_the_default_burst_is_one_second_of_rpm():
    limiter = SimLimiter(SimLimits(rpm=1200), FakeClock())
    assert _admitted(limiter, 50) == 20
    assert SimLimits(rpm=30).request_capacity == 1


def test_each_model_has_its_own_buckets():
    limiter = SimLimiter(SimLimits(rpm=60, burst=1), FakeClock())
    assert limiter.admit("a", 1).admitted and limiter.admit("b", 1).admitted
    assert not limiter.admit("a", 1).admitted


def test_tpm_binds_before_rpm_when_requests_are_large():
    clock = FakeClock()
    # 10 requests a second allowed, but 6000 tokens a minute is 100 a second: 2 requests of 50.
    limiter = SimLimiter(SimLimits(rpm=600, tpm=6000, burst=10), clock)
    assert _admitted(limiter, 10, cost=50) == 2
    refused = limiter.admit("m", 50)
    assert refused.binding == "tokens"
    assert refused.retry_after_s == pytest.approx(0.5)
    assert refused.tokens is not None and refused.tokens.remaining == 0
    assert refused.requests is not None and refused.requests.remaining == 8
    clock.advance(1.0)
    assert _admitted(limiter, 10, cost=50) == 2


def test_nothing_is_charged_for_a_refused_request():
    clock = FakeClock()
    limiter = SimLimiter(SimLimits(rpm=60, tpm=600, burst=1), clock)
    assert limiter.admit("m", 5).admitted
    for _ in range(20):
        assert not limiter.admit("m", 5).admitted
    clock.advance(1.0)
    assert limiter.admit("m", 5).admitted


def test_a_request_larger_than_the_token_bucket_passes_when_it_is_full_and_leaves_debt():
    clock = FakeClock()
    limiter = SimLimiter(SimLimits(tpm=600), clock)  # holds 10 tokens, gains 10 a second
    assert limiter.admit("m", 30).admitted
    refused = limiter.admit("m", 1)
    assert refused.binding == "tokens" and refused.retry_after_s == pytest.approx(2.1)
    clock.advance(3.0)
    assert limiter.admit("m", 30).admitted


def test_snapshots_report_limit_remaining_and_time_to_full():
    clock = FakeClock()
    limiter = SimLimiter(SimLimits(rpm=60, tpm=6000, burst=4), clock)
    first = limiter.admit("m", 100)
    assert first.requests == Snapshot(limit=60, remaining=3, reset_s=pytest.approx(1.0))
    assert first.tokens == Snapshot(limit=6000, remaining=300, reset_s=pytest.approx(1.0))


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({"rpm": 0}, "rpm"),
        ({"tpm": -1}, "tpm"),
        ({"burst": 3}, "burst needs rpm"),
        ({"rpm": True}, "rpm"),
    ],
)
def test_bad_limits_are_refused(limits, problem):
    with pytest.raises(ValueError, match=problem):
        SimLimits(**limits)


def test_no_limit_set_is_not_enabled():
    assert not SimLimits().enabled and SimLimits(tpm=1).enabled


def test_request_cost_counts_input_words_and_max_tokens():
    messages = (Message(role=Role.USER, content="one two three"),)
    assert request_cost(ModelRequest(model="m", messages=messages, max_tokens=100)) == 103
    assert request_cost(ModelRequest(model="m", messages=messages)) == 3 + DEFAULT_ANSWER_TOKENS


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0001, "1ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (8.64, "8.64s"),
        (360, "6m0s"),
        (90.25, "1m30.25s"),
        (3600, "1h0m0s"),
    ],
)
def test_go_duration_writes_durations_as_openai_sends_them(seconds, text):
    assert go_duration(seconds) == text


def _refusal() -> Admission:
    return Admission(
        admitted=False,
        binding="tokens",
        retry_after_s=1.25,
        cost=50,
        requests=Snapshot(600, 3, 0.7),
        tokens=Snapshot(6000, 0, 360.0),
    )


def test_openai_headers_on_a_refusal():
    assert openai_limit_headers(_refusal()) == {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "700ms",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0s",
        "retry-after": "2",
        "retry-after-ms": "1250",
    }


def test_openai_headers_on_success_name_only_the_limits_set_and_no_retry_after():
    ok = Admission(admitted=True, cost=5, requests=Snapshot(60, 0, 1.0))
    assert openai_limit_headers(ok) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
    }


def test_anthropic_headers_give_rfc3339_resets_for_all_four_limits():
    wall = 1_800_000_000.2  # 2027-01-15T08:00:00.2Z
    headers = anthropic_limit_headers(_refusal(), wall)
    assert headers["anthropic-ratelimit-requests-limit"] == "600"
    assert headers["anthropic-ratelimit-requests-remaining"] == "3"
    assert headers["anthropic-ratelimit-requests-reset"] == "2027-01-15T08:00:01Z"
    for kind in ("tokens", "input-tokens", "output-tokens"):
        assert headers[f"anthropic-ratelimit-{kind}-limit"] == "6000"
        assert headers[f"anthropic-ratelimit-{kind}-remaining"] == "0"
        assert headers[f"anthropic-ratelimit-{kind}-reset"] == "2027-01-15T08:06:01Z"
    assert headers["retry-after"] == "2"
    assert len(headers) == 13


def test_rfc3339_rounds_up_to_the_second():
    assert rfc3339(0) == "1970-01-01T00:00:00Z"
    assert rfc3339(0.001) == "1970-01-01T00:00:01Z"


def _req(clone: int = 0) -> ModelRequest:
    return ModelRequest(
        model="sim-small",
        messages=(Message(role=Role.USER, content="do it"),),
        metadata={"batch_id": "b", "clone_index": clone},
    )


async def test_the_in_process_model_raises_429_with_the_wait_past_its_limit():
    clock = FakeClock()
    model = SimulatedModel(rpm=60, burst=2, clock=clock)
    await model.request(_req(0))
    await model.request(_req(1))
    with pytest.raises(ModelHTTPError) as caught:
        await model.request(_req(2))
    assert caught.value.status == 429 and caught.value.retryable
    assert caught.value.retry_after_s == pytest.approx(1.0)
    clock.advance(1.0)
    assert (await model.request(_req(2))).tool_calls == ()


async def test_the_in_process_model_without_limit_headers_gives_no_retry_after():
    model = SimulatedModel(tpm=60, limit_headers=False, clock=FakeClock())
    await model.request(_req(0))
    with pytest.raises(ModelHTTPError) as caught:
        await model.request(_req(1))
    assert caught.value.status == 429 and caught.value.retry_after_s is None


async def test_the_in_process_model_without_limits_never_refuses():
    model = SimulatedModel(clock=FakeClock())
    assert model.limiter is None
    for i in range(200):
        await model.request(_req(i))


async def test_a_refused_request_consumes_no_script_step():
    clock = FakeClock()
    script = SimScript.from_data({"default": [{"text": "first"}, {"text": "second"}]})
    model = SimulatedModel(SimBrain(script=script), rpm=60, burst=1, clock=clock)
    assert (await model.request(_req(0))).text == "first"
    with pytest.raises(ModelHTTPError):
        await model.request(_req(0))
    clock.advance(1.0)
    # The clone's second step: the refused attempt did not advance its script.
    assert (await model.request(_req(0))).text == "second"


def test_the_config_takes_the_limits_of_a_simulated_provider():
    from pydantic import ValidationError

    from clonefleet.config import ProviderConfig

    cfg = ProviderConfig(
        kind="simulated", simulated={"rpm": 1200, "tpm": 90_000, "burst": 5, "limit_headers": False}
    )
    opts = cfg.simulated
    assert (opts.rpm, opts.tpm, opts.burst, opts.limit_headers) == (1200, 90_000, 5, False)
    assert ProviderConfig(kind="simulated").simulated.rpm is None
    with pytest.raises(ValidationError, match="burst needs rpm"):
        ProviderConfig(kind="simulated", simulated={"burst": 5})
    with pytest.raises(ValidationError):
        ProviderConfig(kind="simulated", simulated={"tpm": 0})
