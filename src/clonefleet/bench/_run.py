"""The benchmark run: the server, one warm Fleet, every batch size repeated for each system.

:func:`run_bench` measures and returns the report as JSON-ready data; it prints nothing (a
``progress`` callback hears what it is doing). The table and plot are drawn elsewhere.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from clonefleet.bench._measure import Sample, measure_actors, measure_clonefleet, measure_floor
from clonefleet.bench._procs import ProcWatch
from clonefleet.bench._report import machine, summarise, versions
from clonefleet.bench._server import Server
from clonefleet.config import Config, DurabilityConfig, ModelConfig, ProviderConfig
from clonefleet.errors import UsageError
from clonefleet.providers import SimLimits
from clonefleet.vocab import WORK_TOOLS

__all__ = [
    "BASELINES",
    "MAX_SYSTEM_TOKENS",
    "SYSTEMS",
    "BenchParams",
    "bench_config",
    "padded_definition",
    "run_bench",
    "server_limits",
    "steps",
]

BASELINES = ("floor", "actor-per-clone")
"""The baselines ``--baselines`` may name."""
SYSTEMS = ("clonefleet", *BASELINES)

MAX_SYSTEM_TOKENS = 200_000
"""The most ``--system-tokens`` pads a definition's body with."""

_ACTOR_MB_GUESS = 90.0
"""Memory of one actor before one was measured (a Ray worker process), in MB."""
_ACTOR_RATE_GUESS = 2.0
"""Actors started per second before any was measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchParams:
    """What ``clonefleet bench`` measures (docs/benchmarks.md)."""

    counts: tuple[int, ...] = (10, 100, 1000)
    """Batch sizes, in order."""
    turns: int = 2
    """Model requests per clone (the last one calls ``exit_tool``)."""
    latency_ms: float = 200.0
    """The simulated provider's delay per request, in milliseconds."""
    repeat: int = 3
    """Batches of each size per system; makespans are reported as median and spread."""
    address: str | None = None
    """Ray address (``None``: embedded local Ray)."""
    base_url: str | None = None
    """An OpenAI-compatible server to use instead of starting the simulated one."""
    baselines: tuple[str, ...] = BASELINES
    """Baselines measured in the same run."""
    seed: int = 0
    """Seed of the simulated provider."""
    journal: bool = True
    """Keep the scheduler's journal (as users run it)."""
    clones_per_actor: int | None = None
    """Override clonefleet's choice of clones per host actor."""
    floor_connections: int = 1000
    """Connections the floor's session opens at most (the pool of one clonefleet host)."""
    actor_max: int = 100
    """Largest batch the actor-per-clone baseline runs; larger ones are skipped."""
    time_limit_s: float = 600.0
    """Longest wait for one batch, in seconds."""
    rpm: int | None = None
    """Requests per minute the started server allows per model (``None``: no limit)."""
    tpm: int | None = None
    """Tokens per minute the started server allows per model (``None``: no limit)."""
    burst: int | None = None
    """Requests the server lets through at once after an idle spell (needs ``rpm``)."""
    limit_headers: bool = True
    """The server sends rate-limit headers and ``retry-after`` (``False``: bare 429s)."""
    client_rpm: int | None = None
    """``rpm`` of the provider in clonefleet's config (its own limit)."""
    client_tpm: int | None = None
    """``tpm`` of the provider in clonefleet's config."""
    system_tokens: int = 0
    """Tokens (words) of batch-wide text put ahead of the benched definition's body, so that
    the provider's prompt cache has a shared prefix to read (0: the definition as shipped)."""

    @property
    def limited(self) -> bool:
        """Whether the started server enforces a rate limit (the baselines are then not run)."""
        return self.rpm is not None or self.tpm is not None

    @property
    def measured_baselines(self) -> tuple[str, ...]:
        """The baselines run: none against a rate limit (they have no limiter of their own)."""
        return () if self.limited else self.baselines

    def check(self) -> None:
        """Raises:
        UsageError: a value out of range, an unknown baseline, or limits that do not fit."""
        _check_limits(self)
        if not self.counts or min(self.counts) < 1:
            raise UsageError("--count takes batch sizes of 1 or more")
        if self.turns < 1 or self.repeat < 1:
            raise UsageError("--turns and --repeat take whole numbers of 1 or more")
        if self.latency_ms < 0 or self.time_limit_s <= 0:
            raise UsageError("--latency-ms must be 0 or more and the time limit positive")
        if not 0 <= self.system_tokens <= MAX_SYSTEM_TOKENS:
            raise UsageError(f"--system-tokens takes 0 to {MAX_SYSTEM_TOKENS:,} tokens")
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise UsageError(f"unknown baseline {unknown[0]!r}; choose from {', '.join(BASELINES)}")


def _check_limits(params: BenchParams) -> None:
    for name in ("rpm", "tpm", "burst", "client_rpm", "client_tpm"):
        value = getattr(params, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} takes a whole number of 1 or more")
    if params.burst is not None and params.rpm is None:
        raise UsageError("--burst needs --rpm: the burst counts requests of the server's rpm")
    if not params.limit_headers and not params.limited:
        raise UsageError("--no-limit-headers needs --rpm or --tpm: without a limit there are none")
    if params.limited and params.base_url:
        raise UsageError(
            "--rpm, --tpm, --burst and --no-limit-headers set the limits of the server the bench "
            "starts; with --base-url the server is your own"
        )


Progress = Callable[[str, int], None]
"""``progress(text, steps_done)``: what the run is doing, and how many of :func:`steps` that
ended (1 after each batch, the repeats of a baseline skipped at a size, else 0)."""


def steps(params: BenchParams) -> int:
    """Batches the run makes at most (for a progress bar)."""
    return len(params.counts) * params.repeat * (1 + len(params.measured_baselines))


def server_limits(params: BenchParams) -> SimLimits | None:
    """The limits of the server the bench starts (``None``: none)."""
    if not params.limited:
        return None
    return SimLimits(
        rpm=params.rpm, tpm=params.tpm, burst=params.burst, headers=params.limit_headers
    )


_WORDS = (
    "shared reference text for every clone of the batch: conventions, layout, review rules, "
    "naming, error handling, tests, logging, style, examples and the glossary of the project"
).split()
_BODY = """You are clone {{ clone.number }} of {{ clone.count }} in batch {{ batch_id }}, working in {{ cwd }}.

Do exactly the task below, report progress with `progress_update` when you finish a step, and
end by calling `exit_tool` with `success` and a short `summary` of what you found or changed.

Task:
{{ prompt }}"""
_TOOLS = WORK_TOOLS[: WORK_TOOLS.index("shell") + 1]
"""The file tools and the shell: what the padded definition grants."""


def padded_definition(tokens: int) -> dict[str, Any]:
    """The inline definition ``--system-tokens`` benches as ``general-purpose``: the shipped
    one's tools and instructions after ``tokens`` words of text that is the same for every
    clone and every run (paragraphs of 200 words), so it is the batch's shared prefix."""
    words = [_WORDS[i % len(_WORDS)] for i in range(tokens)]
    paragraphs = [" ".join(words[i : i + 200]) for i in range(0, tokens, 200)]
    return {
        "description": "General-purpose subagent with a long shared system prompt (bench).",
        "body": "\n\n".join([*paragraphs, _BODY]),
        "tools": list(_TOOLS),
    }


def bench_config(params: BenchParams, base_url: str) -> Config:
    """The config the bench gives clonefleet: the server as provider ``srv`` (with the
    client-side limits), and with ``system_tokens`` the padded ``general-purpose``."""
    provider = ProviderConfig(
        kind="openai", base_url=base_url, rpm=params.client_rpm, tpm=params.client_tpm
    )
    subagents = (
        {"general-purpose": padded_definition(params.system_tokens)} if params.system_tokens else {}
    )
    return Config(
        providers={"srv": provider},
        models={"m": ModelConfig(provider="srv", name="sim")},
        model_groups={"default": ("m",)},
        durability=DurabilityConfig(enabled=params.journal),
        subagents=subagents,
    )


def run_bench(params: BenchParams, progress: Progress | None = None) -> dict[str, Any]:
    """Measure every batch size of ``params`` for clonefleet and the baselines.

    Returns:
        The report (docs/json.md, ``clonefleet bench``): ``params``, ``versions``, ``machine``,
        ``startup`` and one entry of ``results`` per batch size and system.

    Raises:
        UsageError: bad parameters.
        ClusterError: the server or Ray could not start.
    """
    from clonefleet.fleet import Fleet

    params.check()
    say: Progress = progress or (lambda _text, _steps: None)
    load_before = machine()["load_average"]
    server = Server(
        params.latency_ms, params.seed, params.turns, params.base_url, server_limits(params)
    )
    watch = ProcWatch(exclude={server.proc.pid} if server.proc else set())
    try:
        with tempfile.TemporaryDirectory(prefix="clonefleet-bench-") as cwd:
            say("starting Ray and the warm clone hosts", 0)
            p0 = time.perf_counter()
            fleet = Fleet(params.address, config=bench_config(params, server.base_url), cwd=cwd)
            try:
                startup = {"ray_start_s": round(time.perf_counter() - p0, 2)}
                p1 = time.perf_counter()
                startup["warm_hosts"] = fleet.wait_ready()
                startup["warm_hosts_s"] = round(time.perf_counter() - p1, 2)
                results = _sizes(fleet, server, watch, params, say)
            finally:
                fleet.close()
    finally:
        server.stop()
    return {
        "params": {**asdict(params), "server_url": server.base_url},
        "versions": versions(),
        "machine": {**machine(), "load_average_before": load_before},
        "startup": startup,
        "results": results,
    }


def _sizes(
    fleet: Any, server: Server, watch: ProcWatch, params: BenchParams, say: Progress
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    learned: dict[str, float] = {}
    for n in params.counts:
        samples: dict[str, list[Sample]] = {}
        samples["clonefleet"] = _repeat(
            "clonefleet",
            n,
            params,
            say,
            partial(measure_clonefleet, fleet, server, watch, n, params=params),
        )
        template = _template(server)
        for name in params.measured_baselines:
            reason = _skip(name, n, params, template, learned)
            if reason is not None:
                say(f"N={n} {name}: skipped ({reason})", params.repeat)
                results.append({"n": n, "system": name, "skipped": reason})
                continue
            samples[name] = _baseline(name, n, server, watch, template or {}, params, say)
            if name == "actor-per-clone":
                _learn(learned, n, samples[name])
        floor = samples.get("floor")
        results.extend(summarise(name, n, runs, params, floor) for name, runs in samples.items())
    return sorted(results, key=lambda r: (r["n"], SYSTEMS.index(r["system"])))


def _repeat(
    name: str, n: int, params: BenchParams, say: Progress, once: Callable[[], Sample]
) -> list[Sample]:
    runs = []
    for i in range(params.repeat):
        say(f"N={n} {name} {i + 1}/{params.repeat}", 0)
        runs.append(once())
        say(f"N={n} {name} {i + 1}/{params.repeat}: {runs[-1].makespan_s:.3f} s", 1)
    return runs


def _baseline(
    name: str,
    n: int,
    server: Server,
    watch: ProcWatch,
    template: dict[str, Any],
    params: BenchParams,
    say: Progress,
) -> list[Sample]:
    measure = measure_floor if name == "floor" else measure_actors
    counter = iter(range(params.repeat))

    def once() -> Sample:
        tag = f"{name}-{n}-{next(counter)}-{time.time_ns()}"
        return measure(server, watch, n, template, tag, params=params)

    return _repeat(name, n, params, say, once)


def _template(server: Server) -> dict[str, Any] | None:
    """The body of the first chat request a clone sent, without its ``user`` (the baselines
    replay it); ``None`` when the server cannot say."""
    stats = server.stats()
    if not stats or not stats.get("sample"):
        return None
    body: dict[str, Any] = json.loads(stats["sample"])
    body.pop("user", None)
    return body


def _skip(
    name: str, n: int, params: BenchParams, template: Any, learned: dict[str, float]
) -> str | None:
    """Why a baseline is not measured at size ``n`` (``None``: it is)."""
    if template is None:
        return "the server keeps no request to replay (/bench/stats); needs the benchmark's server"
    if name != "actor-per-clone":
        return None
    if n > params.actor_max:
        return f"N > {params.actor_max} (--actor-max): one process per clone"
    per_actor_mb = learned.get("mb_per_actor", _ACTOR_MB_GUESS)
    free_mb = _available_mb()
    if free_mb is not None and n * per_actor_mb > free_mb / 2:
        return f"needs ~{n * per_actor_mb:.0f} MB ({per_actor_mb:.0f} MB an actor), over half the {free_mb:.0f} MB free"
    rate = learned.get("actors_per_s", _ACTOR_RATE_GUESS)
    if n / rate > params.time_limit_s:
        return f"~{n / rate:.0f} s to start at {rate:.1f} actors/s, over the time limit"
    return None


def _learn(learned: dict[str, float], n: int, runs: list[Sample]) -> None:
    """Per-actor memory and start rate from a measured actor-per-clone size."""
    learned["mb_per_actor"] = max(max(r.added_rss_b for r in runs) / n / 1e6, 1.0)
    learned["actors_per_s"] = max(n / min(r.makespan_s for r in runs), 0.1)


def _available_mb() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1000
    except OSError:
        pass
    return None
