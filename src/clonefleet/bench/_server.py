"""The benchmark's simulated provider: served over HTTP from its own process on 127.0.0.1.

A child process running :func:`main` serves it (the simulated provider of
``clonefleet provider serve``, scripted so every clone makes ``TURNS`` model requests, with
the rate limits asked for, plus a ``GET /bench/stats`` route); :class:`Server` starts that
process, or talks to one given by URL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

from clonefleet.errors import ClusterError

if TYPE_CHECKING:
    from clonefleet.providers import SimLimits

__all__ = ["Server", "limit_args", "main", "parse_limits", "turn_script"]

_READY = "serving simulated provider on "


def turn_script(turns: int) -> dict[str, Any]:
    """A simulation script in which every clone makes ``turns`` model requests: ``turns - 1``
    ``progress_update`` calls, then ``exit_tool`` (docs/cli.md, simulated provider scripts)."""
    steps: list[dict[str, Any]] = [
        {"tool": "progress_update", "args": {"summary": f"turn {i + 1}"}} for i in range(turns - 1)
    ]
    steps.append({"tool": "exit_tool", "args": {"success": True, "summary": "done"}})
    return {"default": steps}


def limit_args(limits: SimLimits | None) -> list[str]:
    """``limits`` as the server process's arguments ``[RPM, TPM, BURST, HEADERS]`` (``-``: none;
    no arguments without limits); :func:`parse_limits` reads them back."""
    if limits is None:
        return []
    return [
        *("-" if v is None else str(v) for v in (limits.rpm, limits.tpm, limits.burst)),
        "on" if limits.headers else "off",
    ]


def parse_limits(args: list[str]) -> SimLimits | None:
    """The :class:`SimLimits` of :func:`limit_args`' arguments (``None`` for none)."""
    from clonefleet.providers import SimLimits

    if not args:
        return None
    rpm, tpm, burst = (None if a == "-" else int(a) for a in args[:3])
    return SimLimits(rpm=rpm, tpm=tpm, burst=burst, headers=args[3] == "on")


async def _serve(latency_ms: float, seed: int, turns: int, limits: SimLimits | None) -> int:
    from aiohttp import web

    from clonefleet.providers import SimBrain, SimScript, SimServer

    script = SimScript.from_data(turn_script(turns))
    brain = SimBrain(script=script, seed=seed)
    state = SimServer(brain, latency_ms=latency_ms, limits=limits)
    sample: list[bytes] = []

    @web.middleware
    async def keep_first_body(request: web.Request, handler: Any) -> web.StreamResponse:
        if not sample and request.method == "POST":
            sample.append(await request.read())  # aiohttp keeps the body for the handler
        return await handler(request)  # type: ignore[no-any-return]

    async def stats(request: web.Request) -> web.Response:
        prefix = request.query.get("prefix", "")
        usage = os.times()
        firsts = {k: v for k, v in state.first_request_at.items() if k.startswith(prefix)}
        return web.json_response(
            {
                **state.stats(),
                "cpu_s": usage.user + usage.system,
                "first_request_at": firsts,
                "sample": sample[0].decode() if sample else None,
            }
        )

    app = state.app()
    app.middlewares.append(keep_first_body)
    app.router.add_get("/bench/stats", stats)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=2.0, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=4096).start()
        sys.stdout.write(f"{_READY}http://127.0.0.1:{runner.addresses[0][1]}/v1\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


class Server:
    """The simulated provider as the benchmark sees it.

    Args:
        latency_ms: delay per model request, in milliseconds.
        seed: seed of the simulated model.
        turns: model requests per clone.
        base_url: use the server at this URL (``.../v1``) instead of starting one; its
            ``/bench/stats`` route is optional (without it, first-request times and the floor's
            request template are not available).
        limits: rate limits the started server enforces (``None``: none).
    """

    def __init__(
        self,
        latency_ms: float,
        seed: int,
        turns: int,
        base_url: str | None = None,
        limits: SimLimits | None = None,
    ) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        if base_url is not None:
            self.base_url = base_url.rstrip("/")
            return
        # `-c`, not `-m`: running a module of an imported package with -m warns (runpy).
        entry = (
            "import sys; from clonefleet.bench._server import main; sys.exit(main(sys.argv[1:]))"
        )
        cmd = [sys.executable, "-c", entry, f"{latency_ms}", f"{seed}"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CLONEFLEET_BLOCK_LIVE": "1"}
        cmd += [str(turns), *limit_args(limits)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith(_READY):
            self.stop()
            raise ClusterError(f"the simulated server did not start: {line!r}")
        self.base_url = line.removeprefix(_READY).strip()

    def stats(self, prefix: str = "\x00") -> dict[str, Any] | None:
        """The server's counters and the first-request times of clones keyed ``prefix...``;
        ``None`` when the server has no ``/bench/stats`` route or does not answer."""
        root = self.base_url.removesuffix("/v1")
        url = f"{root}/bench/stats?prefix={urllib.parse.quote(prefix)}"
        try:
            with self._opener.open(url, timeout=60) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except (urllib.error.URLError, OSError, ValueError):
            return None  # a server of its own (--base-url) without the route, or gone

    def stop(self) -> None:
        """Stop the server process this object started (harmless twice, or for a URL)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def main(argv: list[str]) -> int:
    """Serve until SIGTERM or SIGINT: ``argv`` is ``[LATENCY_MS, SEED, TURNS]``, then
    optionally ``[RPM, TPM, BURST, HEADERS]`` (:func:`limit_args`)."""
    limits = parse_limits(argv[3:])
    return asyncio.run(_serve(float(argv[0]), int(argv[1]), int(argv[2]), limits))
