"""1,000 concurrent chat-completion requests against the local simulated server, per HTTP client.

Compares httpx's own connection pool, httpx on ``httpx_aiohttp.AiohttpTransport`` (what
``web_fetch`` and MCP over HTTP use, via ``make_client``), raw aiohttp as a reference, and
clonefleet's full ``OpenAIModel`` path (wire mapping and JSON included), which posts over the
providers' own keep-alive HTTP/1.1 pool (``providers/_http1.py``). The server runs in its own process
(``serve_main``), so the CPU figures are the client's alone. Round 1 opens the connections
("cold"); later rounds reuse them ("warm").

    python benchmarks/http_concurrency.py [--n 1000] [--latency-ms 200] [--rounds 2]

Prints one table and writes ``benchmarks/results/http_concurrency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from clonefleet.config import ProviderConfig
from clonefleet.providers import Message, ModelRequest, Role, ToolSpec, build_provider, make_client

RESULTS = Path(__file__).parent / "results" / "http_concurrency.json"
ROUND_LIMIT_S = 120.0
"""Each round must finish within this; a stuck round is reported as a failure, not waited on."""

EXIT_SCHEMA = {
    "type": "object",
    "properties": {"success": {"type": "boolean"}, "summary": {"type": "string"}},
}
TOOLS = (
    ToolSpec(
        name="progress_update",
        description="Report progress.",
        parameters={"type": "object", "properties": {"summary": {"type": "string"}}},
    ),
    ToolSpec(name="exit_tool", description="Finish.", parameters=EXIT_SCHEMA),
)


def payload(i: int) -> dict[str, Any]:
    return {
        "model": "sim-small",
        "messages": [
            {"role": "system", "content": "You review code."},
            {"role": "user", "content": f"Review file_{i}.py"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in TOOLS
        ],
        "user": f"bench/{i}",
    }


def model_request(i: int) -> ModelRequest:
    messages = (
        Message(role=Role.SYSTEM, content="You review code."),
        Message(role=Role.USER, content=f"Review file_{i}.py"),
    )
    return ModelRequest(
        model="sim-small",
        messages=messages,
        tools=TOOLS,
        metadata={"batch_id": "bench", "clone_index": i},
    )


Send = Callable[[int], Awaitable[None]]


class Client:
    """One way of sending a request: ``send(i)`` posts request *i*; ``aclose()`` releases it."""

    def __init__(self, mode: str, base_url: str, n: int) -> None:
        self.mode, self.base_url, self.n = mode, base_url, n
        self._httpx: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._model: Any = None
        self._close: Any = None

    async def open(self) -> Send:
        url = f"{self.base_url}/chat/completions"
        if self.mode == "httpx default pool":
            limits = httpx.Limits(max_connections=self.n, max_keepalive_connections=self.n)
            self._httpx = httpx.AsyncClient(limits=limits, timeout=60.0)
            return self._via_httpx(url)
        if self.mode == "httpx + AiohttpTransport":
            self._httpx = make_client(self.n, 60.0)
            return self._via_httpx(url)
        if self.mode == "raw aiohttp":
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.n),
                timeout=aiohttp.ClientTimeout(total=60),
            )
            return self._via_aiohttp(url)
        if self.mode == "clonefleet OpenAIModel":
            cfg = ProviderConfig(
                kind="openai", base_url=self.base_url, max_connections=self.n, timeout_s=60.0
            )
            self._model, self._close = build_provider("bench", cfg)
            return self._via_model()
        raise ValueError(self.mode)

    def _via_httpx(self, url: str) -> Send:
        async def send(i: int) -> None:
            resp = await self._httpx.post(url, json=payload(i))
            resp.raise_for_status()
            resp.json()

        return send

    def _via_aiohttp(self, url: str) -> Send:
        async def send(i: int) -> None:
            async with self._session.post(url, json=payload(i)) as resp:
                resp.raise_for_status()
                await resp.json()

        return send

    def _via_model(self) -> Send:
        async def send(i: int) -> None:
            await self._model.request(model_request(i))

        return send

    async def aclose(self) -> None:
        if self._httpx is not None:
            await self._httpx.aclose()
        if self._session is not None:
            await self._session.close()
        if self._close is not None:
            await self._close()


async def one_round(send: Send, n: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []

    async def timed(i: int) -> None:
        start = time.perf_counter()
        try:
            await send(i)
        except Exception as exc:  # noqa: BLE001 - a benchmark counts failures instead of stopping
            errors.append(type(exc).__name__)
            return
        latencies.append(time.perf_counter() - start)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        async with asyncio.timeout(ROUND_LIMIT_S), asyncio.TaskGroup() as tg:
            for i in range(n):
                tg.create_task(timed(i))
    except TimeoutError:
        errors.append(f"round exceeded {ROUND_LIMIT_S:g}s")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    latencies.sort()
    pct = (
        (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000)
        if latencies
        else (lambda q: float("nan"))
    )
    return {
        "ok": len(latencies),
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "wall_s": round(wall, 3),
        "client_cpu_s": round(cpu, 3),
        "cpu_ms_per_request": round(cpu / n * 1000, 3),
        "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(pct(0.50), 1),
        "p95_ms": round(pct(0.95), 1),
        "max_ms": round(latencies[-1] * 1000, 1) if latencies else None,
        "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None,
    }


async def run_mode(mode: str, base_url: str, n: int, rounds: int) -> list[dict[str, Any]]:
    client = Client(mode, base_url, n)
    send = await client.open()
    results = []
    try:
        for r in range(rounds):
            result = await one_round(send, n)
            results.append(
                {"mode": mode, "round": r + 1, "phase": "cold" if r == 0 else "warm", **result}
            )
    finally:
        await client.aclose()
    return results


def start_server(latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    code = f"from clonefleet.providers import serve_main; raise SystemExit(serve_main(0, latency_ms={latency_ms!r}))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("serving simulated provider on "):
        proc.kill()
        raise SystemExit(f"the simulated server did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].strip()


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'client':<26} {'round':<6} {'ok':>5} {'err':>4} {'wall s':>7} {'cpu s':>6} "
        f"{'cpu ms/req':>10} {'req/s':>7} {'p50 ms':>7} {'p95 ms':>7}"
    )
    lines = [head, "-" * len(head)]
    lines += [
        f"{r['mode']:<26} {r['phase']:<6} {r['ok']:>5} {r['errors']:>4} {r['wall_s']:>7.3f} {r['client_cpu_s']:>6.3f} "
        f"{r['cpu_ms_per_request']:>10.3f} {r['requests_per_s']:>7.1f} {r['p50_ms']:>7.1f} {r['p95_ms']:>7.1f}"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="concurrent requests per round")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="simulated server latency")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per client (first is cold)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    modes = [
        "httpx default pool",
        "httpx + AiohttpTransport",
        "raw aiohttp",
        "clonefleet OpenAIModel",
    ]
    proc, base_url = start_server(args.latency_ms)
    rows: list[dict[str, Any]] = []
    try:
        for mode in modes:
            rows += asyncio.run(run_mode(mode, base_url, args.n, args.rounds))
    finally:
        stop_server(proc)
    params = {
        "n": args.n,
        "latency_ms": args.latency_ms,
        "rounds": args.rounds,
        "seed": 0,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {
            p: metadata.version(p) for p in ("httpx", "httpcore", "aiohttp", "httpx-aiohttp")
        },
    }
    print(f"http_concurrency: {params}")  # noqa: T201 - a benchmark script prints its table
    print(table(rows))  # noqa: T201
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"params": params, "results": rows}, indent=2) + "\n", encoding="utf-8"
    )
    print(f"wrote {args.out}")  # noqa: T201
    return 0 if all(r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
