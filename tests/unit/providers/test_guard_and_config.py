"""``Retry-After`` parsing, the live-request guard, building providers from config, and lifecycle."""

from __future__ import annotations

import email.utils

import httpx
import pytest

from clonefleet.config import ProviderConfig
from clonefleet.errors import ConfigError, UsageError
from clonefleet.providers import (
    BLOCK_LIVE_ENV,
    Message,
    ModelRequest,
    Role,
    build_provider,
    ensure_live_requests_allowed,
    live_requests_allowed,
    retry_after_s,
    set_live_requests_allowed,
)

pytestmark = pytest.mark.timeout(20)
NOW = 1_700_000_000.0


def http_date(offset_s: float) -> str:
    return email.utils.formatdate(NOW + offset_s, usegmt=True)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"Retry-After": "0"}, 0.0),
        ({"Retry-After": "-3"}, None),  # not a delay: the caller's own backoff applies
        ({"Retry-After": " 4 "}, 4.0),
        ({"Retry-After": http_date(10)}, 10.0),
        ({"Retry-After": http_date(-30)}, 0.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": ""}, None),
        ({}, None),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
    ],
    ids=[
        "int",
        "float",
        "zero",
        "negative",
        "spaces",
        "date-ahead",
        "date-past",
        "word",
        "nan",
        "empty",
        "absent",
        "ms-wins",
        "bad-ms",
    ],
)
def test_retry_after(headers, expected):
    assert retry_after_s(headers, NOW) == expected


def test_retry_after_reads_httpx_headers_case_insensitively():
    assert retry_after_s(httpx.Headers({"RETRY-AFTER": "3"}), NOW) == 3.0


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1",
        "http://localhost/v1",
        "http://127.3.4.5:1/",
        "http://[::1]:8000/v1",
    ],
)
def test_loopback_is_allowed_while_live_requests_are_blocked(url):
    assert not live_requests_allowed()  # the provider tests' conftest blocks them
    ensure_live_requests_allowed(url)


@pytest.mark.parametrize(
    "url",
    ["https://api.openai.com/v1", "http://10.0.0.5:8000/v1", "http://localhost.example.com/v1"],
)
def test_other_hosts_are_refused_while_live_requests_are_blocked(url):
    with pytest.raises(UsageError, match="live model request"):
        ensure_live_requests_allowed(url)


def test_block_live_environment_variable(monkeypatch):
    previous = set_live_requests_allowed(None)
    try:
        monkeypatch.setenv(BLOCK_LIVE_ENV, "1")
        assert not live_requests_allowed()
        monkeypatch.delenv(BLOCK_LIVE_ENV)
        assert live_requests_allowed()
        ensure_live_requests_allowed("https://api.openai.com/v1")
    finally:
        set_live_requests_allowed(previous)


async def test_blocked_provider_never_touches_the_network():
    seen: list[httpx.Request] = []
    model, aclose = build_provider(
        "remote",
        ProviderConfig(kind="openai", base_url="https://api.openai.com/v1"),
        transport=httpx.MockTransport(lambda r: seen.append(r)),
    )
    try:
        with pytest.raises(UsageError):
            await model.request(
                ModelRequest(model="m", messages=(Message(role=Role.USER, content="x"),))
            )
    finally:
        await aclose()
    assert seen == []


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        (ProviderConfig(kind="openai", base_url="ftp://127.0.0.1/v1"), "providers.p.base_url"),
        (ProviderConfig(kind="openai", base_url="not a url"), "providers.p.base_url"),
        (ProviderConfig(kind="simulated"), "providers.p.kind"),
        (
            ProviderConfig(
                kind="openai", base_url="http://127.0.0.1/v1", api_key_env="CF_EMPTY_KEY"
            ),
            "providers.p.api_key_env",
        ),
        (ProviderConfig(kind="anthropic"), "providers.p.api_key_env"),
    ],
    ids=["scheme", "no-host", "simulated", "empty-key", "anthropic-default-variable"],
)
def test_bad_provider_entries_are_config_errors(monkeypatch, cfg, key):
    monkeypatch.setenv("CF_EMPTY_KEY", "  ")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        build_provider("p", cfg, config_path="cf.yaml")
    assert (info.value.key, info.value.path) == (key, "cf.yaml")
    if key.endswith("api_key_env"):
        assert ("CF_EMPTY_KEY" if cfg.api_key_env else "ANTHROPIC_API_KEY") in str(info.value)


async def test_closed_provider_refuses_requests_and_closing_twice_is_harmless():
    model, aclose = build_provider(
        "p", ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1")
    )
    await aclose()
    await aclose()
    with pytest.raises(UsageError, match="closed"):
        await model.request(
            ModelRequest(model="m", messages=(Message(role=Role.USER, content="x"),))
        )


async def test_provider_is_an_async_context_manager():
    model, _ = build_provider("p", ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1"))
    async with model.provider as provider:
        assert not provider.is_closed
    assert provider.is_closed
