"""The simulated server's rate limits over 127.0.0.1: 429s in each wire's shape with its limit
headers, the headers on success, `--no-limit-headers`, no change without limits, and the
`provider serve` options. The limiter runs on a fake clock: no test waits for a bucket."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest

from clonefleet.cli.program import build_parser
from clonefleet.providers import serve_main

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


async def _limited(sim: Any, **limits: Any) -> tuple[Any, str, FakeClock]:
    server, url = await sim(**limits)
    clock = FakeClock()
    if server.limiter is not None:
        server.limiter.clock = clock
    return server, url, clock


def _chat(clone: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-small",
        "messages": [{"role": "user", "content": "two words"}],
        "user": f"b/{clone}",
        **extra,
    }


def _message(clone: int) -> dict[str, Any]:
    return {
        "model": "sim-small",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "two words"}],
        "metadata": {"user_id": f"b/{clone}"},
    }


_ANTHROPIC_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


async def _post_chat(url: str, n: int, **extra: Any) -> list[httpx.Response]:
    async with httpx.AsyncClient() as client:
        return [
            await client.post(f"{url}/chat/completions", json=_chat(i, **extra)) for i in range(n)
        ]


async def _post_messages(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient() as client:
        return [
            await client.post(f"{url}/messages", json=_message(i), headers=_ANTHROPIC_HEADERS)
            for i in range(n)
        ]


async def test_openai_wire_answers_429_past_the_request_limit_with_its_headers(sim):
    server, url, _ = await _limited(sim, rpm=60, burst=2)
    first, second, third = await _post_chat(url, 3)
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
    assert third.json()["error"]["type"] == "requests"
    assert third.json()["error"]["code"] == "rate_limit_exceeded"
    assert "requests per min (RPM): Limit 60" in third.json()["error"]["message"]
    h = third.headers
    assert h["x-ratelimit-limit-requests"] == "60"
    assert h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"] == "2s"
    assert h["retry-after"] == "1" and h["retry-after-ms"] == "1000"
    assert "x-ratelimit-limit-tokens" not in h
    assert server.outcomes == {"ok": 2, "rate limited 429": 1}


async def test_openai_wire_sends_the_limit_headers_on_success(sim):
    _, url, _ = await _limited(sim, rpm=600, tpm=60_000, burst=10)
    (ok,) = await _post_chat(url, 1, max_tokens=98)
    assert ok.status_code == 200
    assert ok.headers["x-ratelimit-limit-requests"] == "600"
    assert ok.headers["x-ratelimit-remaining-requests"] == "9"
    assert ok.headers["x-ratelimit-reset-requests"] == "100ms"
    assert ok.headers["x-ratelimit-limit-tokens"] == "60000"
    assert ok.headers["x-ratelimit-remaining-tokens"] == "900"  # 1000 held, 2 words + 98
    assert ok.headers["x-ratelimit-reset-tokens"] == "100ms"
    assert "retry-after" not in ok.headers and "retry-after-ms" not in ok.headers


async def test_openai_wire_refuses_on_tokens_when_tpm_binds_first(sim):
    _, url, clock = await _limited(sim, rpm=600, tpm=6000, burst=10)
    answers = await _post_chat(url, 4, max_tokens=48)  # 50 tokens each; the bucket holds 100
    assert [r.status_code for r in answers] == [200, 200, 429, 429]
    refused = answers[2]
    assert refused.json()["error"]["type"] == "tokens"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    assert refused.headers["x-ratelimit-remaining-requests"] == "8"
    assert refused.headers["retry-after-ms"] == "500"
    clock.now += 0.5
    (again,) = await _post_chat(url, 1, max_tokens=48)
    assert again.status_code == 200


async def test_anthropic_wire_answers_429_with_its_error_and_headers(sim):
    server, url, _ = await _limited(sim, rpm=60, tpm=60_000, burst=1)
    ok, refused = await _post_messages(url, 2)
    assert (ok.status_code, refused.status_code) == (200, 429)
    body = refused.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "60 requests per minute" in body["error"]["message"]
    h = refused.headers
    assert h["anthropic-ratelimit-requests-limit"] == "60"
    assert h["anthropic-ratelimit-requests-remaining"] == "0"
    for kind in ("tokens", "input-tokens", "output-tokens"):
        assert h[f"anthropic-ratelimit-{kind}-limit"] == "60000"
        assert h[f"anthropic-ratelimit-{kind}-remaining"] == "898"  # 1000 held, 102 spent
        assert h[f"anthropic-ratelimit-{kind}-reset"].endswith("Z")
    reset = datetime.fromisoformat(h["anthropic-ratelimit-requests-reset"])
    assert reset.tzinfo is not None
    assert h["retry-after"] == "1"
    assert "retry-after-ms" not in h and "x-ratelimit-limit-requests" not in h
    assert ok.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert "retry-after" not in ok.headers
    assert server.outcomes["rate limited 429"] == 1


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_no_limit_headers_sends_only_status_and_body(sim, wire):
    _, url, _ = await _limited(sim, rpm=60, tpm=1000, burst=1, limit_headers=False)
    post = _post_chat if wire == "openai" else _post_messages
    ok, refused = await post(url, 2)
    assert (ok.status_code, refused.status_code) == (200, 429)
    for answer in (ok, refused):
        names = {k.lower() for k in answer.headers}
        assert not {n for n in names if "ratelimit" in n or n.startswith("retry-after")}
    assert refused.json()


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_nothing_changes_when_no_limit_is_set(sim, wire):
    server, url = await sim()
    assert server.limiter is None
    post = _post_chat if wire == "openai" else _post_messages
    answers = await post(url, 30)
    assert all(r.status_code == 200 for r in answers)
    for answer in answers:
        assert not [k for k in answer.headers if "ratelimit" in k.lower()]
    assert server.outcomes == {"ok": 30}


async def test_the_random_429_option_is_unchanged_by_limits(sim):
    _, url, _ = await _limited(sim, rate_429=1.0)
    (answer,) = await _post_chat(url, 1)
    assert answer.status_code == 429 and answer.headers["retry-after"] == "0"
    assert answer.json()["error"]["type"] == "rate_limit_exceeded"


def test_provider_serve_takes_the_limit_options():
    parser = build_parser()
    args = parser.parse_args(
        ["provider", "serve", "--port", "0", "--rpm", "1200", "--tpm", "90000", "--burst", "5"]
    )
    assert (args.rpm, args.tpm, args.burst, args.limit_headers) == (1200, 90000, 5, True)
    args = parser.parse_args(["provider", "serve", "--port", "0", "--no-limit-headers"])
    assert (args.rpm, args.tpm, args.burst, args.limit_headers) == (None, None, None, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["provider", "serve", "--port", "0", "--rpm", "0"])


def test_provider_serve_help_names_the_limit_options(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["provider", "serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--rpm", "--tpm", "--burst", "--no-limit-headers"):
        assert flag in out


def test_burst_without_rpm_is_a_usage_error(capsys):
    assert serve_main(port=0, burst=3) == 2
    assert "burst needs rpm" in capsys.readouterr().err
