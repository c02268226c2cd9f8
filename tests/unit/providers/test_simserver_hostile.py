"""The simulated server binds loopback only and keeps answering after malformed requests."""

from __future__ import annotations

import asyncio
import ipaddress
import json

import httpx
import pytest

from clonefleet.providers import SIM_SERVER, start_server

pytestmark = pytest.mark.timeout(30)

GOOD = {"model": "sim-small", "messages": [{"role": "user", "content": "x"}], "user": "b/0"}
ANTHROPIC_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}

BAD_BODIES = [
    b"",
    b"not json",
    b"\xff\xfe\x00garbage",
    b"[1, 2, 3]",
    b"null",
    b'{"messages": "x"}',
    b'{"messages": [{"role": "user", "content": {"a": 1}}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "tools": "x"}',
    b'{"messages": [{"role": "user", "content": "x"}], "tools": [5]}',
    b'{"messages": [{"role": "user", "content": "x"}], "user": 5}',
    b'{"messages": [{"role": "user", "content": "x"}], "user": "b/not-a-number"}',
    b'{"messages": [{"role": "user", "content": "x"}], "metadata": {"user_id": []}}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}',
    b"[" * 100_000 + b"]" * 100_000,
]


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes and read what comes back until the server closes or 2 s pass."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        chunks: list[bytes] = []
        async with asyncio.timeout(2):
            while len(chunks) < 100:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks)
    except TimeoutError:
        return b"".join(chunks)
    finally:
        writer.close()


async def test_the_server_binds_only_loopback():
    runner, port = await start_server()
    try:
        assert runner.addresses
        assert all(ipaddress.ip_address(addr[0]).is_loopback for addr in runner.addresses)
        assert {addr[1] for addr in runner.addresses} == {port}
    finally:
        await runner.cleanup()


async def test_malformed_requests_get_errors_and_the_server_keeps_answering():
    runner, port = await start_server()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for path, headers in (
                ("/chat/completions", {}),
                ("/messages", ANTHROPIC_HEADERS),
            ):
                for body in BAD_BODIES:
                    resp = await client.post(
                        f"{url}{path}",
                        content=body,
                        headers={**headers, "content-type": "application/json"},
                    )
                    # Lenient fields (a numeric `user`) may still be answered; anything else
                    # is an error status, and the server goes on serving either way.
                    assert resp.status_code == 200 or 400 <= resp.status_code < 600
                    if 400 <= resp.status_code < 500:
                        json.loads(resp.content)  # an error in the wire's own JSON shape
            for raw in (
                b"\x00\xff\x16\x03\x01 not http at all\r\n\r\n",
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n{",
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            ):
                answer = await raw_exchange(port, raw)
                assert answer == b"" or answer.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), answer[
                    :80
                ]
            resp = await client.post(f"{url}/chat/completions", json=GOOD)
            assert resp.status_code == 200 and resp.json()["choices"]
            resp = await client.get(f"{url}/models")
            assert resp.status_code == 200
        assert runner.app[SIM_SERVER].outcomes["bad request"] >= 10
    finally:
        await runner.cleanup()
