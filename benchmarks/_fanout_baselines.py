"""The fan-out benchmark's reference: a hand-written asyncio loop doing what the clones do.

One process, one ``aiohttp`` session, N agents all at once, each sending the two chat-completion
requests a clone sends (see ``benchmarks/fanout.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _fanout_report import percentile, rounded
from _fanout_server import Server

__all__ = ["run_baseline"]


async def run_baseline(
    n: int, server: Server, template: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """N agents in one process, each two sequential requests, all at once over one session."""
    import aiohttp

    url = f"{server.base_url}/chat/completions"
    tag = f"base{n}-{int(time.time())}"
    errors: list[str] = []

    async def agent(i: int) -> None:
        body = {**template, "messages": list(template["messages"]), "user": f"{tag}/{i}"}
        try:
            async with session.post(url, json=body) as resp:
                resp.raise_for_status()
                message = (await resp.json())["choices"][0]["message"]
            body["messages"].append(message)
            for call in message.get("tool_calls") or []:
                body["messages"].append(
                    {"role": "tool", "tool_call_id": call["id"], "content": "progress recorded"}
                )
            async with session.post(url, json=body) as resp:
                resp.raise_for_status()
                final = (await resp.json())["choices"][0]["message"]
            if not any(c["function"]["name"] == "exit_tool" for c in final.get("tool_calls") or []):
                errors.append("no exit_tool")
        except (aiohttp.ClientError, KeyError, ValueError) as exc:
            errors.append(type(exc).__name__)

    connector = aiohttp.TCPConnector(limit=args.baseline_limit)
    cpu0 = time.process_time()
    t0, p0 = time.time(), time.perf_counter()
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        try:
            async with asyncio.timeout(args.time_limit_s), asyncio.TaskGroup() as tg:
                for i in range(n):
                    tg.create_task(agent(i))
        except TimeoutError:
            errors.append(f"exceeded {args.time_limit_s:g}s")
        makespan = time.perf_counter() - p0
    firsts = [
        (ts - t0) * 1000 for ts in server.stats(prefix=f"{tag}/")["first_request_at"].values()
    ]
    return {
        "baseline_s": round(makespan, 3),
        "baseline_cpu_s": round(time.process_time() - cpu0, 2),
        "baseline_errors": len(errors),
        "baseline_error_kinds": sorted(set(errors)),
        "baseline_first_request_p50_ms": rounded(percentile(firsts, 0.50)),
        "baseline_first_request_p99_ms": rounded(percentile(firsts, 0.99)),
    }
