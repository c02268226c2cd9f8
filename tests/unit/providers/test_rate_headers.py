"""The rate-limit readers: both wires' limit headers in one shape, Retry-After, which refusals mean
"wait", and the AIMD rate learned from refusals alone. Hostile values are ignored or bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clonefleet.errors import ConfigError
from clonefleet.providers import (
    MAX_RETRY_AFTER_S,
    AdaptiveRate,
    LimitReport,
    LimitWindow,
    is_rate_limited,
    rate_limit_kind,
    read_limits,
    retry_after_s,
)
from clonefleet.providers._rate_headers import (
    MAX_COUNT,
    MAX_RESET_S,
    parse_duration_s,
    parse_rfc3339,
)

NOW = 1_755_780_000.0  # 2025-08-21T12:40:00Z

# The sample values of OpenAI's rate-limit guide.
OPENAI = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}
# A recorded answer of Anthropic's Messages API (the rest of its headers left out).
ANTHROPIC = {
    "anthropic-ratelimit-input-tokens-limit": "80000",
    "anthropic-ratelimit-input-tokens-remaining": "80000",
    "anthropic-ratelimit-input-tokens-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-output-tokens-limit": "16000",
    "anthropic-ratelimit-output-tokens-remaining": "16000",
    "anthropic-ratelimit-output-tokens-reset": "2025-08-21T12:41:00Z",
    "anthropic-ratelimit-requests-limit": "1000",
    "anthropic-ratelimit-requests-remaining": "999",
    "anthropic-ratelimit-requests-reset": "2025-08-21T12:40:59Z",
    "anthropic-ratelimit-tokens-limit": "96000",
    "anthropic-ratelimit-tokens-remaining": "96000",
    "anthropic-ratelimit-tokens-reset": "2025-08-21T12:40:59Z",
    "request-id": "req_011CSLsW7mFqvHHnzrKdKjAE",
}


# ---------------------------------------------------------------------------------------------
# read_limits: both wires


def test_openai_headers_read_as_requests_and_tokens_windows():
    report = read_limits(OPENAI, NOW)
    assert report == LimitReport(
        "openai",
        requests=LimitWindow(60, 59, NOW + 1),
        tokens=LimitWindow(150_000, 149_984, NOW + 360),
    )
    assert report.windows().keys() == {"requests", "tokens"}
    assert report.exhausted_until(NOW) is None


def test_anthropic_headers_read_as_four_windows_with_absolute_resets():
    report = read_limits(ANTHROPIC, NOW)
    assert report is not None and report.wire == "anthropic"
    assert report.requests == LimitWindow(1000, 999, NOW + 59)
    assert report.tokens == LimitWindow(96_000, 96_000, NOW + 59)
    assert report.input_tokens == LimitWindow(80_000, 80_000, NOW + 59)
    assert report.output_tokens == LimitWindow(16_000, 16_000, NOW + 60)
    assert report.requests.reset_in_s(NOW) == 59.0
    assert report.requests.reset_in_s(NOW + 100) == 0.0


@pytest.mark.parametrize("case", [str.upper, str.title, lambda k: k[0].upper() + k[1:]])
def test_header_names_are_case_insensitive(case):
    for headers in (OPENAI, ANTHROPIC):
        assert read_limits({case(k): v for k, v in headers.items()}, NOW) == read_limits(
            headers, NOW
        )


def test_an_httpx_headers_object_reads_like_a_dict():
    both = read_limits(httpx.Headers(ANTHROPIC), NOW), read_limits(ANTHROPIC, NOW)
    assert both[0] == both[1]


def test_no_limit_headers_is_none():
    assert read_limits({}, NOW) is None
    assert read_limits({"content-type": "application/json", "retry-after": "2"}, NOW) is None
    assert read_limits({"x-ratelimit-limit-requests": "garbage"}, NOW) is None


def test_a_partial_window_keeps_what_was_sent():
    report = read_limits({"x-ratelimit-remaining-tokens": "0"}, NOW)
    assert report == LimitReport("openai", tokens=LimitWindow(None, 0, None))
    assert report.exhausted_until(NOW) == NOW  # empty with no reset given: empty now


def test_exhausted_until_is_the_latest_reset_of_the_empty_windows():
    headers = dict(OPENAI)
    headers |= {"x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "0"}
    report = read_limits(headers, NOW)
    assert report is not None and report.exhausted_until(NOW) == NOW + 360


def test_anthropic_wins_a_window_both_families_report():
    headers = OPENAI | {"anthropic-ratelimit-requests-limit": "5"}
    report = read_limits(headers, NOW)
    assert report is not None and report.wire == "anthropic"
    assert report.requests == LimitWindow(5, None, None)
    assert report.tokens == LimitWindow(150_000, 149_984, NOW + 360)


def test_azure_style_minus_one_and_zero_reset_are_ignored_or_now():
    report = read_limits(
        {
            "x-ratelimit-limit-tokens": "-1",
            "x-ratelimit-remaining-tokens": "-1",
            "x-ratelimit-reset-tokens": "0",
        },
        NOW,
    )
    assert report == LimitReport("openai", tokens=LimitWindow(None, None, NOW))


@pytest.mark.parametrize(
    "value",
    [
        "-1",
        "1.5",
        "1e3",
        "0x10",
        "1_000",
        "60, 60",
        "",
        "  ",
        "NaN",
        "inf",
        "٣",  # Arabic-Indic digit: int() would take it
        "１２",  # fullwidth digits
        "6\x000",
        "9" * 65,  # longer than any real value
    ],
)
def test_malformed_counts_are_ignored(value):
    report = read_limits(
        {"x-ratelimit-limit-requests": value, "x-ratelimit-reset-requests": "1s"}, NOW
    )
    assert report == LimitReport("openai", requests=LimitWindow(None, None, NOW + 1))


def test_huge_counts_are_bounded_and_remaining_never_above_limit():
    report = read_limits(
        {"anthropic-ratelimit-tokens-limit": "9" * 64, "anthropic-ratelimit-tokens-remaining": "7"},
        NOW,
    )
    assert report is not None and report.tokens == LimitWindow(MAX_COUNT, 7, None)
    report = read_limits(
        {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "5000"}, NOW
    )
    assert report is not None and report.requests == LimitWindow(10, 10, None)


def test_resets_are_bounded_to_between_now_and_a_day_later():
    past = read_limits({"anthropic-ratelimit-requests-reset": "2001-01-01T00:00:00Z"}, NOW)
    future = read_limits({"anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z"}, NOW)
    long = read_limits({"x-ratelimit-reset-requests": "99999999h"}, NOW)
    assert past is not None and past.requests == LimitWindow(None, None, NOW)
    assert future is not None and future.requests == LimitWindow(None, None, NOW + MAX_RESET_S)
    assert long is not None and long.requests == LimitWindow(None, None, NOW + MAX_RESET_S)


def test_non_text_values_and_names_are_ignored():
    hostile = {"x-ratelimit-limit-requests": b"60", 7: "60", "x-ratelimit-limit-tokens": None}
    assert read_limits(hostile, NOW) is None  # type: ignore[arg-type]


_NAMES = st.sampled_from(
    [
        *OPENAI,
        *ANTHROPIC,
        "retry-after",
        "X-RateLimit-Reset-Tokens",
        "ANTHROPIC-RATELIMIT-TOKENS-RESET",
    ]
)
_VALUES = st.one_of(
    st.text(max_size=80),
    st.integers(-(10**80), 10**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
)


@given(st.dictionaries(_NAMES, _VALUES), st.floats(0, 4e9))
def test_read_limits_never_raises_and_every_value_is_bounded(headers, now):
    report = read_limits(headers, now)
    for window in report.windows().values() if report else ():
        assert window.limit is None or 0 <= window.limit <= MAX_COUNT
        assert window.remaining is None or 0 <= window.remaining <= MAX_COUNT
        if window.limit is not None and window.remaining is not None:
            assert window.remaining <= window.limit
        assert window.reset_at is None or now <= window.reset_at <= now + MAX_RESET_S


# ---------------------------------------------------------------------------------------------
# Durations and RFC 3339 times


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("120ms", 0.12),
        ("1h2m3.5s", 3723.5),
        ("12ms", 0.012),
        ("0s", 0.0),
        ("1.5", 1.5),
        ("2", 2.0),
        ("250us", 250e-6),
        ("3µs", 3e-6),
        ("3μs", 3e-6),
        ("500ns", 5e-7),
        (".5s", 0.5),
        ("1m30s", 90.0),
        (" 7s ", 7.0),
    ],
)
def test_durations_parse_go_style(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "s", "-1s", "1x", "1 s", "1s2", "h1", "1h-2m", "1e3s", "+1s", "1,5s", "ⅷs"]
)
def test_malformed_durations_are_none(text):
    assert parse_duration_s(text) is None


@given(
    st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999), st.booleans()
)
def test_durations_round_trip(hours, minutes, seconds, millis, with_hours):
    text = (f"{hours}h" if with_hours else "") + f"{minutes}m{seconds}.{millis:03d}s"
    expected = (hours * 3600 if with_hours else 0) + minutes * 60 + seconds + millis / 1000
    assert parse_duration_s(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("2025-08-21T12:40:59Z", datetime(2025, 8, 21, 12, 40, 59, tzinfo=UTC)),
        ("2025-08-21t12:40:59z", datetime(2025, 8, 21, 12, 40, 59, tzinfo=UTC)),
        ("2025-08-21 12:40:59Z", datetime(2025, 8, 21, 12, 40, 59, tzinfo=UTC)),
        ("2025-08-21T12:40:59.5Z", datetime(2025, 8, 21, 12, 40, 59, 500_000, tzinfo=UTC)),
        (
            "2025-08-21T12:40:59.123456789Z",  # nanoseconds: cut to microseconds
            datetime(2025, 8, 21, 12, 40, 59, 123_456, tzinfo=UTC),
        ),
        ("2025-08-21T14:40:59+02:00", datetime(2025, 8, 21, 12, 40, 59, tzinfo=UTC)),
        ("2025-08-21T12:10:59.25-00:30", datetime(2025, 8, 21, 12, 40, 59, 250_000, tzinfo=UTC)),
        ("2016-12-31T23:59:60Z", datetime(2016, 12, 31, 23, 59, 59, tzinfo=UTC)),  # leap second
    ],
)
def test_rfc3339_times_parse(text, when):
    assert parse_rfc3339(text) == pytest.approx(when.timestamp())


@pytest.mark.parametrize(
    "text",
    [
        "2025-08-21T12:40:59",  # no offset
        "2025-02-30T00:00:00Z",
        "2025-08-21T25:00:00Z",
        "2025-08-21T12:40:59+99:99",
        "0000-01-01T00:00:00Z",
        "Thu, 21 Aug 2025 12:41:00 GMT",
        "1755780059",
        "２０２５-08-21T12:40:59Z",
        "2025-08-21T12:40:59Z trailing",
        "",
    ],
)
def test_malformed_rfc3339_times_are_none(text):
    assert parse_rfc3339(text) is None


@given(
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 1, 1)),
    st.integers(-23 * 60, 23 * 60),
)
def test_rfc3339_round_trips_with_any_offset(naive, offset_minutes):
    when = naive.replace(tzinfo=timezone(timedelta(minutes=offset_minutes)))
    assert parse_rfc3339(when.isoformat()) == pytest.approx(when.timestamp(), abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Retry-After


def test_retry_after_ms_comes_first():
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "2"}, NOW) == 1.5
    assert retry_after_s({"Retry-After-Ms": "garbage", "Retry-After": "2"}, NOW) == 2.0
    assert retry_after_s({"retry-after-ms": "-5", "retry-after": "3"}, NOW) == 3.0


def test_retry_after_seconds_and_http_dates():
    assert retry_after_s({"Retry-After": "120"}, NOW) == 120.0
    assert retry_after_s({"retry-after": "0.25"}, NOW) == 0.25
    in_30_s = "Thu, 21 Aug 2025 12:40:30 GMT"
    assert retry_after_s({"Retry-After": in_30_s}, NOW) == 30.0
    assert retry_after_s({"Retry-After": "Thu, 21 Aug 2025 12:40:30 -0000"}, NOW) == 30.0
    assert retry_after_s({"Retry-After": "Thu, 21 Aug 2025 14:40:30 +0200"}, NOW) == 30.0
    assert retry_after_s({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, NOW) == 0.0  # past


def test_retry_after_is_bounded():
    assert retry_after_s({"retry-after": "99999999"}, NOW) == MAX_RETRY_AFTER_S
    assert retry_after_s({"retry-after-ms": "9" * 60}, NOW) == MAX_RETRY_AFTER_S
    assert retry_after_s({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, NOW) == MAX_RETRY_AFTER_S


@pytest.mark.parametrize(
    "value", ["-5", "1e9", "NaN", "inf", "soon", "٣", "", "2 seconds", "Thu, 99 Aug 2025", "9" * 70]
)
def test_malformed_retry_after_is_none(value):
    assert retry_after_s({"retry-after": value}, NOW) is None
    assert retry_after_s({"retry-after-ms": value}, NOW) is None


def test_no_retry_after_is_none():
    assert retry_after_s({}, NOW) is None
    assert retry_after_s(OPENAI, NOW) is None


@given(
    st.dictionaries(
        st.sampled_from(["retry-after", "Retry-After", "retry-after-ms", "RETRY-AFTER-MS"]),
        st.one_of(
            st.text(max_size=80),
            st.floats().map(str),
            st.integers(-(10**30), 10**30).map(str),
            st.datetimes().map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT")),
        ),
    ),
    st.floats(0, 4e9),
)
def test_retry_after_never_raises_and_is_bounded(headers, now):
    wait = retry_after_s(headers, now)
    assert wait is None or 0.0 <= wait <= MAX_RETRY_AFTER_S


# ---------------------------------------------------------------------------------------------
# Which refusals mean "wait"

_OPENAI_429 = '{"error": {"message": "Rate limit reached for requests", "type": "requests"}}'
_ANTHROPIC_429 = '{"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}'
_ANTHROPIC_529 = '{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
_QUOTA_429 = (
    '{"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}'
)
_SPEND_429 = (
    '{"type": "error", "error": {"type": "rate_limit_error", "message": "limit", '
    '"details": {"error_code": "enforced_spend_limit_reached"}}}'
)


@pytest.mark.parametrize(
    ("status", "body", "retry_after", "kind"),
    [
        (429, _OPENAI_429, 2.0, "rate_limited"),
        (429, _ANTHROPIC_429, None, "rate_limited"),
        (429, None, None, "rate_limited"),
        (429, _QUOTA_429, None, None),  # waiting does not bring the quota back
        (429, _SPEND_429, None, None),
        (529, _ANTHROPIC_529, None, "overloaded"),
        (529, "", None, "overloaded"),
        (500, _ANTHROPIC_529, None, "overloaded"),
        (503, "Service Unavailable", 5.0, "unavailable"),
        (503, "Service Unavailable", 0.0, "unavailable"),
        (503, "Service Unavailable", None, None),
        (500, '{"error": {"type": "api_error"}}', 3.0, None),
        (502, "", 3.0, None),
        (401, '{"error": {"type": "authentication_error"}}', None, None),
        (400, _ANTHROPIC_529, None, None),
        (200, "", None, None),
    ],
)
def test_refusals_that_mean_wait(status, body, retry_after, kind):
    assert rate_limit_kind(status, body, retry_after=retry_after) == kind
    assert is_rate_limited(status, body, retry_after=retry_after) is (kind is not None)


def test_only_the_start_of_a_huge_body_is_read():
    assert rate_limit_kind(429, " " * 70_000 + "insufficient_quota") == "rate_limited"
    assert rate_limit_kind(500, " " * 70_000 + "overloaded_error") is None


@given(
    st.integers(-(10**6), 10**6),
    st.one_of(st.none(), st.text(max_size=200)),
    st.none() | st.floats(),
)
def test_classification_never_raises(status, body, retry_after):
    assert rate_limit_kind(status, body, retry_after=retry_after) in (
        None,
        "rate_limited",
        "overloaded",
        "unavailable",
    )


# ---------------------------------------------------------------------------------------------
# AdaptiveRate


def test_unlearned_rate_is_the_ceiling_or_unlimited():
    assert AdaptiveRate().allowed_rpm is None
    assert AdaptiveRate(ceiling_rpm=500).allowed_rpm == 500
    rate = AdaptiveRate()
    for _ in range(1000):
        rate.on_success()
    assert rate.allowed_rpm is None and not rate.learned and rate.cuts == 0


def test_a_refusal_cuts_from_the_rate_sent_then_successes_add_back():
    rate = AdaptiveRate(decrease=0.5, increase_rpm=60)
    assert rate.on_rate_limited(0.0, sent_rpm=1000) is True
    assert rate.allowed_rpm == 500 and rate.learned and rate.cuts == 1
    for _ in range(500):  # a minute of traffic at 500 rpm adds about 60
        rate.on_success()
    assert rate.allowed_rpm == pytest.approx(560, abs=5)


def test_refusals_within_the_hold_cut_once():
    rate = AdaptiveRate(decrease=0.5, hold_s=2.0)
    rate.on_rate_limited(10.0, sent_rpm=800)
    assert not rate.on_rate_limited(10.5) and not rate.on_rate_limited(11.9)
    assert rate.allowed_rpm == 400 and rate.cuts == 1
    assert rate.on_rate_limited(12.0)
    assert rate.allowed_rpm == 200 and rate.cuts == 2


def test_refusals_of_requests_sent_before_a_cut_cut_nothing_more():
    rate = AdaptiveRate(decrease=0.5, hold_s=60.0)
    rate.on_rate_limited(10.0, sent_rpm=800, sent_at=9.0)
    assert not rate.on_rate_limited(10.2, sent_at=9.9)  # in flight at the old rate
    assert rate.on_rate_limited(10.3, sent_at=10.1)  # sent at the new rate: the hold is moot
    assert rate.allowed_rpm == 200 and rate.cuts == 2


def test_first_refusal_without_a_sent_rate_starts_from_initial():
    rate = AdaptiveRate(initial_rpm=100, decrease=0.5)
    rate.on_rate_limited(0.0)
    assert rate.allowed_rpm == 50
    capped = AdaptiveRate(initial_rpm=100, ceiling_rpm=40, decrease=0.5)
    capped.on_rate_limited(0.0, sent_rpm=10_000)
    assert capped.allowed_rpm == 20


def test_the_rate_never_goes_below_the_floor_or_above_the_ceiling():
    rate = AdaptiveRate(ceiling_rpm=100, floor_rpm=5, hold_s=0)
    for i in range(100):
        rate.on_rate_limited(float(i))
    assert rate.allowed_rpm == 5
    for _ in range(100_000):
        rate.on_success()
    assert rate.allowed_rpm == 100


@pytest.mark.parametrize(
    "kwargs",
    [
        {"floor_rpm": 0},
        {"floor_rpm": float("nan")},
        {"floor_rpm": float("inf")},
        {"ceiling_rpm": 1, "floor_rpm": 2},
        {"ceiling_rpm": float("nan")},
        {"initial_rpm": -1},
        {"initial_rpm": float("inf")},
        {"decrease": 1},
        {"decrease": 0},
        {"increase_rpm": 0},
        {"increase_rpm": float("nan")},
        {"hold_s": -1},
    ],
)
def test_bad_settings_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        AdaptiveRate(**kwargs)


class TokenBucket:
    """A provider allowing ``rpm`` requests per minute with a burst of ``burst``."""

    def __init__(self, rpm: float, burst: float) -> None:
        self.rpm, self.burst, self.tokens, self.at = rpm, burst, burst, 0.0

    def admit(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rpm / 60)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def drive(rate: AdaptiveRate, server: TokenBucket, minutes: float, unlimited_rpm: float):
    """Send requests paced at the allowed rate for ``minutes``: (times, admitted, allowed)."""
    now, log = 0.0, []
    while now < minutes * 60:
        pace = rate.allowed_rpm or unlimited_rpm
        ok = server.admit(now)
        if ok:
            rate.on_success()
        else:
            rate.on_rate_limited(now, sent_rpm=pace, sent_at=now)
        log.append((now, ok, pace))
        now += 60 / pace
    return log


@pytest.mark.parametrize("limit", [60, 600, 1200])
def test_converges_under_a_fixed_limit_with_few_refusals(limit):
    rate = AdaptiveRate()
    log = drive(rate, TokenBucket(limit, burst=limit / 60), minutes=30, unlimited_rpm=20 * limit)
    settled = [(ok, pace) for now, ok, pace in log if now >= 10 * 60]
    refused = sum(not ok for ok, _ in settled) / len(settled)
    admitted_rpm = sum(ok for ok, _ in settled) / 20
    assert refused <= 0.02
    assert sum(not ok for _, ok, _ in log) / len(log) <= 0.05  # the start from unlimited too
    assert 0.75 * limit <= admitted_rpm <= 1.01 * limit
    assert all(0.5 * limit <= pace <= 1.2 * limit for _, pace in settled)


def test_never_exceeds_a_ceiling_below_the_providers_limit():
    rate = AdaptiveRate(ceiling_rpm=300)
    log = drive(rate, TokenBucket(1200, burst=20), minutes=5, unlimited_rpm=10_000)
    assert all(pace == 300 for _, _, pace in log) and rate.cuts == 0


def test_a_ceiling_above_the_providers_limit_still_converges_below_both():
    rate = AdaptiveRate(ceiling_rpm=2000)
    log = drive(rate, TokenBucket(600, burst=10), minutes=20, unlimited_rpm=10_000)
    assert all(pace <= 2000 for _, _, pace in log)
    assert all(300 <= pace <= 720 for now, _, pace in log if now >= 8 * 60)


@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.floats(0, 10),
            st.none() | st.floats(0, 1e9),
            st.none() | st.floats(-10, 10),
        ),
        max_size=300,
    ),
    st.none() | st.floats(1, 1e6),
    st.floats(0.01, 0.99),
)
def test_any_sequence_keeps_the_rate_between_floor_and_ceiling(events, ceiling, decrease):
    rate, now = AdaptiveRate(ceiling_rpm=ceiling, decrease=decrease), 0.0
    for success, step, sent, sent_ago in events:
        now += step
        if success:
            rate.on_success()
        else:
            sent_at = None if sent_ago is None else now - sent_ago
            rate.on_rate_limited(now, sent_rpm=sent, sent_at=sent_at)
        allowed = rate.allowed_rpm
        if allowed is not None:
            assert 1.0 <= allowed and (ceiling is None or allowed <= ceiling)
