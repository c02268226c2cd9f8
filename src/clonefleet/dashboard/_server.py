"""The dashboard's HTTP side: the page, its static files, the JSON API and the live stream.

:class:`Dashboard` builds the ``aiohttp`` application over a :class:`DataSource`. Lists (batches,
jobs, usage) come from the shared snapshot that :class:`Live` keeps; a job's detail and events
are read from the fleet per request, in worker threads with deadlines. Binding a socket and
running the application is :mod:`._run`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from clonefleet.dashboard._data import DataSource, jobs_page, read_events, read_job
from clonefleet.dashboard._live import BlockingCalls, DashboardOptions, Live
from clonefleet.errors import ClonefleetError, ClusterError, UnknownJobError, UsageError

__all__ = ["Dashboard"]

STATIC = Path(__file__).resolve().parent / "static"
_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
}
_SECURITY_HEADERS = {
    # Everything the page loads comes from this server; nothing may run inline.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _load_static() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once: ``name -> (bytes, content type)``."""
    out = {}
    for path in sorted(STATIC.iterdir()):
        if path.is_file() and path.suffix in _TYPES:
            out[path.name] = (path.read_bytes(), _TYPES[path.suffix])
    return out


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


class Dashboard:
    """The dashboard application over ``source`` (a :class:`~clonefleet.Fleet` or a fake).

    Args:
        source: where jobs, results and events are read (blocking calls with deadlines).
        options: refresh interval, deadlines and bounds (see :class:`DashboardOptions`).
    """

    def __init__(self, source: DataSource, options: DashboardOptions | None = None) -> None:
        self.options = options or DashboardOptions()
        self.calls = BlockingCalls(self.options.workers, self.options.call_timeout_s)
        self.live = Live(source, self.calls, self.options)
        self.source = source
        self.allowed_hosts: frozenset[str] | None = None
        """``Host`` header values accepted (``None`` = any); set once the port is known."""
        self._files = _load_static()
        self._streams = 0
        self._closing = False

    def app(self) -> web.Application:
        """A new ``aiohttp`` application serving this dashboard."""
        app = web.Application(middlewares=[self._guard], client_max_size=4096)
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/batches", self._batches)
        app.router.add_get("/api/usage", self._usage)
        app.router.add_get("/api/rate-limits", self._rate_limits)
        app.router.add_get("/api/jobs", self._jobs)
        app.router.add_get("/api/jobs/{job_id}", self._job)
        app.router.add_get("/api/jobs/{job_id}/events", self._events)
        app.router.add_get("/api/stream", self._stream)
        app.cleanup_ctx.append(self._poller)
        app.on_shutdown.append(self._shutdown)
        app.on_response_prepare.append(_add_headers)
        return app

    async def _poller(self, app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(self.live.run())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        self.calls.close()

    async def _shutdown(self, app: web.Application) -> None:
        self._closing = True
        self.live.wake_streams()

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse a foreign ``Host`` (a DNS-rebinding page); turn our errors into JSON."""
        if self.allowed_hosts is not None and request.host not in self.allowed_hosts:
            return _json({"error": "unexpected Host header"}, 421)
        self.live.touch()
        try:
            return await handler(request)
        except UnknownJobError as exc:
            return _json({"error": str(exc)}, 404)
        except UsageError as exc:
            return _json({"error": str(exc)}, 400)
        except (ClusterError, TimeoutError) as exc:
            text = str(exc) or f"the scheduler did not answer within {self.calls.deadline_s:g} s"
            return _json({"error": text}, 503)
        except ClonefleetError as exc:
            return _json({"error": str(exc)}, 500)

    async def _page(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def _static(self, request: web.Request) -> web.Response:
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.Response:
        if name not in self._files:
            raise web.HTTPNotFound()
        body, kind = self._files[name]
        return web.Response(body=body, content_type=kind, charset="utf-8")

    def _state(self) -> dict[str, Any]:
        snap = self.live.snapshot
        problem = self.live.problem
        if snap is None:
            # Nothing read yet: the first read is under way (or failing).
            raise ClusterError(problem or "the dashboard is still reading the fleet; try again")
        return {
            "fetched_at": snap.fetched_at,
            "scheduler": {"ok": problem is None, "problem": problem},
        }

    async def _batches(self, request: web.Request) -> web.Response:
        state = self._state()
        assert self.live.snapshot is not None
        return _json({"batches": list(self.live.snapshot.batches), **state})

    async def _usage(self, request: web.Request) -> web.Response:
        state = self._state()
        snap = self.live.snapshot
        assert snap is not None
        return _json({"usage": snap.usage, "capacity": snap.capacity, **state})

    async def _rate_limits(self, request: web.Request) -> web.Response:
        state = self._state()
        assert self.live.snapshot is not None
        return _json({"rate_limits": list(self.live.snapshot.rate_limits), **state})

    async def _jobs(self, request: web.Request) -> web.Response:
        state = self._state()
        assert self.live.snapshot is not None
        return _json({**jobs_page(self.live.snapshot, request.query), **state})

    async def _job(self, request: web.Request) -> web.Response:
        out = await self.calls(read_job, self.source, request.match_info["job_id"])
        return _json(out)

    async def _events(self, request: web.Request) -> web.Response:
        q = request.query
        job_id = request.match_info["job_id"]
        out = await self.calls(read_events, self.source, job_id, q.get("cursor"), q.get("level"))
        return _json(out)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: an ``overview`` event now and whenever it changes, a comment
        every ``heartbeat_s`` otherwise; the stream ends after ``stream_lifetime_s``."""
        if self._streams >= self.options.max_streams:
            return _json({"error": "too many live streams open; close a dashboard tab"}, 503)
        self._streams += 1
        try:
            return await self._serve_stream(request)
        finally:
            self._streams -= 1

    async def _serve_stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        end = loop.time() + self.options.stream_lifetime_s
        seen = -1
        try:
            await resp.write(b"retry: 2000\n\n")
            while not self._closing and (left := end - loop.time()) > 0:
                if self.live.version != seen:
                    seen = self.live.version
                    await resp.write(b"event: overview\ndata: " + self.live.message + b"\n\n")
                else:
                    await resp.write(b": keep-alive\n\n")
                self.live.touch()
                await self.live.wait_change(seen, min(left, self.options.heartbeat_s))
        except ConnectionResetError:
            pass  # the page went away
        return resp


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(_SECURITY_HEADERS)
