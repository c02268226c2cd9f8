"""The simulated server's OpenAI side: endpoints, determinism, loopback only, and `serve_main`
(its Anthropic Messages side is tested in test_anthropic_http.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import httpx
import pytest

from clonefleet.errors import UsageError
from clonefleet.providers import serve_main, start_server

pytestmark = pytest.mark.timeout(30)


async def test_models_endpoint_lists_the_simulated_models(sim):
    _, url = await sim()
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"{url}/models")
    assert resp.status_code == 200
    assert [m["id"] for m in resp.json()["data"]] == ["sim-small", "sim-large"]


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"model": "sim-small"}', b'{"messages": [{"role": "wizard", "content": "x"}]}'],
)
async def test_invalid_chat_requests_get_a_400_json_error(sim, body):
    server, url = await sim()
    async with httpx.AsyncClient() as client:
        resp = await client.post(
            f"{url}/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert server.outcomes["bad request"] == 1


async def test_error_step_sends_status_and_retry_after(sim):
    from clonefleet.providers import SimScript

    _, url = await sim(
        script=SimScript.from_data({"default": [{"error": 503, "retry_after": 1.5}]})
    )
    async with httpx.AsyncClient() as client:
        resp = await client.post(
            f"{url}/chat/completions",
            json={
                "model": "sim-small",
                "messages": [{"role": "user", "content": "x"}],
                "user": "b/0",
            },
        )
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1.5"


async def test_fault_rolls_are_deterministic_per_seed(sim, openai_model, req):
    async def outcomes(seed: int) -> list[str]:
        _, url = await sim(fail_rate=0.3, rate_429=0.2, seed=seed)
        model = openai_model(url)
        seen = []
        for i in range(12):
            try:
                await model.request(req(i % 3))
                seen.append("ok")
            except Exception as exc:  # noqa: BLE001 - recording which error each roll produced
                seen.append(str(getattr(exc, "status", type(exc).__name__)))
        return seen

    first, again, other = await outcomes(7), await outcomes(7), await outcomes(8)
    assert first == again
    assert first != other
    assert {"ok", "503", "429"} <= set(first + other)


async def test_first_request_time_is_kept_per_clone_and_not_moved_by_later_requests(
    sim, openai_model, req
):
    server, url = await sim()
    model = openai_model(url)
    before = time.time()
    await model.request(req(0))
    first = server.first_request_at["batch1/0"]
    await model.request(req(0))
    await model.request(req(1, batch_id="other"))
    assert before <= first <= time.time()
    assert server.first_request_at["batch1/0"] == first
    assert set(server.first_request_at) == {"batch1/0", "other/1"}
    assert server.requests == 3


async def test_requests_without_a_clone_are_not_timed(sim):
    server, url = await sim()
    async with httpx.AsyncClient() as client:
        resp = await client.post(
            f"{url}/chat/completions",
            json={"model": "sim-small", "messages": [{"role": "user", "content": "x"}]},
        )
    assert resp.status_code == 200
    assert server.first_request_at == {}


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com"])
async def test_refuses_to_bind_anything_but_loopback(host):
    with pytest.raises(UsageError, match="loopback"):
        await start_server(host=host)


def test_serve_main_reports_a_bad_script(tmp_path, capsys):
    assert serve_main(0, script=str(tmp_path / "missing.yaml")) == 2
    assert "cannot read simulation script" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_serve_main_serves_until_a_signal_and_stops_cleanly(sig):
    code = (
        "from clonefleet.providers import serve_main; raise SystemExit(serve_main(0, latency_ms=1))"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        async with asyncio.timeout(15):
            line = (await proc.stdout.readline()).decode()
        assert line.startswith(
            "serving simulated provider on http://127.0.0.1:"
        ) and line.rstrip().endswith("/v1")
        url = line.split(" on ", 1)[1].strip()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{url}/models")).status_code == 200
        proc.send_signal(sig)
        async with asyncio.timeout(10):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"authorization": "Bearer wrong"}, 401), ({"authorization": "Bearer right"}, 200)],
)
async def test_a_server_with_an_api_key_refuses_chat_requests_without_it(sim, headers, status):
    server, url = await sim(api_key="right")
    body = {"model": "sim-small", "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{url}/chat/completions", json=body, headers=headers)
    assert resp.status_code == status
    if status == 401:
        assert resp.json()["error"]["code"] == "invalid_api_key"
        assert server.outcomes == {"refused 401": 1}
    else:
        assert server.outcomes == {"ok": 1}
