"""One measured batch of each system: clonefleet through a :class:`Fleet`, the floor, and the
actor-per-clone baseline. Each returns a :class:`Sample`; summarising repeats is elsewhere."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from clonefleet.bench._procs import ProcWatch
from clonefleet.bench._server import Server

__all__ = [
    "PROMPT",
    "Sample",
    "job_usage",
    "measure_actors",
    "measure_clonefleet",
    "measure_floor",
]

PROMPT = "Summarise file_{{ clone.index }}.py"
"""The task of every clone (rendered per clone)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One batch of one system."""

    makespan_s: float
    """From the start call until every clone or agent ended, in seconds."""
    completed: int
    """Clones or agents that ended successfully (``exit_tool``)."""
    cpu_s: float
    """CPU time of this process and its descendants (Ray's processes) during the batch,
    the server's excluded, in seconds."""
    added_rss_b: int
    """Peak resident memory of those processes during the batch minus just before, in bytes."""
    added_pss_b: int
    """The same in proportional set size (shared pages split), from the closing sample."""
    first_request_ms: list[float] = field(default_factory=list)
    """Per clone: from the start call to its first model request reaching the server."""
    requests: int | None = None
    """Model requests the server received during the batch, refused ones included (``None``: no
    stats route)."""
    errors: list[str] = field(default_factory=list)
    """What went wrong, one entry per failed clone or agent (empty when all succeeded)."""
    rate_limited: int | None = None
    """Requests the server refused with 429 during the batch (``None``: no stats route)."""
    answered: int | None = None
    """Requests the server answered ``ok`` during the batch (``None``: no stats route)."""
    tokens: int | None = None
    """Tokens the server's rate limits charged for the requests they let through during the
    batch (0 without limits; ``None``: no stats route)."""
    input_tokens: int | None = None
    """Input tokens of the batch's answered requests, cached or not (``None``: not known)."""
    cache_read_tokens: int | None = None
    """Of those, the tokens the provider read from its prompt cache (``None``: not known)."""


def _watched(
    watch: ProcWatch, server: Server, prefix: Callable[[], str], body: Callable[[], tuple[Any, ...]]
) -> Sample:
    """Run ``body() -> (t0, makespan_s, completed, errors)`` while sampling /proc; then read the
    server's first-request times of clones keyed ``prefix()``."""
    before = server.stats()
    idle = watch.sample()
    cpu_idle = dict(watch.cpu)
    watch.start()
    try:
        t0, makespan_s, completed, errors = body()
    finally:
        peak = watch.stop()
    after = server.stats(prefix=prefix())
    firsts = [(ts - t0) * 1000 for ts in (after or {}).get("first_request_at", {}).values()]
    requests = after["requests"] - before["requests"] if after and before else None
    return Sample(
        **_counted(before, after),
        makespan_s=makespan_s,
        completed=completed,
        cpu_s=sum(watch.cpu_by_kind(cpu_idle).values()),
        added_rss_b=max(peak.rss - idle.rss, 0),
        added_pss_b=max(peak.pss - idle.pss, 0),
        first_request_ms=firsts,
        requests=requests,
        errors=errors,
    )


def _counted(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """What the server's counters moved by during a batch: 429s, ``ok`` answers, tokens
    charged (each ``None`` where a server does not count it)."""

    def delta(read: Callable[[dict[str, Any]], Any]) -> int | None:
        if not before or not after:
            return None
        a, b = read(after), read(before)
        return None if a is None or b is None else int(a) - int(b)

    return {
        "rate_limited": delta(lambda s: s.get("rate_limited")),
        "answered": delta(lambda s: s.get("outcomes", {}).get("ok", 0)),
        "tokens": delta(lambda s: s.get("tokens_admitted")),
        "input_tokens": delta(lambda s: s.get("input_tokens")),
        "cache_read_tokens": delta(lambda s: s.get("cache_read_tokens")),
    }


def job_usage(fleet: Any, batch_id: str, sample: Sample) -> Sample:
    """``sample`` with the input and cache-read tokens of the batch's jobs, as its usage totals
    say, when there is a cache read to count (the server counted one, or cannot say) and the
    totals carry cache reads; else ``sample`` as it is, with the server's counts."""
    if sample.cache_read_tokens == 0:
        return sample  # nothing read from the cache: no need to ask
    listing = fleet.list_jobs(batch=batch_id, limit=1)
    totals = listing.get("totals", {}).get("batches", {}).get(batch_id, {})
    read, tin = totals.get("cache_read_tokens"), totals.get("input_tokens")
    if not isinstance(read, int) or not isinstance(tin, int):
        return sample
    return replace(sample, input_tokens=tin, cache_read_tokens=read)


def measure_clonefleet(
    fleet: Any, server: Server, watch: ProcWatch, n: int, *, params: Any
) -> Sample:
    """``fleet.spawn("general-purpose", ..., count=n)`` and ``job_block`` until every job ended."""
    batch_ids: list[str] = []

    def body() -> tuple[Any, ...]:
        t0, p0 = time.time(), time.perf_counter()
        batch = fleet.spawn(
            "general-purpose", PROMPT, count=n, clones_per_actor=params.clones_per_actor
        )
        batch_ids.append(batch.batch_id)
        block = fleet.job_block([batch.batch_id], timeout_seconds=params.time_limit_s)
        makespan = time.perf_counter() - p0
        outcomes = [f"{j['status']}/{j['outcome']}" for j in block["jobs"]]
        errors = [o for o in outcomes if o != "completed/success"]
        errors += ["not every job ended"] if not block["done"] else []
        return t0, makespan, len(outcomes) - len(errors), errors

    sample = _watched(watch, server, lambda: f"{batch_ids[0]}/" if batch_ids else "\x00", body)
    return job_usage(fleet, batch_ids[0], sample) if batch_ids else sample


def measure_floor(
    server: Server, watch: ProcWatch, n: int, template: dict[str, Any], tag: str, *, params: Any
) -> Sample:
    """The hand-written asyncio loop (:func:`run_floor`) in this process."""
    from clonefleet.bench._floor import run_floor

    def body() -> tuple[Any, ...]:
        out = asyncio.run(
            run_floor(
                n,
                f"{server.base_url}/chat/completions",
                template,
                tag,
                turns=params.turns,
                connections=params.floor_connections,
                time_limit_s=params.time_limit_s,
            )
        )
        return out["t0"], out["makespan_s"], n - len(out["errors"]), out["errors"]

    return _watched(watch, server, lambda: f"{tag}/", body)


def measure_actors(
    server: Server, watch: ProcWatch, n: int, template: dict[str, Any], tag: str, *, params: Any
) -> Sample:
    """One Ray actor per agent (:func:`run_actor_batch`), on the Fleet's Ray."""
    from clonefleet.bench.remote import run_actor_batch

    def body() -> tuple[Any, ...]:
        out = run_actor_batch(
            n,
            f"{server.base_url}/chat/completions",
            template,
            tag,
            turns=params.turns,
            time_limit_s=params.time_limit_s,
        )
        return out["t0"], out["makespan_s"], n - len(out["errors"]), out["errors"]

    return _watched(watch, server, lambda: f"{tag}/", body)
