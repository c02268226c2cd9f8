"""The simulated model: deterministic, key-free, in-process (and behind `clonefleet provider serve`).

``SimBrain`` decides what the simulated model answers; it is pure and shared by the in-process
:class:`SimulatedModel` and the HTTP server. Default behaviour per clone: one ``progress_update``
call, then ``exit_tool`` with a payload built to satisfy the exit schema the request offers. A
script file replaces that with per-clone steps, one consumed per request attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from clonefleet.config import printable, read_regular_file, safe_load_yaml, yaml_problem
from clonefleet.errors import ConfigError, ModelBehaviorError, ModelHTTPError, ModelTimeout
from clonefleet.providers._protocol import ModelRequest, ModelResponse, Role, ToolCall, Usage
from clonefleet.providers._rate_headers import LimitReport, read_limits
from clonefleet.providers.sim._cache import (
    DEFAULT_CACHE_MIN_TOKENS,
    DEFAULT_CACHE_TTL_S,
    PromptCache,
)
from clonefleet.providers.sim._limits import (
    SimLimiter,
    SimLimits,
    openai_limit_headers,
    request_cost,
)
from clonefleet.providers.sim._prefix import request_prefixes, text_tokens
from clonefleet.vocab import Outcome, status_family

__all__ = ["SimBrain", "SimScript", "SimStep", "SimulatedModel", "instance_from_schema"]

MAX_SCRIPT_BYTES = 8 * 1024 * 1024
"""A simulation script larger than this is refused without being parsed."""

_STEP_KEYS = {
    "tool",
    "args",
    "text",
    "error",
    "retry_after",
    "hang",
    "drip",
    "malformed",
    "latency_ms",
    "refuse",
    "html",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SimStep:
    """One scripted answer (or fault) of the simulated model."""

    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    text: str | None = None
    error: int | None = None
    retry_after: float | None = None
    hang: bool = False
    drip: bool = False
    malformed: bool = False
    refuse: bool = False
    latency_ms: float | None = None
    html: bool = False
    """Answer with an HTML page (a proxy's error page with ``error``, else a 200 page)."""

    @property
    def is_fault(self) -> bool:
        return self.error is not None or self.hang or self.drip or self.malformed or self.html


@dataclass(frozen=True, slots=True, kw_only=True)
class SimScript:
    """Per-clone step lists: ``clones[i]`` for clone *i*, else ``default``."""

    default: tuple[SimStep, ...] = ()
    clones: dict[int, tuple[SimStep, ...]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> SimScript:
        """Read a script file: a regular file of at most 8 MiB, YAML within the bounds of
        ``clonefleet.config.BoundedSafeLoader`` (nesting, alias expansion, integer size).

        Raises:
            ConfigError: unreadable, not a regular file, too large, not YAML, or a bad step.
        """
        where = printable(str(path))
        try:
            raw = read_regular_file(path, MAX_SCRIPT_BYTES)
        except OSError as exc:
            raise ConfigError(
                f"cannot read simulation script: {exc.strerror or exc}", where
            ) from None
        try:
            data = safe_load_yaml(raw.decode("utf-8")) or {}
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"cannot read simulation script: not UTF-8 text (byte {exc.start})", where
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"cannot read simulation script: not valid YAML: {yaml_problem(exc)}", where
            ) from None
        return cls.from_data(data, where)

    agents: dict[str, SimScript] = field(default_factory=dict)
    """Per-definition scripts (``agents: {name: {default, clones}}``), for nested spawns where
    parent and child clones share clone indexes; they win over ``default``/``clones``."""

    @classmethod
    def from_data(cls, data: Any, path: str = "<script>") -> SimScript:
        if not isinstance(data, dict) or not set(data) <= {"default", "clones", "agents"}:
            raise ConfigError(
                "a script is a mapping with `default`, `clones` and/or `agents`", path
            )
        clones_raw = data.get("clones") or {}
        if not isinstance(clones_raw, dict):
            raise ConfigError("`clones` maps a clone index to a list of steps", path, "clones")
        clones = {
            _index(k, path): _steps(v, path, printable(f"clones.{k}"))
            for k, v in clones_raw.items()
        }
        agents_raw = data.get("agents") or {}
        if not isinstance(agents_raw, dict) or any(
            not isinstance(v, dict) or "agents" in v for v in agents_raw.values()
        ):
            raise ConfigError(
                "`agents` maps a definition name to a script without `agents`", path, "agents"
            )
        agents = {str(name): cls.from_data(sub, path) for name, sub in agents_raw.items()}
        return cls(
            default=_steps(data.get("default") or [], path, "default"), clones=clones, agents=agents
        )

    def steps_for(self, clone_index: int, agent: str | None = None) -> tuple[SimStep, ...] | None:
        if agent is not None and agent in self.agents:
            return self.agents[agent].steps_for(clone_index)
        if clone_index in self.clones:
            return self.clones[clone_index]
        return self.default or None


def _index(raw: Any, path: str) -> int:
    key = printable(f"clones.{raw}")
    try:
        index = int(raw)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"clone index {printable(repr(raw))} is not a whole number", path, key
        ) from None
    if index < 0 or isinstance(raw, bool):
        raise ConfigError(f"clone index {printable(repr(raw))} must be 0 or more", path, key)
    return index


_STEP_TYPES: dict[str, tuple[type, ...]] = {
    "tool": (str,),
    "args": (dict,),
    "text": (str,),
    "error": (int,),
    "retry_after": (int, float),
    "latency_ms": (int, float),
    **dict.fromkeys(("hang", "drip", "malformed", "refuse", "html"), (bool,)),
}


def _steps(raw: Any, path: str, key: str) -> tuple[SimStep, ...]:
    if not isinstance(raw, list):
        raise ConfigError("steps must be a list", path, key)
    out = []
    for i, step in enumerate(raw):
        if not isinstance(step, dict) or not set(step) <= _STEP_KEYS:
            raise ConfigError(
                f"step {i} must be a mapping of {sorted(_STEP_KEYS)}", path, f"{key}.{i}"
            )
        for name, value in step.items():
            kinds = _STEP_TYPES[name]
            if value is not None and (
                not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))
            ):
                raise ConfigError(
                    f"step {i}: `{name}` must be {' or '.join(k.__name__ for k in kinds)}",
                    path,
                    f"{key}.{i}.{name}",
                )
        if step.get("error") is not None and not 400 <= step["error"] <= 599:
            raise ConfigError(
                f"step {i}: `error` must be an HTTP error status (400-599)",
                path,
                f"{key}.{i}.error",
            )
        for name in ("retry_after", "latency_ms"):
            value = step.get(name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(
                    f"step {i}: `{name}` must be a finite number of 0 or more",
                    path,
                    f"{key}.{i}.{name}",
                )
        out.append(
            SimStep(
                **{
                    k: v
                    for k, v in step.items()
                    if v is not None or k in ("error", "retry_after", "latency_ms")
                }
            )
        )
    return tuple(out)


def instance_from_schema(schema: dict[str, Any], summary: str) -> Any:
    """Build a value that satisfies a (simple) JSON Schema, preferring successful statuses."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        for value in schema["enum"]:
            if isinstance(value, str) and status_family(value) is Outcome.SUCCESS:
                return value
        return schema["enum"][0]
    for combo in ("oneOf", "anyOf", "allOf"):
        if schema.get(combo):
            return instance_from_schema(schema[combo][0], summary)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {name: _field_value(name, sub, summary) for name, sub in props.items()}
    if kind == "array":
        item = schema.get("items", {"type": "string"})
        return [instance_from_schema(item, summary) for _ in range(schema.get("minItems", 0))]
    return _scalar(kind, summary, schema)


def _field_value(name: str, sub: dict[str, Any], summary: str) -> Any:
    if name == "success" and sub.get("type") == "boolean":
        return True
    if name in ("status", "kind", "outcome") and sub.get("type") == "string" and "enum" not in sub:
        return "completed"
    return instance_from_schema(sub, summary)


def _scalar(kind: str, summary: str, schema: dict[str, Any]) -> Any:
    if kind == "boolean":
        return True
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "null":
        return None
    return summary


class SimBrain:
    """Decides the simulated model's answer to one request (pure apart from a step counter)."""

    def __init__(
        self,
        *,
        script: SimScript | None = None,
        seed: int = 0,
        fail_rate: float = 0.0,
        rate_429: float = 0.0,
    ) -> None:
        self.script, self.seed, self.fail_rate, self.rate_429 = script, seed, fail_rate, rate_429
        self._attempts: dict[str, int] = {}

    def next_step(self, req: ModelRequest) -> SimStep:
        """Return the step answering ``req`` (consumes one scripted step per call)."""
        key = f"{req.metadata.get('batch_id', '')}/{req.metadata.get('clone_index', 0)}"
        attempt = self._attempts.get(key)
        if attempt is None:
            # A clone resumed from a checkpoint on a fresh host goes on where its script was:
            # one step per model turn already in its context.
            attempt = sum(m.role is Role.ASSISTANT for m in req.messages)
        self._attempts[key] = attempt + 1
        rng = random.Random(_digest(self.seed, key, attempt))
        roll = rng.random()
        if roll < self.rate_429:
            return SimStep(error=429, retry_after=0)
        if roll < self.rate_429 + self.fail_rate:
            return SimStep(error=503)
        steps = (
            self.script.steps_for(
                int(req.metadata.get("clone_index", 0)), req.metadata.get("agent")
            )
            if self.script
            else None
        )
        if steps is not None:
            if attempt < len(steps):
                return _with_last_job(steps[attempt], req)
            return SimStep(text="script exhausted")
        return self._default_step(req)

    def _default_step(self, req: ModelRequest) -> SimStep:
        index = req.metadata.get("clone_index", 0)
        task = next((m.content for m in req.messages if m.role is Role.USER), "")
        first_line = task.strip().splitlines()[0][:80] if task.strip() else "(empty task)"
        called = {c.name for m in req.messages for c in m.tool_calls}
        tool_names = {t.name for t in req.tools}
        if "progress_update" in tool_names and "progress_update" not in called:
            return SimStep(
                tool="progress_update", args={"summary": f"clone {index}: working on the task"}
            )
        summary = f"clone {index} ({req.model}) finished: {first_line}"
        exit_spec = next((t for t in req.tools if t.name == "exit_tool"), None)
        if exit_spec is None:
            return SimStep(text=summary)
        return SimStep(tool="exit_tool", args=instance_from_schema(exit_spec.parameters, summary))


def _digest(seed: int, key: str, attempt: int) -> int:
    raw = hashlib.blake2b(f"{seed}:{key}:{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(raw, "big")


def step_to_response(step: SimStep, req: ModelRequest, call_number: int) -> ModelResponse:
    """Turn a non-fault step into a response; usage is a rough word count."""
    calls: tuple[ToolCall, ...] = ()
    if step.tool:
        calls = (ToolCall(id=f"call_{call_number}", name=step.tool, arguments=dict(step.args)),)
    words = sum(text_tokens(m.content) for m in req.messages)
    out = len((step.text or "").split()) + 8 * len(calls)
    return ModelResponse(
        text=step.text or "",
        tool_calls=calls,
        usage=Usage(input_tokens=words, output_tokens=out),
        model=req.model,
        refusal=step.refuse,
    )


class SimulatedModel:
    """The simulated provider in-process: no network, deterministic per (batch, clone index).

    With ``rpm`` or ``tpm`` set, each model gets the token buckets of :class:`SimLimits`
    (``burst`` as there); a request they refuse raises ``ModelHTTPError(429)`` carrying the wait
    as its ``retry_after_s`` (``None`` when ``limit_headers`` is off), as a 429 over HTTP would.
    With ``cache_ttl_s`` above 0 it has a prompt cache of its own, written automatically as the
    OpenAI wire's is (prefixes of ``cache_min_tokens`` or more), whose reads and writes fill the
    usage's ``cache_read_tokens`` and ``cache_write_tokens`` (docs/prompt-cache.md). ``clock`` is
    the limiter's and the cache's clock, in seconds.

    Raises:
        ValueError: a limit is not a positive whole number, ``burst`` comes without ``rpm``, or
            ``cache_min_tokens`` is below 1.
    """

    def __init__(
        self,
        brain: SimBrain | None = None,
        *,
        latency_ms: float = 0.0,
        hang_s: float = 3600.0,
        rpm: int | None = None,
        tpm: int | None = None,
        burst: int | None = None,
        limit_headers: bool = True,
        clock: Callable[[], float] = time.monotonic,
        cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
        cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
    ) -> None:
        self.brain = brain or SimBrain()
        self.latency_ms, self.hang_s = latency_ms, hang_s
        self._calls = 0
        limits = SimLimits(rpm=rpm, tpm=tpm, burst=burst, headers=limit_headers)
        self.limiter = SimLimiter(limits, clock) if limits.enabled else None
        self.cache = (
            PromptCache(ttl_s=cache_ttl_s, min_tokens=cache_min_tokens, clock=clock)
            if cache_ttl_s > 0
            else None
        )
        """The prompt cache (``None``: off)."""

    async def request(self, req: ModelRequest) -> ModelResponse:
        limits: LimitReport | None = None
        if self.limiter is not None:
            admission = self.limiter.admit(req.model, request_cost(req))
            if admission.admitted and self.limiter.limits.headers:
                limits = read_limits(openai_limit_headers(admission), time.time())
            if not admission.admitted:
                raise ModelHTTPError(
                    429,
                    f"rate limit of {admission.binding} per minute reached for {req.model}",
                    admission.retry_after_s if self.limiter.limits.headers else None,
                    error_type=sim_error_type(429),
                )
        step = self.brain.next_step(req)
        self._calls += 1
        delay = step.latency_ms if step.latency_ms is not None else self.latency_ms
        if delay:
            await asyncio.sleep(delay / 1000)
        if step.hang or step.drip:
            # In-process there is no socket to drip over; both look like a request that never
            # completes, which the caller's overall deadline turns into ModelTimeout.
            await asyncio.sleep(self.hang_s)
            raise ModelTimeout("simulated request hung")
        if step.malformed or (step.html and step.error is None):
            raise ModelBehaviorError("simulated provider returned a malformed response")
        if step.error is not None:
            raise ModelHTTPError(
                step.error,
                "simulated failure",
                step.retry_after,
                error_type=sim_error_type(step.error),
            )
        response = step_to_response(step, req, self._calls)
        if self.cache is not None:
            response = self._cached(response, req)
        return response if limits is None else dataclasses.replace(response, limits=limits)

    def _cached(self, response: ModelResponse, req: ModelRequest) -> ModelResponse:
        """``response`` with the cache's reads and writes for ``req`` in its usage."""
        assert self.cache is not None
        usage = response.usage
        if usage.input_tokens < self.cache.min_tokens:
            return response  # too short to be written or read: no need to look
        use = self.cache.automatic(req.model, request_prefixes(req))
        if not (use.read or use.write):
            return response
        read = min(use.read, usage.input_tokens)
        usage = replace(
            usage,
            cache_read_tokens=read,
            cache_write_tokens=min(use.write, usage.input_tokens - read),
        )
        return replace(response, usage=usage)


_SIM_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_api_key",
    403: "permission_denied",
    429: "rate_limit_exceeded",
}


def sim_error_type(status: int) -> str:
    """The error kind the simulated server's OpenAI wire names for ``status`` (its ``code``)."""
    return _SIM_ERROR_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )


LAST_JOB = "$last_job"
"""A step argument with this value becomes the first job id (``sa_`` + 8 hex) in the latest tool
result of the conversation: a script can act on a subagent it started (``message_subagent``,
``job_status``...)."""
_JOB_ID = re.compile(r"sa_[0-9a-f]{8}")


def _with_last_job(step: SimStep, req: ModelRequest) -> SimStep:
    if LAST_JOB not in step.args.values():
        return step
    found = ""
    for message in reversed(req.messages):
        if message.role is Role.TOOL:
            match = _JOB_ID.search(message.content or "")
            found = match.group(0) if match else ""
            break
    args = {k: (found if v == LAST_JOB else v) for k, v in step.args.items()}
    return replace(step, args=args)
