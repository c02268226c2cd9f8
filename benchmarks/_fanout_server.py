"""The fan-out benchmark's simulated provider, served over HTTP from its own process.

``python benchmarks/_fanout_server.py LATENCY_MS SEED`` serves it; :class:`Server` starts that
process and reads its counters (``benchmarks/fanout.py`` measures against it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

__all__ = ["Server", "serve"]


def serve(latency_ms: float, seed: int) -> int:
    """Run the simulated server: prints its base URL, stops on SIGTERM/SIGINT.

    Besides the OpenAI-compatible routes it answers ``GET /bench/stats?prefix=P`` with its
    request counters, its CPU time, the first-request times of clones whose key starts with
    ``P``, and the body of the first chat request it received (the baseline's template).
    """
    return asyncio.run(_serve(latency_ms, seed))


async def _serve(latency_ms: float, seed: int) -> int:
    from aiohttp import web

    from clonefleet.providers import SimBrain, SimServer

    state = SimServer(SimBrain(seed=seed), latency_ms=latency_ms)
    sample: list[bytes] = []

    @web.middleware
    async def keep_first_body(request: web.Request, handler: Any) -> web.StreamResponse:
        if not sample and request.method == "POST":
            sample.append(
                await request.read()
            )  # aiohttp keeps the body; the handler reads it again
        return await handler(request)

    async def stats(request: web.Request) -> web.Response:
        prefix = request.query.get("prefix", "")
        usage = os.times()
        return web.json_response(
            {
                "requests": state.requests,
                "outcomes": dict(state.outcomes),
                "cpu_s": usage.user + usage.system,
                "first_request_at": {
                    k: v for k, v in state.first_request_at.items() if k.startswith(prefix)
                },
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
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        sys.stdout.write(
            f"serving simulated provider on http://127.0.0.1:{runner.addresses[0][1]}/v1\n"
        )
        sys.stdout.flush()
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


class Server:
    """The server process seen from the benchmark."""

    def __init__(self, latency_ms: float, seed: int) -> None:
        cmd = [sys.executable, __file__, str(latency_ms), str(seed)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CLONEFLEET_BLOCK_LIVE": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("serving simulated provider on "):
            self.stop()
            raise SystemExit(f"the simulated server did not start: {line!r}")
        self.base_url = line.split(" on ", 1)[1].strip()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def stats(self, prefix: str = "\x00") -> dict[str, Any]:
        url = (
            f"{self.base_url.removesuffix('/v1')}/bench/stats?prefix={urllib.request.quote(prefix)}"
        )
        with self._opener.open(url, timeout=60) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(serve(float(sys.argv[1]), int(sys.argv[2])))
