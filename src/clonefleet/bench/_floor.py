"""The floor: a hand-written single-process asyncio loop making the requests the clones make.

One ``aiohttp`` session, N agents all at once. Each agent replays the body of a clone's first
chat request (captured by the benchmark's server; only ``user`` changes), then, turn after turn,
appends the model's answer and a result for each tool call, as a hand-written loop would, until
the model calls ``exit_tool`` or the turns run out. :func:`agent_loop` is also what each actor of
the actor-per-clone baseline runs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["agent_loop", "run_floor"]


async def agent_loop(
    session: Any, url: str, template: dict[str, Any], user: str, turns: int
) -> str | None:
    """One agent: up to ``turns`` requests; ``None`` when it ended with ``exit_tool``, else
    what went wrong (an error class name or ``no exit_tool``)."""
    import aiohttp

    body = {**template, "messages": list(template["messages"]), "user": user}
    try:
        for _ in range(turns):
            async with session.post(url, json=body) as resp:
                resp.raise_for_status()
                message = (await resp.json())["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            if any(c["function"]["name"] == "exit_tool" for c in calls):
                return None
            body["messages"].append(message)
            body["messages"].extend(
                {"role": "tool", "tool_call_id": c["id"], "content": "recorded"} for c in calls
            )
    except (aiohttp.ClientError, KeyError, ValueError, TypeError) as exc:
        return type(exc).__name__
    return "no exit_tool"


async def run_floor(
    n: int,
    url: str,
    template: dict[str, Any],
    tag: str,
    *,
    turns: int,
    connections: int,
    time_limit_s: float,
) -> dict[str, Any]:
    """N agents in this process over one session; returns makespan, CPU and errors."""
    import aiohttp

    errors: list[str] = []

    async def one(i: int) -> None:
        error = await agent_loop(session, url, template, f"{tag}/{i}", turns)
        if error is not None:
            errors.append(error)

    cpu0 = time.process_time()
    t0, p0 = time.time(), time.perf_counter()
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=time_limit_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        try:
            async with asyncio.timeout(time_limit_s), asyncio.TaskGroup() as tg:
                for i in range(n):
                    tg.create_task(one(i))
        except TimeoutError:
            errors.append(f"exceeded {time_limit_s:g}s")
        makespan = time.perf_counter() - p0
    return {
        "t0": t0,
        "makespan_s": makespan,
        "cpu_s": time.process_time() - cpu0,
        "errors": errors,
    }
