"""A lean HTTP/1.1 client for the providers' one kind of request: POST a JSON body, read the answer.

It keeps one pool of keep-alive connections per provider, writes a request as one pre-encoded
head plus the body and parses answers with ``httptools``; chunked and read-until-close bodies,
``https`` and ``1xx`` interim answers work, and redirects, cookies, proxies and compression do
not (docs/benchmarks.md, "HTTP clients"). Failures are plain exceptions for the provider to
translate: ``OSError`` (cannot connect, or the connection was lost before the whole answer
arrived) and :class:`HTTPProtocolError` (not HTTP, or an answer larger than the caps). The caller
bounds each request in time; a cancelled request closes its connection.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import httptools

from clonefleet.providers._slots import Slots

__all__ = ["HTTPProtocolError", "Http1Pool"]

MAX_BODY = 64 * 1024 * 1024
"""Largest answer body read, in bytes (a chat answer is kilobytes)."""
MAX_HEADER_BYTES = 256 * 1024
"""Largest total size of an answer's header lines, in bytes."""
KEEPALIVE_S = 4.0
"""An idle connection older than this is closed instead of reused: uvicorn (vLLM, many proxies)
closes idle connections after 5 s, and a request sent on one the server is closing fails."""
_DNS_TTL_S = 60.0


class HTTPProtocolError(Exception):
    """The server's answer is not valid HTTP/1.1, or is larger than the caps."""


Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
"""Status, header lines (name, value) as sent, and the whole body."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Answer] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.chunks: list[bytes] = []
        self.body_bytes = 0
        self.length_known = False
        self.headers_done = False
        self.keep_alive = True
        self.closed = False
        self.idle_since = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self._abort()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPProtocolError(f"invalid HTTP response ({exc})"))
        except HTTPProtocolError as exc:  # raised by a callback over a cap
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.headers_done and not self.length_known:
            self._complete()  # a body without length or chunking ends when the connection does
            return
        reason = f": {exc}" if exc else ""
        waiter.set_exception(ConnectionResetError(f"the server closed the connection{reason}"))

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.headers, self.header_bytes, self.chunks, self.body_bytes = [], 0, [], 0
        self.length_known = self.headers_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > MAX_HEADER_BYTES:
            raise HTTPProtocolError(f"response headers larger than {MAX_HEADER_BYTES} bytes")
        self.headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length" or (
            lowered == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self.length_known = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > MAX_BODY:
            raise HTTPProtocolError(f"response body larger than {MAX_BODY} bytes")
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self.parser.get_status_code() < 200:
            return  # an interim answer (100 Continue): the real one follows
        self._complete()

    # -- helpers -------------------------------------------------------------------------------

    def _complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
            waiter.set_result((self.parser.get_status_code(), self.headers, body))
        self.chunks = []

    def _fail(self, exc: Exception) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self._abort()

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Http1Pool:
    """Keep-alive connections to one origin, at most ``max_connections`` open.

    Args:
        base_url: the origin and path prefix (``http://host:port/v1/`` or ``https://...``).
        headers: headers of every request (the credential among them); they are encoded once
            into the request head and never shown by ``repr``.
        max_connections: connections open at once; further requests wait for one.
    """

    def __init__(
        self, base_url: str, headers: Mapping[str, str], *, max_connections: int = 1000
    ) -> None:
        import httpx  # URL parsing only

        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.host
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._tls = url.scheme == "https"
        default_port = self.port == (443 if self._tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = host if default_port else f"{host}:{self.port}"
        lines = [f"Host: {authority}"]
        for name, value in headers.items():
            if any(c in f"{name}{value}" for c in "\r\n\0") or not name or ":" in name:
                raise ValueError(f"header {name!r} has a character a header cannot hold")
            lines.append(f"{name}: {value}")
        self._head_lines = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._heads: dict[bytes, bytes] = {}
        self._slots = Slots(max_connections)
        self._idle: collections.deque[_Connection] = collections.deque()
        self._open: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._addrs: tuple[list[str], float] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"Http1Pool(host={self.host!r}, port={self.port}, open={len(self._open)})"

    async def post(self, target: bytes, body: bytes | Callable[[], bytes]) -> Answer:
        """POST ``body`` to ``target`` (the path and query, as bytes) and read the whole answer.

        ``body`` may be a function that makes it: it is called once a connection slot is free
        (whatever it raises, ``post`` raises), and the body is dropped once written. Requests
        beyond ``max_connections`` then wait without a body each (thousands, at 8 KB apiece).

        Raises:
            OSError: cannot connect, or the connection was lost before the whole answer.
            HTTPProtocolError: the answer is not HTTP, or larger than the caps.
        """
        head = self._heads.get(target)
        if head is None:
            head = self._heads[target] = (
                b"POST " + target + b" HTTP/1.1\r\n" + self._head_lines + b"Content-Length: "
            )
        async with self._slots:
            data = body() if callable(body) else body
            del body
            conn = await self._acquire()
            done = False
            try:
                assert conn.transport is not None
                waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
                conn.waiter = waiter
                conn.transport.writelines((head, b"%d\r\n\r\n" % len(data), data))
                del data
                answer = await waiter
                done = True
            finally:
                self._release(conn, reuse=done)
            return answer

    async def _acquire(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE_S:
                return conn
            self._drop(conn)
        if self._closed:
            raise ConnectionAbortedError("the provider's connections are closed")
        loop = asyncio.get_running_loop()
        ssl_context = self._context()
        server_hostname = self.host if ssl_context is not None else None
        error: OSError | None = None
        for address in await self._addresses(loop):
            try:
                _, conn = await loop.create_connection(
                    _Connection,
                    address,
                    self.port,
                    ssl=ssl_context,
                    server_hostname=server_hostname,
                )
            except OSError as exc:
                error = exc
                continue
            self._open.add(conn)
            return conn
        self._addrs = None  # look the name up again next time
        raise error or OSError(f"cannot connect to {self.host!r}")

    def _release(self, conn: _Connection, *, reuse: bool) -> None:
        conn.waiter = None
        if reuse and conn.keep_alive and not conn.closed and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self._open.discard(conn)
        conn._abort()  # noqa: SLF001 - the pool owns its connections

    async def _addresses(self, loop: asyncio.AbstractEventLoop) -> list[str]:
        """The host's addresses, looked up once a minute rather than per connection."""
        cached = self._addrs
        if cached is not None and time.monotonic() - cached[1] < _DNS_TTL_S:
            return cached[0]
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise OSError(f"cannot resolve {self.host!r}")
        self._addrs = (addresses, time.monotonic())
        return addresses

    def _context(self) -> ssl.SSLContext | None:
        if self._tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def close(self) -> None:
        """Close every connection; requests in flight fail with ``OSError``."""
        self._closed = True
        for conn in list(self._open):
            self._drop(conn)
        self._idle.clear()

    def stats(self) -> dict[str, Any]:
        """Connections open and idle (for tests and diagnostics)."""
        return {"open": len(self._open), "idle": len(self._idle)}
