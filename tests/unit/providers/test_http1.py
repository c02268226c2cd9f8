"""The providers' HTTP/1.1 connection pool against raw loopback servers that answer in every way
HTTP allows (lengths, chunks, close-delimited bodies, interim answers) and in ways it does not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from clonefleet.clone import Candidate, FailoverModel
from clonefleet.errors import AllModelsFailed, ModelBehaviorError, ModelHTTPError, ModelTimeout
from clonefleet.providers import HTTPProvider, ModelRequest, OpenAIModel, _http1
from clonefleet.providers._http1 import Http1Pool, HTTPProtocolError

pytestmark = pytest.mark.timeout(30)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request's head and body, or ``None`` at the end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[str, dict[str, Any]]]]]:
    """``await serve(handler)`` starts a raw server on 127.0.0.1: ``(base_url, stats)``."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> tuple[str, dict[str, Any]]:
        stats: dict[str, Any] = {"connections": 0, "heads": []}

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            stats["connections"] += 1
            try:
                await handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/", stats

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def _answer(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n" + extra
        + b"Content-Length: %d\r\n\r\n" % len(body) + body
    )  # fmt: skip


def _once(reply: bytes, *, hold: bool = False) -> Handler:
    """A server that reads one request and writes ``reply``; with ``hold``, it then keeps the
    connection open, answering nothing more, until the client goes away."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(reply)
        await writer.drain()
        if hold:
            await reader.read()  # b"" once the client closes its end

    return handler


def _keep_answering(reply: Callable[[bytes, bytes], bytes], stats_heads: list[bytes]) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await _read_request(reader)) is not None:
            stats_heads.append(request[0])
            writer.write(reply(*request))
            await writer.drain()

    return handler


async def test_requests_reuse_one_keep_alive_connection_and_send_the_headers(serve):
    heads: list[bytes] = []
    url, stats = await serve(_keep_answering(lambda _h, body: _answer(body), heads))
    pool = Http1Pool(url, {"authorization": "Bearer k", "x-extra": "1"})
    try:
        for i in range(5):
            status, headers, body = await pool.post(b"/v1/chat/completions", b'{"n":%d}' % i)
            assert (status, body) == (200, b'{"n":%d}' % i)
            assert (b"Content-Type", b"application/json") in headers
        assert stats["connections"] == 1
        first = heads[0].decode()
        assert first.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: {url.split('/')[2]}\r\n" in first
        assert "authorization: Bearer k\r\n" in first and "Content-Length: 7\r\n" in first
    finally:
        pool.close()


async def test_chunked_and_close_delimited_bodies_are_read_whole(serve):
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b'{"a"', b':"', b'x"}'):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b'HTTP/1.0 200 OK\r\n\r\n{"b":')
        await writer.drain()
        writer.write(b"1}")
        await writer.drain()

    for handler, expected in ((chunked, b'{"a":"x"}'), (until_close, b'{"b":1}')):
        url, _ = await serve(handler)
        pool = Http1Pool(url, {})
        try:
            assert (await pool.post(b"/v1/x", b"{}"))[2] == expected
        finally:
            pool.close()


async def test_an_interim_answer_is_skipped_and_connection_close_is_honoured(serve):
    heads: list[bytes] = []

    def reply(_head: bytes, body: bytes) -> bytes:
        return b"HTTP/1.1 100 Continue\r\n\r\n" + _answer(body, extra=b"Connection: close\r\n")

    url, stats = await serve(_keep_answering(reply, heads))
    pool = Http1Pool(url, {})
    try:
        assert (await pool.post(b"/v1/x", b"1"))[:1] == (200,)
        assert (await pool.post(b"/v1/x", b"2"))[2] == b"2"
        assert stats["connections"] == 2  # the server said close: not reused
    finally:
        pool.close()


async def test_at_most_max_connections_are_open(serve):
    in_flight, most = 0, 0

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal in_flight, most
        while (request := await _read_request(reader)) is not None:
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            writer.write(_answer(request[1]))
            await writer.drain()

    url, stats = await serve(slow)
    pool = Http1Pool(url, {}, max_connections=3)
    try:
        bodies = await asyncio.gather(*(pool.post(b"/v1/x", b"%d" % i) for i in range(12)))
        assert [b for _, _, b in bodies] == [b"%d" % i for i in range(12)]
        assert most <= 3 and stats["connections"] <= 3
    finally:
        pool.close()


async def test_an_idle_connection_past_the_keep_alive_limit_is_not_reused(serve, monkeypatch):
    heads: list[bytes] = []
    url, stats = await serve(_keep_answering(lambda _h, body: _answer(body), heads))
    pool = Http1Pool(url, {})
    try:
        await pool.post(b"/v1/x", b"1")
        monkeypatch.setattr(_http1, "KEEPALIVE_S", 0.0)
        await pool.post(b"/v1/x", b"2")
        assert stats["connections"] == 2
        assert pool.stats() == {"open": 1, "idle": 1}
    finally:
        pool.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced(serve):
    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        assert request is not None
        writer.write(_answer(request[1]))
        await writer.drain()

    url, stats = await serve(once_then_close)
    pool = Http1Pool(url, {})
    try:
        await pool.post(b"/v1/x", b"1")
        for _ in range(100):  # until the pool has seen the close
            if pool.stats()["open"] == 1 and pool._idle and pool._idle[0].closed:  # noqa: SLF001
                break
            await asyncio.sleep(0.005)
        assert (await pool.post(b"/v1/x", b"2"))[2] == b"2"
        assert stats["connections"] == 2
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"this is not HTTP\r\n\r\n", HTTPProtocolError),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", ConnectionResetError),
        (
            b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * (300 * 1024) + b"\r\n\r\n",
            HTTPProtocolError,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n" + b"a" * 65536,
            HTTPProtocolError,
        ),
    ],
    ids=["garbage", "cut-short", "huge-header", "huge-body"],
)
async def test_broken_or_oversized_answers_fail_cleanly(serve, monkeypatch, reply, error):
    monkeypatch.setattr(_http1, "MAX_BODY", 32 * 1024)
    url, _ = await serve(_once(reply))
    pool = Http1Pool(url, {})
    try:
        with pytest.raises(error):
            await pool.post(b"/v1/x", b"{}")
        assert pool.stats()["open"] == 0  # the broken connection is gone
    finally:
        pool.close()


def test_headers_that_could_split_a_request_are_refused():
    for headers in ({"x-a": "1\r\nX-Injected: 1"}, {"bad:name": "v"}, {"": "v"}):
        with pytest.raises(ValueError, match="header"):
            Http1Pool("http://127.0.0.1:1/v1/", headers)
    with pytest.raises(ValueError, match="http"):
        Http1Pool("ftp://127.0.0.1/", {})


async def test_the_provider_translates_the_pools_failures(serve):
    garbage = _once(b"nonsense\r\n\r\n")
    hang = _once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", hold=True)
    body = b'{"error": {"type": "rate_limit", "message": "slow down"}}'
    status = _once(_answer(body, b"429 Too Many Requests", b"Retry-After: 3\r\n"))

    cases: list[tuple[Handler, type[Exception], str]] = [
        (garbage, ModelBehaviorError, "invalid HTTP response"),
        (hang, ModelTimeout, "no complete response within 0.3s"),
        (status, ModelHTTPError, "slow down"),
    ]
    for handler, error, text in cases:
        url, _ = await serve(handler)
        async with HTTPProvider(name="p", base_url=url, timeout_s=0.3) as provider:
            with pytest.raises(error, match=text) as caught:
                await provider.post_json("chat/completions", {"a": 1})
        if isinstance(caught.value, ModelHTTPError):
            assert caught.value.retry_after_s == 3.0


async def test_a_refused_connection_is_a_timeout_naming_the_provider():
    async with HTTPProvider(name="gone", base_url="http://127.0.0.1:1/v1") as provider:
        with pytest.raises(ModelTimeout, match="provider 'gone'.*cannot reach the server"):
            await provider.post_json("chat/completions", {"a": 1})


async def test_a_body_with_nan_is_refused_and_a_null_is_sent(serve):
    heads: list[bytes] = []
    bodies: list[bytes] = []

    def reply(_head: bytes, body: bytes) -> bytes:
        bodies.append(body)
        return _answer(b'{"ok": true}')

    url, _ = await serve(_keep_answering(reply, heads))
    async with HTTPProvider(name="p", base_url=url) as provider:
        with pytest.raises(ModelBehaviorError, match="cannot be encoded"):
            await provider.post_json("x", {"messages": [{"content": None, "t": float("nan")}]})
        assert await provider.post_json("x", {"content": None, "text": "null"}) == {"ok": True}
    assert bodies == [b'{"content":null,"text":"null"}']


async def test_failover_over_an_http_model_is_bounded_by_the_providers_own_deadline(serve):
    url, _ = await serve(_once(b"", hold=True))
    async with HTTPProvider(name="slow", base_url=url, timeout_s=0.2) as provider:
        model = OpenAIModel(provider)
        assert model.deadline_s == 0.2
        failover = FailoverModel(
            [Candidate(key="m", wire_name="m", model=model, max_retries=0, timeout_s=0.2)]
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(AllModelsFailed, match="provider 'slow'.*within 0.2s"):
            await failover.request(ModelRequest(model="m", messages=()))
        assert loop.time() - began < 2.0
