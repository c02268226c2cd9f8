"""A canary API key through a whole clone run whose providers fail and echo the key back: the key
never reaches events, the result record, its pickle, errors, or the logs."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle

import pytest
from aiohttp import web

from clonefleet.config import Config
from clonefleet.host import HostCore
from clonefleet.providers import set_live_requests_allowed
from clonefleet.testing import make_spec
from clonefleet.vocab import EventType

pytestmark = pytest.mark.timeout(30)
CANARY = "sk-canary-0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a"
ENV = "CLONEFLEET_RUN_CANARY"
LEAKS = (CANARY, CANARY[:12], CANARY[-6:])


async def _echo_401(request: web.Request) -> web.Response:
    key = request.headers.get("authorization", "")
    body = {
        "error": {
            "message": f"Incorrect API key provided: {key} ({CANARY[:12]}...{CANARY[-6:]})",
            "type": "invalid_api_key",
        }
    }
    return web.json_response(body, status=401)


async def _echo_503(request: web.Request) -> web.Response:
    key = request.headers.get("authorization", "")
    page = f"<html><head><title>503 {key}</title></head><body>upstream rejected {key}</body></html>"
    return web.Response(
        status=503, text=page, content_type="text/html", headers={"Retry-After": "0"}
    )


@pytest.fixture
async def echo_server():
    app = web.Application()
    app.router.add_post("/a/v1/chat/completions", _echo_401)
    app.router.add_post("/b/v1/chat/completions", _echo_503)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_canary_key_stays_out_of_a_failing_run(echo_server, monkeypatch, caplog):
    monkeypatch.setenv(ENV, CANARY)
    caplog.set_level(logging.DEBUG)
    previous = set_live_requests_allowed(False)
    config = Config(
        providers={
            "a": {"kind": "openai", "base_url": f"{echo_server}/a/v1", "api_key_env": ENV},
            "b": {
                "kind": "openai",
                "base_url": f"{echo_server}/b/v1",
                "api_key_env": ENV,
                "max_retries": 1,
            },
        },
        models={"ma": {"provider": "a", "name": "m"}, "mb": {"provider": "b", "name": "m"}},
        # A 503 with Retry-After waits for capacity: bounded here, it then fails.
        admission={"max_wait_s": 1.0},
    )
    host = HostCore()
    try:
        host.start([make_spec(candidates=("ma", "mb"))], config)
        events: list[dict] = []
        async with asyncio.timeout(20):
            while not any(e["event"]["type"] == EventType.FINAL for e in events):
                events += await host.drain(wait_s=1.0)
    finally:
        await host.aclose()
        set_live_requests_allowed(previous)
    record = next(e["event"]["result"] for e in events if e["event"]["type"] == EventType.FINAL)
    assert record["status"] == "failed" and record["error"] == "Error: subagent run failed"
    failover = [e["event"] for e in events if e["event"]["type"] == "model_failover"]
    assert [(f["from"], f["to"]) for f in failover] == [("ma", "mb")] and "401" in failover[0][
        "reason"
    ]
    detail = next(e["event"]["detail"] for e in events if e["event"]["type"] == "error")
    assert (
        "ma: HTTP 401" in detail and "mb: HTTP 503" in detail and "[redacted]" in detail
    )  # the echo was there
    texts = [
        json.dumps(events, default=str),
        json.dumps(record),
        pickle.dumps(events).decode("latin-1"),
        caplog.text,
    ]
    for text in texts:
        for leak in LEAKS:
            assert leak not in text
