"""One MCP server as a clone host sees it: started on first need, shared by every clone of the
host, restarted after it failed or died (a bounded number of times, with backoff), closed with
the host.

An owner task per start enters the SDK's transport and :class:`ClientSession` (anyio context
managers, so one task must enter and leave them) and waits; clones send their requests on the
shared session from their own tasks. Every request is bounded in time, and every failure (the
server cannot start, stops answering, dies, or refuses a request) reaches the clone as a
:class:`~clonefleet.errors.ToolRetry` text naming the server. Grants and tool naming live in
``_manager``; this module knows nothing of clones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import StrEnum
from typing import Any, TextIO, TypeVar

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mt
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from clonefleet.config import McpServerConfig, printable
from clonefleet.errors import ToolRetry

__all__ = ["McpServer", "ServerState"]

T = TypeVar("T")

_MAX_PAGES = 20
"""Pages of a listing read at most (a server that pages forever cannot hang a start)."""
_MAX_TOOLS = 1000
"""Tools of one server kept at most."""
_PROBE_S = 5.0
"""Longest the ping after a timed-out call may take before the server counts as hung."""
_CLOSE_S = 10.0
"""Longest closing one server may take (the SDK kills a stdio server's process group)."""
_STDERR_KEPT = 4096
"""Bytes of a stdio server's latest stderr kept, to explain why it failed."""
_GONE = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
"""What a request on a session whose streams are gone raises."""


class ServerState(StrEnum):
    """Where a server is in its life on this host."""

    IDLE = "idle"
    """Never needed yet."""
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    """Failed to start or died; the next need restarts it (backoff and restarts allowing)."""
    CLOSED = "closed"
    """Its host closed; never started again."""


class _StderrTail(asyncio.Protocol):
    """Keeps the last bytes a stdio server wrote to stderr."""

    def __init__(self) -> None:
        self.data = bytearray()

    def data_received(self, data: bytes) -> None:
        self.data += data
        del self.data[:-_STDERR_KEPT]

    def text(self, limit: int = 600) -> str:
        tail = printable(self.data.decode("utf-8", "replace").strip())
        return tail[-limit:]


def _pipe() -> tuple[Any, TextIO]:
    read_fd, write_fd = os.pipe()
    return os.fdopen(read_fd, "rb", buffering=0), os.fdopen(write_fd, "w")


def _describe(exc: BaseException, stderr: str) -> str:
    """One line on why a start or a connection failed (the first leaf of a group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        text = f"cannot run {exc.filename or 'the command'!s}: no such file"
    elif isinstance(exc, OSError):
        text = f"cannot run the command: {exc.strerror or exc}"
    elif isinstance(exc, MCPError):
        text = f"{exc.message} (MCP error {exc.code})"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = printable(text)[:500]
    return f"{text}; its stderr ends: {stderr}" if stderr else text


class McpServer:
    """One MCP server of a clone host, shared by all its clones.

    Args:
        name: the server's name (``mcp__<name>__<tool>``).
        config: how to reach it, and its time limits.
        clock: monotonic clock of the restart backoff, injected for tests.
        backoff_s: wait before the second restart in a row; it doubles per failure after that
            (the first restart after a good run is immediate), up to ``max_backoff_s``.
    """

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.name, self.config = name, config
        self.state = ServerState.IDLE
        self.starts = 0
        """Starts attempted on this host (the first one and every restart)."""
        self.error = ""
        """Why it last failed."""
        self.tools: tuple[mt.Tool, ...] = ()
        """Its tools as last listed; kept while it is down, so grants can still name them."""
        self.has_resources = False
        self.listing = 0
        """Bumped on each new tool listing, so derived tables know when to rebuild."""
        self._clock, self._backoff_s, self._max_backoff_s = clock, backoff_s, max_backoff_s
        self._failures = 0
        self._retry_at = 0.0
        self._suspect = False
        self._generation = 0
        self._session: ClientSession | None = None
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._deadline = 0.0
        self._owner: asyncio.Task[None] | None = None
        self._owners: set[asyncio.Task[None]] = set()
        """Owner tasks still running, the current one and those still shutting down."""

    @property
    def ready(self) -> bool:
        """Whether it is running and answered its handshake."""
        return self.state is ServerState.READY

    # -- requests -----------------------------------------------------------------------------
    async def request(self, what: str, fn: Callable[[ClientSession], Awaitable[T]]) -> T:
        """Run one request on the live session, starting the server first when needed.

        The start is bounded by ``startup_timeout_s`` and the request by ``timeout_s``.

        Raises:
            ToolRetry: the server is unavailable, timed out, died, or refused the request.
        """
        session = await self.session()
        generation = self._generation
        try:
            async with asyncio.timeout(self.config.timeout_s):
                return await fn(session)
        except TimeoutError:
            self._suspect = True  # the next request checks that it still answers at all
            raise ToolRetry(
                f"MCP server {self.name!r} did not answer {what} within "
                f"{self.config.timeout_s:g}s; the call was abandoned"
            ) from None
        except MCPError as exc:
            if exc.code != mt.CONNECTION_CLOSED:
                raise ToolRetry(f"MCP server {self.name!r} refused {what}: {exc.message}") from None
            self._failed(generation, "it closed the connection")
        except _GONE as exc:
            self._failed(generation, f"its connection broke ({type(exc).__name__})")
        except Exception as exc:  # an answer the SDK could not use, or a broken transport
            if generation == self._generation and self.state is ServerState.READY:
                raise ToolRetry(
                    f"MCP server {self.name!r} answered {what} unusably: {_describe(exc, '')}"
                ) from None
        raise ToolRetry(self.unavailable())

    async def session(self) -> ClientSession:
        """The live session; starts (or restarts) the server when it is not running.

        Raises:
            ToolRetry: it cannot be started now, or its start failed.
        """
        if self.state is ServerState.READY and self._suspect:
            await self._probe()
        if self.state in (ServerState.IDLE, ServerState.FAILED, ServerState.CLOSED):
            self._start()
        if self.state is ServerState.STARTING:
            await self._wait_started(self._generation)
        if self.state is ServerState.READY and self._session is not None:
            return self._session
        raise ToolRetry(self.unavailable())

    async def warm(self) -> None:
        """Start the server when it is not running; a failure only shows in :attr:`state`."""
        with contextlib.suppress(ToolRetry):
            await self.session()

    def unavailable(self) -> str:
        """The tool error text of a server that is down, saying whether and when it restarts."""
        if self.state is ServerState.CLOSED:
            return f"MCP server {self.name!r} is closed: its clone host is shutting down"
        head = f"MCP server {self.name!r} is unavailable: {self.error or 'not started'}"
        if self.starts > self.config.max_restarts:
            return (
                f"{head}. It failed {self.starts} time(s), past its max_restarts "
                f"({self.config.max_restarts}); it is not started again on this host"
            )
        wait = self._retry_at - self._clock()
        if wait > 0:
            return f"{head}. The next call after {wait:.1f}s restarts it"
        return f"{head}. The next call restarts it"

    # -- lifecycle ----------------------------------------------------------------------------
    def _start(self) -> None:
        if self.state is ServerState.CLOSED or self.starts > self.config.max_restarts:
            raise ToolRetry(self.unavailable())
        if self.state is ServerState.FAILED and self._retry_at > self._clock():
            raise ToolRetry(self.unavailable())
        self.starts += 1
        self._generation += 1
        self.state = ServerState.STARTING
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self.config.startup_timeout_s
        owner = loop.create_task(
            self._own(self._generation, self._ready, self._stop), name=f"mcp-server:{self.name}"
        )
        self._owner = owner
        self._owners.add(owner)
        owner.add_done_callback(self._owners.discard)

    async def _wait_started(self, generation: int) -> None:
        assert self._ready is not None
        try:
            async with asyncio.timeout_at(self._deadline):  # the start's, for every waiter
                await self._ready.wait()
        except TimeoutError:
            self._failed(generation, f"it did not start within {self.config.startup_timeout_s:g}s")

    async def _probe(self) -> None:
        """After a timed-out call: ping once; a server that does not answer is restarted."""
        self._suspect = False
        generation, session = self._generation, self._session
        if session is None:
            return
        try:
            async with asyncio.timeout(min(_PROBE_S, self.config.timeout_s)):
                await session.send_ping()
        except Exception:  # timed out, or the connection is gone
            self._failed(generation, "it stopped answering (a ping after a timed-out call)")

    def _up(self, generation: int, session: ClientSession, tools: tuple[mt.Tool, ...]) -> None:
        if generation != self._generation or self.state is not ServerState.STARTING:
            return
        self._session, self.tools, self.state = session, tools, ServerState.READY
        self._failures, self.error, self.listing = 0, "", self.listing + 1

    def _failed(self, generation: int, why: str) -> None:
        """Mark the current start or run failed and let its owner leave (stale reports ignored)."""
        if generation != self._generation or self.state not in (
            ServerState.STARTING,
            ServerState.READY,
        ):
            return
        started = self.state is ServerState.READY
        self.error = f"{'it stopped' if started else 'it failed to start'}: {why}"
        self.state, self._session = ServerState.FAILED, None
        self._failures += 1
        delay = 0.0 if self._failures == 1 else self._backoff_s * 2 ** (self._failures - 2)
        self._retry_at = self._clock() + min(delay, self._max_backoff_s)
        for event in (self._stop, self._ready):
            if event is not None:
                event.set()
        owner = self._owner
        if not started and owner is not None and owner is not asyncio.current_task():
            owner.cancel()  # stuck in the handshake: stop waiting (the SDK's cleanup is shielded)

    async def _own(self, generation: int, ready: asyncio.Event, stop: asyncio.Event) -> None:
        """Enter the transport and session, list the tools, then hold them until told to stop."""
        tail = _StderrTail()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(tail))
                session = await stack.enter_async_context(ClientSession(read, write))
                init = await session.initialize()
                tools = await _list_tools(session) if init.capabilities.tools else ()
                self.has_resources = init.capabilities.resources is not None
                self._up(generation, session, tools)
                ready.set()
                await stop.wait()
        except Exception as exc:
            self._failed(generation, _describe(exc, tail.text()))
        finally:
            stderr = tail.text()
            self._failed(
                generation, "its connection ended" + (f"; stderr: {stderr}" if stderr else "")
            )
            ready.set()

    @contextlib.asynccontextmanager
    async def _transport(self, tail: _StderrTail) -> AsyncIterator[Any]:
        if self.config.url is not None:
            async with _http(self.config) as streams:
                yield streams
            return
        argv = self.config.argv
        params = StdioServerParameters(
            command=argv[0], args=list(argv[1:]), env=dict(self.config.env), cwd=self.config.cwd
        )
        reader, errlog = _pipe()
        loop = asyncio.get_running_loop()
        pipe, _ = await loop.connect_read_pipe(lambda: tail, reader)
        try:
            # The SDK starts the command in its own process group and, on the way out, closes
            # its stdin, waits, then kills the whole group.
            async with stdio_client(params, errlog=errlog) as streams:
                errlog.close()  # the server holds its own copy
                yield streams
        finally:
            errlog.close()
            pipe.close()

    async def aclose(self) -> None:
        """Stop the server for good (its process group is killed); closing twice is harmless."""
        self._failed(self._generation, "its clone host closed")
        self.state = ServerState.CLOSED
        owners = list(self._owners)
        if not owners:
            return
        _, pending = await asyncio.wait(owners, timeout=_CLOSE_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def describe(self) -> str:
        """The server for people: its command line or URL."""
        if self.config.url is not None:
            return self.config.url
        return shlex.join(self.config.argv)


@contextlib.asynccontextmanager
async def _http(config: McpServerConfig) -> AsyncIterator[Any]:
    import httpx2  # the HTTP client the SDK's streamable-HTTP transport is built on

    assert config.url is not None
    timeout = httpx2.Timeout(min(config.startup_timeout_s, 30.0), read=max(config.timeout_s, 60.0))
    async with (
        httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout) as client,
        streamable_http_client(config.url, http_client=client) as streams,
    ):
        yield streams


async def _list_tools(session: ClientSession) -> tuple[mt.Tool, ...]:
    tools: list[mt.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor or len(tools) >= _MAX_TOOLS:
            break
    return tuple(tools[:_MAX_TOOLS])
