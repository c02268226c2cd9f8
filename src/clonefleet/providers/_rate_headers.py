"""What a provider says about its rate limits, read from its answers, and a limit learned without it.

Pure functions and one small state machine, with no I/O and no clock of their own (``now`` is
passed in, in seconds since the epoch):

- :func:`read_limits`: the ``x-ratelimit-*`` (OpenAI) or ``anthropic-ratelimit-*`` (Anthropic)
  headers of an answer as one :class:`LimitReport`;
- :func:`retry_after_s`: how long a refused request should wait (``retry-after-ms``, else
  ``Retry-After`` as seconds or an HTTP date);
- :func:`rate_limit_kind` / :func:`is_rate_limited`: whether a refusal means "wait and try
  again" (429, Anthropic's 529 ``overloaded_error``, 503 with ``Retry-After``) rather than a
  failure;
- :class:`AdaptiveRate`: requests per minute learned from 429s alone (additive increase,
  multiplicative decrease) for a provider that sends no limit headers.

Every value read from a header is untrusted: a malformed one is ignored (never raised on), a
huge one is bounded. Nothing here is wired into the providers yet (issue 25 does that).
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from clonefleet.errors import ConfigError

__all__ = [
    "MAX_COUNT",
    "MAX_RESET_S",
    "MAX_RETRY_AFTER_S",
    "AdaptiveRate",
    "LimitReport",
    "LimitWindow",
    "RateLimitKind",
    "is_rate_limited",
    "parse_duration_s",
    "parse_rfc3339",
    "rate_limit_kind",
    "read_limits",
    "retry_after_s",
]

MAX_COUNT: Final = 10**12
"""Largest limit or remaining count kept; a larger one is taken as this."""
MAX_RESET_S: Final = 86_400.0
"""Furthest a window's reset is taken to be from now (a day); a later one is taken as this."""
MAX_RETRY_AFTER_S: Final = 600.0
"""Longest wait a ``Retry-After`` may ask for (ten minutes); a longer one is taken as this."""
_MAX_TEXT: Final = 64
"""Longest header value parsed; a longer one is malformed (no provider sends one)."""
_MAX_BODY: Final = 65_536
"""Characters of an error body looked at when classifying a refusal."""

Wire = Literal["openai", "anthropic"]
RateLimitKind = Literal["rate_limited", "overloaded", "unavailable"]


@dataclass(frozen=True, slots=True)
class LimitWindow:
    """One limit a provider reported: its size, what is left, and when it is whole again.

    ``reset_at`` is absolute (seconds since the epoch), between the ``now`` it was read at and
    :data:`MAX_RESET_S` after it. Any field the provider did not send, or sent malformed, is
    ``None``; ``remaining`` is never above ``limit``.
    """

    limit: int | None
    remaining: int | None
    reset_at: float | None

    def reset_in_s(self, now: float) -> float | None:
        """Seconds from ``now`` until the window resets (``0.0`` if it has), or ``None``."""
        return None if self.reset_at is None else max(self.reset_at - now, 0.0)


@dataclass(frozen=True, slots=True)
class LimitReport:
    """The limits one answer's headers reported, the same shape for both wires.

    ``wire`` says which header family they came from. Each window is ``None`` when the provider
    sent nothing usable for it: OpenAI reports ``requests`` and ``tokens``; Anthropic reports
    those and ``input_tokens`` and ``output_tokens``.
    """

    wire: Wire
    requests: LimitWindow | None = None
    tokens: LimitWindow | None = None
    input_tokens: LimitWindow | None = None
    output_tokens: LimitWindow | None = None

    def windows(self) -> dict[str, LimitWindow]:
        """The windows reported, by name (``requests``, ``tokens``, ``input_tokens``, ...)."""
        named = {
            "requests": self.requests,
            "tokens": self.tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }
        return {name: window for name, window in named.items() if window is not None}

    def exhausted_until(self, now: float) -> float | None:
        """The latest reset among windows with nothing remaining, or ``None`` if none is empty."""
        resets = [
            w.reset_at if w.reset_at is not None else now
            for w in self.windows().values()
            if w.remaining == 0
        ]
        return max(resets) if resets else None


# ---------------------------------------------------------------------------------------------
# Value parsers: each returns None for anything malformed and never raises.

_COUNT = re.compile(r"[0-9]+")
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(h|ms|m|s|us|µs|μs|ns)")
_UNIT_S: Final = {
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ns": 1e-9,
}
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _text(raw: object) -> str | None:
    """A header value as stripped text, or ``None`` if it is not text or is too long."""
    if not isinstance(raw, str) or len(raw) > _MAX_TEXT:
        return None
    return raw.strip()


def _count(raw: object) -> int | None:
    """A non-negative decimal count (ASCII digits only), bounded by :data:`MAX_COUNT`."""
    text = _text(raw)
    if text is None or not _COUNT.fullmatch(text):
        return None
    return min(int(text), MAX_COUNT)  # at most _MAX_TEXT digits: a cheap conversion


def _seconds(text: str) -> float | None:
    """Non-negative decimal seconds (``"2"``, ``"1.5"``, ``".5"``), or ``None``."""
    if not _SECONDS.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def parse_duration_s(raw: object) -> float | None:
    """Seconds in a Go-style duration (``"1s"``, ``"6m0s"``, ``"120ms"``, ``"1h2m3.5s"``).

    A bare number is taken as seconds (some OpenAI-compatible servers send one). Negative,
    empty, unitless-mixed or unknown-unit text is malformed: ``None``. Not bounded here.
    """
    text = _text(raw)
    if not text:
        return None
    plain = _seconds(text)
    if plain is not None:
        return plain
    total, end = 0.0, 0
    for part in _DURATION_PART.finditer(text):
        if part.start() != end:
            return None
        total += float(part.group(1)) * _UNIT_S[part.group(2)]
        end = part.end()
    return total if end == len(text) and math.isfinite(total) else None


def parse_rfc3339(raw: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (``"2025-08-21T12:40:59Z"``), or ``None``.

    Fractions of any length (cut to microseconds) and numeric offsets are accepted; a time
    without an offset is malformed, as is an impossible date. A leap second reads as ``:59``.
    """
    text = _text(raw)
    match = _RFC3339.fullmatch(text) if text else None
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    fraction = match.group(7)
    micros = int((fraction[1:] + "000000")[:6]) if fraction else 0
    zone = match.group(8)
    offset_s = 0
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            return None
        offset_s = sign * (hours * 3600 + minutes * 60)
    try:
        when = datetime(year, month, day, hour, minute, min(second, 59), micros, tzinfo=UTC)
    except ValueError:
        return None
    return when.timestamp() - offset_s


def _bounded_reset(reset_at: float | None, now: float) -> float | None:
    if reset_at is None:
        return None
    return min(max(reset_at, now), now + MAX_RESET_S)


# ---------------------------------------------------------------------------------------------
# Limit headers.

_ANTHROPIC_DIMENSIONS: Final = {
    "requests": "requests",
    "tokens": "tokens",
    "input_tokens": "input-tokens",
    "output_tokens": "output-tokens",
}
_OPENAI_DIMENSIONS: Final = {"requests": "requests", "tokens": "tokens"}


def _window(limit: object, remaining: object, reset_at: float | None) -> LimitWindow | None:
    size, left = _count(limit), _count(remaining)
    if size is not None and left is not None:
        left = min(left, size)
    if size is None and left is None and reset_at is None:
        return None
    return LimitWindow(size, left, reset_at)


def _anthropic_windows(lowered: Mapping[str, str], now: float) -> dict[str, LimitWindow]:
    found = {}
    for field, name in _ANTHROPIC_DIMENSIONS.items():
        prefix = f"anthropic-ratelimit-{name}-"
        reset_at = _bounded_reset(parse_rfc3339(lowered.get(prefix + "reset")), now)
        window = _window(lowered.get(prefix + "limit"), lowered.get(prefix + "remaining"), reset_at)
        if window is not None:
            found[field] = window
    return found


def _openai_windows(lowered: Mapping[str, str], now: float) -> dict[str, LimitWindow]:
    found = {}
    for field, name in _OPENAI_DIMENSIONS.items():
        delay = parse_duration_s(lowered.get(f"x-ratelimit-reset-{name}"))
        reset_at = _bounded_reset(None if delay is None else now + delay, now)
        limit, remaining = (lowered.get(f"x-ratelimit-{k}-{name}") for k in ("limit", "remaining"))
        window = _window(limit, remaining, reset_at)
        if window is not None:
            found[field] = window
    return found


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers with lower-cased names (the first of names that differ only in case wins)."""
    lowered: dict[str, str] = {}
    for key, value in headers.items():
        if isinstance(key, str):
            lowered.setdefault(key.lower(), value)
    return lowered


def read_limits(headers: Mapping[str, str], now: float) -> LimitReport | None:
    """The rate limits an answer's headers report, or ``None`` if they report none usably.

    Reads Anthropic's ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
    {limit,remaining,reset}`` (reset: an RFC 3339 time) and OpenAI's ``x-ratelimit-{limit,
    remaining,reset}-{requests,tokens}`` (reset: a duration from ``now``), names in any case.
    When both families are present (an unusual proxy), a window Anthropic reports wins.
    """
    lowered = _lowered(headers)
    anthropic = _anthropic_windows(lowered, now)
    openai = _openai_windows(lowered, now)
    if not anthropic and not openai:
        return None
    wire: Wire = "anthropic" if anthropic else "openai"
    return LimitReport(wire, **{**openai, **anthropic})


def retry_after_s(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds a refused request should wait, as the answer's headers ask, or ``None``.

    ``retry-after-ms`` (milliseconds) comes first; else ``Retry-After`` as seconds or an HTTP
    date (a past date is ``0.0``). Never negative, at most :data:`MAX_RETRY_AFTER_S`; a
    malformed value counts as absent.
    """
    lowered = _lowered(headers)
    millis = _text(lowered.get("retry-after-ms"))
    seconds = None if millis is None else _seconds(millis)
    if seconds is not None:
        return min(seconds / 1000, MAX_RETRY_AFTER_S)
    text = _text(lowered.get("retry-after"))
    if not text:
        return None
    seconds = _seconds(text)
    if seconds is None:
        seconds = _http_date_delay(text, now)
    return None if seconds is None else min(seconds, MAX_RETRY_AFTER_S)


def _http_date_delay(text: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC with no claim about local time
        when = when.replace(tzinfo=UTC)
    try:
        delay = when.timestamp() - now
    except (OverflowError, ValueError, OSError):
        return None
    return max(delay, 0.0) if math.isfinite(delay) else None


# ---------------------------------------------------------------------------------------------
# Refusals that mean "wait", not "failed".

_SPEND_CAP_MARKERS: Final = (
    "insufficient_quota",
    "exceeded your current quota",
    "billing_hard_limit",
    "enforced_spend_limit_reached",
    "spend limit",
    "spending limit",
    "credit balance",
    "insufficient credits",
    "out of credits",
)


def rate_limit_kind(
    status: int, body: str | None = None, *, retry_after: float | None = None
) -> RateLimitKind | None:
    """Which "wait and try again" refusal an error answer is, or ``None`` if it is a failure.

    ``rate_limited``: HTTP 429, unless its body says a spending cap or quota is used up (waiting
    does not help then). ``overloaded``: HTTP 529 (Anthropic's ``overloaded_error``), or another
    5xx whose body is an ``overloaded_error``. ``unavailable``: HTTP 503 with a ``Retry-After``
    (``retry_after`` as :func:`retry_after_s` read it). Only the body's first
    ``_MAX_BODY`` characters are looked at.
    """
    text = body[:_MAX_BODY].lower() if isinstance(body, str) else ""
    if status == 429:
        return None if any(m in text for m in _SPEND_CAP_MARKERS) else "rate_limited"
    if status == 529 or (500 <= status < 600 and "overloaded_error" in text):
        return "overloaded"
    if status == 503 and retry_after is not None:
        return "unavailable"
    return None


def is_rate_limited(
    status: int, body: str | None = None, *, retry_after: float | None = None
) -> bool:
    """Whether an error answer means "wait and try again" (see :func:`rate_limit_kind`)."""
    return rate_limit_kind(status, body, retry_after=retry_after) is not None


# ---------------------------------------------------------------------------------------------
# A limit learned from 429s alone.


class AdaptiveRate:
    """Requests per minute a provider allows, learned from its refusals (AIMD).

    For a provider that sends no limit headers. Until its first refusal the rate is unknown and
    :attr:`allowed_rpm` is the ceiling (``None`` with no ceiling: no throttling, so a patient
    provider is as fast as before). A refusal cuts the rate by ``decrease`` (from the rate in
    force, else the rate the caller was sending, else ``initial_rpm``); refusals of requests sent
    before a cut (or, when the caller does not say when, within ``hold_s`` of it) answer the old
    rate and cut nothing more. Each success adds ``increase_rpm / allowed_rpm``, so the rate
    grows by ``increase_rpm`` per minute of traffic at the allowed rate (``None``: a tenth of the
    rate at the last cut, at least 1). The rate stays between ``floor_rpm`` and ``ceiling_rpm``
    (a configured limit is never exceeded). Not thread-safe; ``now`` and ``sent_at`` are seconds
    on one clock of the caller's (a monotonic one will do).
    """

    __slots__ = (
        "_allowed",
        "_ceiling",
        "_cut_at",
        "_decrease",
        "_floor",
        "_hold_s",
        "_increase",
        "_initial",
        "_peak",
        "cuts",
    )

    def __init__(
        self,
        *,
        ceiling_rpm: float | None = None,
        initial_rpm: float = 60.0,
        floor_rpm: float = 1.0,
        decrease: float = 0.75,
        increase_rpm: float | None = None,
        hold_s: float = 1.0,
    ) -> None:
        _check(0 < floor_rpm < math.inf, "floor_rpm must be above 0 and finite", "floor_rpm")
        _check(
            ceiling_rpm is None or ceiling_rpm >= floor_rpm, "ceiling below floor", "ceiling_rpm"
        )
        _check(0 < initial_rpm < math.inf, "initial_rpm must be above 0 and finite", "initial_rpm")
        _check(0 < decrease < 1, "decrease must be between 0 and 1", "decrease")
        _check(
            increase_rpm is None or increase_rpm > 0, "increase_rpm must be above 0", "increase_rpm"
        )
        _check(hold_s >= 0, "hold_s must not be negative", "hold_s")
        self._ceiling, self._initial, self._floor = ceiling_rpm, initial_rpm, floor_rpm
        self._decrease, self._increase, self._hold_s = decrease, increase_rpm, hold_s
        self._allowed: float | None = None
        self._peak = initial_rpm
        self._cut_at = -math.inf
        self.cuts = 0
        """Refusals that cut the rate (refusals within ``hold_s`` of a cut are not counted)."""

    @property
    def allowed_rpm(self) -> float | None:
        """Requests per minute to send now; ``None`` when nothing limits them yet."""
        return self._allowed if self._allowed is not None else self._ceiling

    @property
    def learned(self) -> bool:
        """Whether a refusal has set the rate (otherwise it is the ceiling, or unlimited)."""
        return self._allowed is not None

    def on_success(self) -> None:
        """A request was answered: the rate grows additively (never above the ceiling)."""
        if self._allowed is None:
            return
        step = self._increase if self._increase is not None else max(self._peak / 10, 1.0)
        self._allowed = self._bound(self._allowed + step / self._allowed)

    def on_rate_limited(
        self, now: float, sent_rpm: float | None = None, sent_at: float | None = None
    ) -> bool:
        """A request was refused for its rate: cut the rate, unless it answers an earlier rate.

        ``sent_rpm`` is the rate the caller was sending (used when no rate was learned yet).
        ``sent_at`` is when the refused request was sent: one sent before the last cut was
        sent at the old rate and cuts nothing more. Without it, refusals within ``hold_s`` of
        the last cut cut nothing more. Returns whether the rate was cut.
        """
        if sent_at is not None and sent_at < self._cut_at:
            return False
        if sent_at is None and now < self._cut_at + self._hold_s:
            return False
        if self._allowed is not None:
            base = self._allowed
        elif sent_rpm is not None and math.isfinite(sent_rpm) and sent_rpm > 0:
            base = sent_rpm if self._ceiling is None else min(sent_rpm, self._ceiling)
        else:
            base = self._initial if self._ceiling is None else min(self._initial, self._ceiling)
        self._peak = base
        self._allowed = self._bound(base * self._decrease)
        self._cut_at = now
        self.cuts += 1
        return True

    def _bound(self, rpm: float) -> float:
        rpm = max(rpm, self._floor)
        return rpm if self._ceiling is None else min(rpm, self._ceiling)

    def __repr__(self) -> str:
        return f"AdaptiveRate(allowed_rpm={self.allowed_rpm!r}, cuts={self.cuts})"


def _check(ok: bool, message: str, key: str) -> None:
    if not ok:
        raise ConfigError(message, key=key)
