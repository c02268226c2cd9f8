"""The simulated model as an HTTP server on loopback (`clonefleet provider serve`).

It speaks two wire formats with the same :class:`SimBrain` the in-process simulated provider
uses, so scripts behave the same over HTTP: OpenAI chat completions (``POST /v1/chat/completions``
and ``GET /v1/models``) and the Anthropic Messages API (``POST /v1/messages``, which wants the
``x-api-key`` and ``anthropic-version`` headers and answers errors in Anthropic's shape). The
clone comes from the request's ``user`` field (OpenAI) or ``metadata.user_id`` (Anthropic),
``"<batch_id>/<clone_index>"``; ``OpenAIModel`` and ``AnthropicModel`` send it. Script fault
steps become real HTTP faults on both: an error status with ``Retry-After``, an HTML error page,
a request that never answers, a body that drips forever, and a 200 with broken JSON.
With :class:`SimLimits` set it enforces them per model as providers do: 429s in each wire's
own shape, and the limit headers on every answer (docs/cli.md). ``GET /sim/stats`` answers its
counters (requests, outcomes, 429s, tokens charged, input tokens and the prompt cache's reads and
writes). Its prompt cache (:class:`PromptCache`) is written at ``cache_control`` breakpoints on
the Anthropic wire and automatically on the OpenAI one (docs/prompt-cache.md).
It never binds anything but a loopback address; it is a test and benchmark backend, not a proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from clonefleet.errors import ConfigError, UsageError
from clonefleet.providers._bounded_json import loads_bounded
from clonefleet.providers._protocol import ModelRequest, ModelResponse
from clonefleet.providers.sim._cache import (
    DEFAULT_CACHE_MIN_TOKENS,
    DEFAULT_CACHE_TTL_S,
    PromptCache,
)
from clonefleet.providers.sim._limits import SimLimiter, SimLimits, request_cost
from clonefleet.providers.sim._model import SimBrain, SimScript, SimStep, step_to_response
from clonefleet.providers.sim._wire import ANTHROPIC, MODEL_IDS, OPENAI, Wire, html_page

__all__ = ["SIM_SERVER", "SimServer", "serve_main", "start_server"]


class SimServer:
    """The state behind one simulated server: its brain, options and request counters.

    Args:
        brain: decides each answer; one per server, so per-clone scripts advance per request.
        latency_ms: added delay per request, in milliseconds (a step's own ``latency_ms`` wins).
        drip_interval_s: pause between the bytes of a ``drip`` answer, in seconds.
        hang_s: longest a ``hang``/``drip`` answer lasts before the server gives up, in seconds.
        api_key: when set, the key a request must carry (``Authorization: Bearer`` for OpenAI,
            ``x-api-key`` for Anthropic); a wrong one gets 401. The Messages endpoint always
            wants some ``x-api-key``, as Anthropic's does.
        limits: rate limits enforced per model (``None`` or none set: no limit, no headers).
        clock: the limiter's and the prompt cache's clock, in seconds (tests pass a fake one).
        cache_ttl_s: lifetime of a prompt-cache entry, in seconds (0: no cache).
        cache_min_tokens: the shortest prefix the cache writes, in tokens.
    """

    def __init__(
        self,
        brain: SimBrain,
        *,
        latency_ms: float = 0.0,
        drip_interval_s: float = 0.05,
        hang_s: float = 3600.0,
        api_key: str | None = None,
        limits: SimLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
        cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
    ) -> None:
        self.brain = brain
        self.cache = (
            PromptCache(ttl_s=cache_ttl_s, min_tokens=cache_min_tokens, clock=clock)
            if cache_ttl_s > 0
            else None
        )
        """The prompt cache (``None``: off)."""
        self.limiter = SimLimiter(limits, clock) if limits is not None and limits.enabled else None
        self.latency_ms, self.drip_interval_s, self.hang_s = latency_ms, drip_interval_s, hang_s
        self.api_key = api_key
        self.requests = 0
        """Model requests received (chat completions and messages)."""
        self.outcomes: Counter[str] = Counter()
        """How each request was answered: ``ok``, ``error 503``, ``html 502``, ``hang``, ``drip``, ..."""
        self.rate_limited = 0
        """Requests refused with 429 by the rate limits (also ``outcomes["rate limited 429"]``)."""
        self.tokens_admitted = 0
        """Tokens the rate limits charged for the requests they let through (:func:`request_cost`
        each; 0 without limits)."""
        self.input_tokens = 0
        """Input tokens of the requests answered ``ok``, cached or not."""
        self.cache_read_tokens = 0
        """Of those, the tokens read from the prompt cache."""
        self.cache_write_tokens = 0
        """Of those, the tokens written to the prompt cache."""
        self.first_at: float | None = None
        """Wall-clock time (``time.time()``) the first model request arrived."""
        self.last_ok_at: float | None = None
        """Wall-clock time the latest ``ok`` answer was sent."""
        self.first_request_at: dict[str, float] = {}
        """Wall-clock time (``time.time()``) each clone's first chat request arrived, keyed
        ``"<batch_id>/<clone_index>"`` (the request's ``user``); for spawn-to-first-request figures.
        One entry per clone seen, like the brain's per-clone step counters."""
        self._stopping = asyncio.Event()

    def app(self) -> web.Application:
        """The aiohttp application serving this state."""
        app = web.Application(client_max_size=64 * 1024 * 1024)  # long clone contexts
        app[SIM_SERVER] = self
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/sim/stats", self._stats)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_shutdown(self, _app: web.Application) -> None:
        # Releases hanging and dripping handlers, so shutdown does not wait for them.
        self._stopping.set()

    async def _models(self, _request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "clonefleet"} for m in MODEL_IDS
        ]
        return web.json_response({"object": "list", "data": data})

    def stats(self) -> dict[str, Any]:
        """The counters: ``requests``, ``outcomes``, ``rate_limited``, ``tokens_admitted``,
        ``input_tokens``, ``cache_read_tokens``, ``cache_write_tokens``, ``first_at`` and
        ``last_ok_at`` (wall-clock seconds, ``None`` before any)."""
        return {
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "rate_limited": self.rate_limited,
            "tokens_admitted": self.tokens_admitted,
            "input_tokens": self.input_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "first_at": self.first_at,
            "last_ok_at": self.last_ok_at,
        }

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, OPENAI)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, ANTHROPIC)

    async def _answer(self, request: web.Request, wire: Wire) -> web.StreamResponse:
        arrived = time.time()
        self.requests += 1
        if self.first_at is None:
            self.first_at = arrived
        refused = wire.check_headers(request.headers, self.api_key)
        if refused is not None:
            self.outcomes[f"refused {refused.status}"] += 1
            return refused
        try:
            body = loads_bounded(await request.read())
        except ValueError as exc:  # not JSON, or nested past the cap: never a RecursionError
            self.outcomes["bad request"] += 1
            return wire.error(
                400, f"invalid {wire.name} request: the body cannot be read as JSON: {exc}", None
            )
        try:
            req = wire.parse(body)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.outcomes["bad request"] += 1
            return wire.error(400, f"invalid {wire.name} request: {exc}", None)
        if "clone_index" in req.metadata:
            self.first_request_at.setdefault(
                f"{req.metadata['batch_id']}/{req.metadata['clone_index']}", arrived
            )
        limited, limit_headers = self._admit(req, wire)
        if limited is not None:
            return limited
        step = self.brain.next_step(req)
        delay_ms = step.latency_ms if step.latency_ms is not None else self.latency_ms
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        if step.is_fault:
            return await self._fault(step, request, wire)
        self.outcomes["ok"] += 1
        self.last_ok_at = time.time()
        response = self._cached(step_to_response(step, req, self.requests), body, wire)
        return web.json_response(
            wire.render(response, req.model, self.requests), headers=limit_headers or None
        )

    def _cached(self, response: ModelResponse, body: Any, wire: Wire) -> ModelResponse:
        """``response`` with the prompt cache's reads and writes for the request ``body`` in
        its usage (docs/prompt-cache.md), counted in the server's totals too."""
        usage = response.usage
        # A request shorter than the cache's minimum can neither write nor read a prefix.
        if self.cache is not None and usage.input_tokens >= self.cache.min_tokens:
            prefixes = wire.prefixes(body)
            cache = self.cache.explicit if wire.explicit else self.cache.automatic
            use = cache(response.model, prefixes)
            read = min(use.read, usage.input_tokens)
            usage = dataclasses.replace(
                usage,
                cache_read_tokens=read,
                cache_write_tokens=min(use.write, usage.input_tokens - read),
            )
            response = dataclasses.replace(response, usage=usage)
        self.input_tokens += usage.input_tokens
        self.cache_read_tokens += usage.cache_read_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        return response

    def _admit(self, req: ModelRequest, wire: Wire) -> tuple[web.Response | None, dict[str, str]]:
        """Charge the rate limits for ``req``: ``(429 answer or None, limit headers)``."""
        if self.limiter is None:
            return None, {}
        admission = self.limiter.admit(req.model, request_cost(req))
        headers = wire.limit_headers(admission, time.time()) if self.limiter.limits.headers else {}
        if admission.admitted:
            self.tokens_admitted += admission.cost
            return None, headers
        self.rate_limited += 1
        self.outcomes["rate limited 429"] += 1
        return wire.rate_limited(admission, req.model, headers), headers

    async def _fault(self, step: SimStep, request: web.Request, wire: Wire) -> web.StreamResponse:
        if step.hang:
            self.outcomes["hang"] += 1
            await self._wait_stopping()
            return wire.error(503, "simulated hang ended by server shutdown", None)
        if step.drip:
            self.outcomes["drip"] += 1
            return await self._drip(request, wire.drip_head)
        if step.malformed:
            self.outcomes["malformed"] += 1
            return web.Response(status=200, text=wire.truncated, content_type="application/json")
        status = step.error if step.error is not None else 200
        headers = {"Retry-After": f"{step.retry_after:g}"} if step.retry_after is not None else {}
        if step.html:
            self.outcomes[f"html {status}"] += 1
            return web.Response(
                status=status, text=html_page(status), content_type="text/html", headers=headers
            )
        self.outcomes[f"error {status}"] += 1
        return wire.error(status, "simulated failure", headers)

    async def _drip(self, request: web.Request, head: bytes) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):  # the client gave up
            await response.write(head)
            deadline = time.monotonic() + self.hang_s
            while not self._stopping.is_set() and time.monotonic() < deadline:
                await response.write(b" ")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.drip_interval_s)
        return response

    async def _wait_stopping(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.hang_s)


SIM_SERVER = web.AppKey("clonefleet_sim_server", SimServer)
"""Key of the :class:`SimServer` in the application: ``runner.app[SIM_SERVER]``."""


def _check_loopback(host: str) -> None:
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise UsageError(
            f"the simulated provider only binds loopback addresses, not {host!r}; use 127.0.0.1"
        )


async def start_server(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    latency_ms: float = 0.0,
    fail_rate: float = 0.0,
    rate_429: float = 0.0,
    seed: int = 0,
    script: SimScript | str | os.PathLike[str] | None = None,
    drip_interval_s: float = 0.05,
    hang_s: float = 3600.0,
    api_key: str | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    burst: int | None = None,
    limit_headers: bool = True,
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
    cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
) -> tuple[web.AppRunner, int]:
    """Start a simulated server (OpenAI chat completions and Anthropic Messages) in the running
    event loop.

    Args:
        host: a loopback address.
        port: the TCP port; ``0`` picks a free one.
        latency_ms: added delay per request, in milliseconds.
        fail_rate: probability of HTTP 503 per request (deterministic per seed, clone and attempt).
        rate_429: probability of HTTP 429 with ``Retry-After: 0`` per request.
        seed: seed of those rolls.
        script: a :class:`SimScript` or the path of a script file.
        drip_interval_s: pause between the bytes of a ``drip`` answer, in seconds.
        hang_s: longest a ``hang``/``drip`` answer lasts, in seconds.
        api_key: the key requests must carry (``None``: any key, or none for OpenAI).
        rpm: requests per minute each model allows (``None``: no limit).
        tpm: tokens per minute each model allows (``None``: no limit).
        burst: requests let through at once after an idle spell (needs ``rpm``).
        limit_headers: send the rate-limit headers (``False``: a 429 has only status and body).
        cache_ttl_s: lifetime of a prompt-cache entry, in seconds (0: no cache).
        cache_min_tokens: the shortest prefix the prompt cache writes, in tokens.

    Returns:
        ``(runner, port)``; stop with ``await runner.cleanup()``. ``runner.app[SIM_SERVER]`` is the
        :class:`SimServer` with its request counters.

    Raises:
        UsageError: ``host`` is not a loopback address, a limit is not a positive whole number,
            ``burst`` comes without ``rpm``, or a cache setting is out of range.
        ConfigError: the script file cannot be read.
        OSError: the port cannot be bound.
    """
    _check_loopback(host)
    try:
        limits = SimLimits(rpm=rpm, tpm=tpm, burst=burst, headers=limit_headers)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _check_cache(cache_ttl_s, cache_min_tokens)
    if script is not None and not isinstance(script, SimScript):
        script = SimScript.load(Path(script))
    brain = SimBrain(script=script, seed=seed, fail_rate=fail_rate, rate_429=rate_429)
    state = SimServer(
        brain,
        latency_ms=latency_ms,
        drip_interval_s=drip_interval_s,
        hang_s=hang_s,
        api_key=api_key,
        limits=limits,
        cache_ttl_s=cache_ttl_s,
        cache_min_tokens=cache_min_tokens,
    )
    return await _listen(state, host, port)


def _check_cache(ttl_s: float, min_tokens: int) -> None:
    if not ttl_s >= 0 or min_tokens < 1:
        raise UsageError(
            "the cache's ttl must be 0 or more seconds and its minimum 1 or more tokens"
        )


async def _listen(state: SimServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``state`` on ``host:port``: ``(runner, bound port)``."""
    runner = web.AppRunner(
        state.app(), handler_cancellation=True, shutdown_timeout=2.0, access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]


def serve_main(
    port: int = 8000,
    latency_ms: float = 0.0,
    fail_rate: float = 0.0,
    rate_429: float = 0.0,
    script: str | None = None,
    seed: int = 0,
    rpm: int | None = None,
    tpm: int | None = None,
    burst: int | None = None,
    limit_headers: bool = True,
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
    cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
) -> int:
    """Serve the simulated provider on ``127.0.0.1:port`` until SIGINT or SIGTERM, enforcing
    the rate limits and with the prompt cache given (see :func:`start_server`).

    Prints ``serving simulated provider on http://127.0.0.1:PORT/v1`` once listening.

    Returns:
        0 after a clean stop, 2 for a bad script file, 1 when the port cannot be bound.
    """
    try:
        return asyncio.run(
            _serve(
                port,
                latency_ms=latency_ms,
                fail_rate=fail_rate,
                rate_429=rate_429,
                script=script,
                seed=seed,
                rpm=rpm,
                tpm=tpm,
                burst=burst,
                limit_headers=limit_headers,
                cache_ttl_s=cache_ttl_s,
                cache_min_tokens=cache_min_tokens,
            )
        )
    except (ConfigError, UsageError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"error: cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}\n")
        return 1


async def _serve(port: int, **opts: Any) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        runner, bound = await start_server("127.0.0.1", port, **opts)
        try:
            sys.stdout.write(f"serving simulated provider on http://127.0.0.1:{bound}/v1\n")
            sys.stdout.flush()
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0
