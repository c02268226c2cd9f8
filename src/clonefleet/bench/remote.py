"""The Ray shell of the actor-per-clone baseline: one actor per agent, each running the floor's
agent loop (:func:`agent_loop`) in its own worker process."""

from __future__ import annotations

import time
from typing import Any

import ray

from clonefleet.bench._floor import agent_loop

__all__ = ["BaselineAgentActor", "run_actor_batch"]


@ray.remote(num_cpus=0, max_concurrency=1, max_restarts=0)
class BaselineAgentActor:
    async def run(self, url: str, template: dict[str, Any], user: str, turns: int) -> str | None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await agent_loop(session, url, template, user, turns)


def run_actor_batch(
    n: int, url: str, template: dict[str, Any], tag: str, *, turns: int, time_limit_s: float
) -> dict[str, Any]:
    """Start ``n`` actors, run one agent on each, wait for all (at most ``time_limit_s``) and
    kill them. Needs Ray initialised (the benchmark's Fleet started it)."""
    t0, p0 = time.time(), time.perf_counter()
    actors = [BaselineAgentActor.remote() for _ in range(n)]  # type: ignore[attr-defined]
    errors: list[str] = []
    try:
        refs = [a.run.remote(url, template, f"{tag}/{i}", turns) for i, a in enumerate(actors)]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=time_limit_s)
        makespan = time.perf_counter() - p0
        if pending:
            errors.append(f"exceeded {time_limit_s:g}s")
        for ref in done:
            try:
                error = ray.get(ref, timeout=10)
            except ray.exceptions.RayError as exc:
                error = type(exc).__name__
            if error is not None:
                errors.append(error)
    finally:
        for actor in actors:
            ray.kill(actor)
    return {"t0": t0, "makespan_s": makespan, "errors": errors}
