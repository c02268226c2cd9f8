"""Serving a :class:`Dashboard`: binding the socket, running it, and running it in a thread.

``serving`` is the one place a socket is bound (127.0.0.1 unless told otherwise); ``serve``
runs until cancelled (the command line's Ctrl-C), and :class:`DashboardThread` serves from a
thread of its own for notebooks and tests.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType

from aiohttp import web

from clonefleet.dashboard._data import DataSource
from clonefleet.dashboard._live import DashboardOptions
from clonefleet.dashboard._server import Dashboard
from clonefleet.errors import UsageError

__all__ = ["DashboardThread", "is_loopback", "serve", "serving"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
START_TIMEOUT_S = 30.0
"""How long :class:`DashboardThread` waits for its server to listen."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only answers this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    try:
        return socket.create_server((bare, port), family=family)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port, "
            "or 0 for a free one"
        ) from None


@asynccontextmanager
async def serving(
    dashboard: Dashboard, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve ``dashboard`` on ``host:port`` (``port`` 0 = a free one) while inside; yields the
    page's URL.

    Raises:
        UsageError: the address cannot be bound (in use, not an address of this machine).
    """
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    if is_loopback(host):
        # A page from elsewhere that got its name pointed at 127.0.0.1 (DNS rebinding) sends its
        # own name as Host; only this machine's names for the dashboard are served.
        names = {*LOOPBACK_NAMES, shown}
        dashboard.allowed_hosts = frozenset(f"{n}:{bound}" for n in names)
    runner = web.AppRunner(dashboard.app(), shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        yield f"http://{shown}:{bound}/"
    finally:
        await runner.cleanup()
        sock.close()


async def serve(
    source: DataSource,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    options: DashboardOptions | None = None,
    on_ready: Callable[[str], None] = lambda url: None,
) -> None:
    """Serve the dashboard of ``source`` until cancelled; ``on_ready(url)`` once it listens."""
    async with serving(Dashboard(source, options), host, port) as url:
        on_ready(url)
        await asyncio.Event().wait()


class DashboardThread:
    """The dashboard of ``source`` served from a thread of its own, as a context manager::

        with DashboardThread(fleet) as url:
            ...  # open url in a browser

    Args:
        source: a :class:`~clonefleet.Fleet` (or any :class:`DataSource`).
        host: the address to listen on (127.0.0.1 by default).
        port: the TCP port (0 = a free one).
        options: see :class:`DashboardOptions`.
    """

    def __init__(
        self,
        source: DataSource,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        options: DashboardOptions | None = None,
    ) -> None:
        self.source, self.host, self.port, self.options = source, host, port, options
        self.url: str | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="clonefleet-dashboard", daemon=True)

    def start(self) -> str:
        """Start serving; returns the page's URL.

        Raises:
            UsageError: the address cannot be bound.
            TimeoutError: the server did not listen within 30 s.
        """
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError("the dashboard did not start listening within 30 s")
        if self._error is not None:
            raise self._error
        assert self.url is not None
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and wait up to ``timeout_s`` for the thread to end; harmless twice."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop closed in between: the thread is ending anyway
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to start(); a thread has nobody else to tell
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        dashboard = Dashboard(self.source, self.options)
        async with serving(dashboard, self.host, self.port) as url:
            self.url = url
            self._ready.set()
            await self._stop.wait()
