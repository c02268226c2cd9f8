"""Test support for clonefleet users and its own tests: fake models and a fake clock.

``FunctionModel`` lets a test say what the model does in a few lines; ``ScriptedModel`` replays
a fixed list of responses (or errors) and checks that all were used; ``FakeClock`` advances only
when told to. ``LocalHost`` runs clones in-process for a scheduler core; ``InstantHost`` runs
none: their events and results are ready at once (to measure the scheduler alone).
``NetnsCluster`` runs a Ray cluster of several machines on one Linux box, each machine a network
namespace on a private bridge (root only; docs/cluster.md, "A cluster on one Linux machine").
"""

from __future__ import annotations

import asyncio
import inspect
import time
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from clonefleet.clone import CloneSpec, state_of
from clonefleet.config import Config
from clonefleet.definitions import DEFAULT_EXIT_SCHEMA
from clonefleet.errors import ClusterError
from clonefleet.journal import Journal
from clonefleet.planning import BatchSubmission
from clonefleet.providers import ModelRequest, ModelResponse, SimScript, ToolCall, Usage
from clonefleet.scheduler import Durable, SchedulerCore, read_table
from clonefleet.testing._netns import Machine, NetnsCluster, in_netns, netns_unsupported
from clonefleet.vocab import EventType, JobState, Outcome, StopReason

__all__ = [
    "PER_TURN",
    "FakeClock",
    "FunctionModel",
    "InstantHost",
    "LocalHost",
    "LocalHosts",
    "Machine",
    "NetnsCluster",
    "ScriptedModel",
    "batch_config",
    "call",
    "crash_core",
    "instant_events",
    "make_spec",
    "make_submission",
    "in_netns",
    "netns_unsupported",
    "public_methods",
    "signature_shape",
    "open_journaled_core",
    "reply",
    "wait_until",
]


def signature_shape(fn: object) -> list[tuple[str, object, object, object]]:
    """A method's parameters after ``self`` (name, kind, default, resolved type) and its return
    type: what two implementations of one protocol call must agree on. Ray's tracing adds a
    ``_ray_trace_ctx`` keyword to an actor class's methods; it is not ours, so it is left out."""
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    hints = typing.get_type_hints(fn, include_extras=True)
    params = [
        (p.name, p.kind, p.default, hints.get(p.name))
        for p in sig.parameters.values()
        if p.name != "_ray_trace_ctx"
    ]
    return [*params[1:], ("return", None, None, hints.get("return"))]


def public_methods(cls: type) -> set[str]:
    """The names of a class's public methods, class and static methods included."""
    found = set()
    for name in dir(cls):
        member = inspect.getattr_static(cls, name)
        if not name.startswith("_") and (
            inspect.isfunction(member) or isinstance(member, classmethod | staticmethod)
        ):
            found.add(name)
    return found


class FunctionModel:
    """A model whose answer is ``fn(request)`` (sync or async)."""

    def __init__(
        self, fn: Callable[[ModelRequest], ModelResponse | Awaitable[ModelResponse]]
    ) -> None:
        self.fn = fn
        self.calls: list[ModelRequest] = []

    async def request(self, req: ModelRequest) -> ModelResponse:
        self.calls.append(req)
        out = self.fn(req)
        if inspect.isawaitable(out):
            out = await out
        return out


class ScriptedModel:
    """Replays ``steps`` in order: a :class:`ModelResponse` is returned, an exception raised."""

    def __init__(self, steps: Sequence[ModelResponse | BaseException]) -> None:
        self.steps = list(steps)
        self.calls: list[ModelRequest] = []

    async def request(self, req: ModelRequest) -> ModelResponse:
        if len(self.calls) >= len(self.steps):
            raise AssertionError(
                f"ScriptedModel asked for step {len(self.calls) + 1} of {len(self.steps)}"
            )
        step = self.steps[len(self.calls)]
        self.calls.append(req)
        if isinstance(step, BaseException):
            raise step
        return step

    def assert_complete(self) -> None:
        left = len(self.steps) - len(self.calls)
        assert left == 0, f"{left} scripted step(s) were never requested"


class FakeClock:
    """A monotonic clock that moves only on :meth:`advance`; ``sleep`` advances it instantly."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def call(name: str, call_id: str = "c1", **arguments: Any) -> ToolCall:
    """A tool call, for building scripted responses."""
    return ToolCall(id=call_id, name=name, arguments=arguments)


def reply(
    text: str = "", *calls: ToolCall, tokens: int = 10, refusal: bool = False
) -> ModelResponse:
    """A model response with text and/or tool calls."""
    return ModelResponse(
        text=text,
        tool_calls=tuple(calls),
        usage=Usage(input_tokens=tokens, output_tokens=tokens),
        refusal=refusal,
    )


def make_spec(**fields: Any) -> CloneSpec:
    """A minimal valid :class:`CloneSpec` for loop tests; keywords override fields."""
    base: dict[str, Any] = {
        "job_id": "sa_00000000",
        "batch_id": "b_test",
        "agent": "tester",
        "clone_index": 0,
        "clone_count": 1,
        "instructions": "You test things.",
        "task": "do the thing",
        "exit_schema": DEFAULT_EXIT_SCHEMA,
    }
    base.update(fields)
    return CloneSpec(**base)


class LocalHost:
    """An in-process clone host for :class:`~clonefleet.scheduler.SchedulerCore` tests (no Ray):
    the calls of :class:`~clonefleet.host.HostCalls` and ``watch``, over a
    :class:`~clonefleet.host.HostCore`."""

    def __init__(self, host_id: str, control: Any = None) -> None:
        from clonefleet.host import HostCore

        self.host_id = host_id
        self.core = HostCore(control=control)
        self.closed = False
        self.dead = False
        self.starts = 0
        self._gone: asyncio.Event | None = None
        self.resumed: dict[str, Any] = {}
        """Checkpoints this host was asked to resume from (unpacked), by job id."""
        self._job_ids: list[str] = []
        """Every job this host was asked to start."""

    def _alive(self) -> None:
        if self.dead:
            raise ClusterError(f"clone host {self.host_id} is gone: killed")

    def kill(self) -> None:
        """Die as a process would: its clones stop and no event of theirs is ever seen again."""
        self.dead = True
        if self._gone is not None:
            self._gone.set()
        self.core.cancel(self._job_ids)

    async def start(
        self,
        specs: Sequence[CloneSpec],
        config: Config,
        sim_script: SimScript | None = None,
        resume: Mapping[str, dict[str, Any]] | None = None,
    ) -> int:
        self._alive()
        self.starts += 1
        self.resumed.update({k: state_of(v) for k, v in (resume or {}).items()})
        self._job_ids += [spec.job_id for spec in specs]
        return self.core.start(specs, config, sim_script, resume)

    async def watch(self) -> None:
        """Return only when the host is killed, raising :class:`ClusterError`."""
        if self._gone is None:
            self._gone = asyncio.Event()
        if not self.dead:
            await self._gone.wait()
        self._alive()

    async def cancel(self, job_ids: Sequence[str]) -> list[str]:
        self._alive()
        return self.core.cancel(job_ids)

    async def deliver(self, items: Sequence[Mapping[str, Any]]) -> int:
        self._alive()
        return self.core.deliver(items)

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        self._alive()
        out = await self.core.drain(wait_s)
        self._alive()
        return out

    async def plan(self, planner: Callable[[], tuple[CloneSpec, ...]]) -> tuple[CloneSpec, ...]:
        return await self.core.plan(planner)

    async def close(self) -> None:
        self.closed = True
        await self.core.aclose()


_TURN_KINDS = (EventType.ASSISTANT, EventType.TOOL_CALL_START, EventType.TOOL_CALL_END)
PER_TURN = (*(str(kind) for kind in _TURN_KINDS), str(EventType.USAGE))
"""The events :class:`InstantHost` yields per turn of a clone."""


def instant_events(job_id: str, turns: int) -> list[dict[str, Any]]:
    """One clone's events as a host drains them (``started``, per turn :data:`PER_TURN`, then
    its final result), each ``{"job_id", "event"}``."""
    now = time.time()
    started = {"type": str(EventType.STARTED), "ts": now, "model": "sim-small"}
    events: list[dict[str, Any]] = [started]
    for turn in range(1, turns + 1):
        events += [{"type": kind, "ts": now, "turn": turn} for kind in PER_TURN]
        events[-1].update(model="sim-small", input_tokens=100, output_tokens=8, total_tokens=108)
    usage = {"input_tokens": 100 * turns, "output_tokens": 8 * turns, "total_tokens": 108 * turns}
    result: dict[str, Any] = {"status": str(JobState.COMPLETED), "outcome": str(Outcome.SUCCESS)}
    result.update(stop_reason=str(StopReason.COMPLETED), result={"answer": "done"}, turns=turns)
    result.update(usage=usage, model="sim-small")
    events.append({"type": str(EventType.FINAL), "ts": now, "result": result})
    return [{"job_id": job_id, "event": e} for e in events]


class InstantHost:
    """A clone host (:class:`~clonefleet.host.HostCalls`) whose clones end at once:
    :meth:`start` queues each clone's events (see :func:`instant_events`) for the next
    :meth:`drain`. ``InstantHost.factory(turns)`` makes a host factory for
    :class:`~clonefleet.scheduler.SchedulerCore`."""

    def __init__(self, host_id: str, control: Any = None, turns: int = 2) -> None:
        self.host_id, self.turns = host_id, turns
        self.drains: list[int] = []
        """The size of each non-empty drain."""
        self._events: list[dict[str, Any]] = []
        self._ready = asyncio.Event()

    @classmethod
    def factory(cls, turns: int = 2) -> Callable[[str, Any], InstantHost]:
        return lambda host_id, control: cls(host_id, control, turns)

    async def start(
        self,
        specs: Sequence[CloneSpec],
        config: Config,
        sim_script: SimScript | None = None,
        resume: Mapping[str, dict[str, Any]] | None = None,
    ) -> int:
        for spec in specs:
            self._events += instant_events(spec.job_id, self.turns)
        self._ready.set()
        return len(specs)

    async def drain(self, wait_s: float = 1.0) -> list[dict[str, Any]]:
        if not self._events:
            self._ready.clear()
            try:
                async with asyncio.timeout(wait_s):
                    await self._ready.wait()
            except TimeoutError:
                return []
        out, self._events = self._events, []
        self.drains.append(len(out))
        return out

    async def cancel(self, job_ids: Sequence[str]) -> list[str]:
        return []

    async def deliver(self, items: Sequence[Mapping[str, Any]]) -> int:
        return 0

    async def plan(self, planner: Callable[[], tuple[CloneSpec, ...]]) -> tuple[CloneSpec, ...]:
        return planner()

    async def close(self) -> None:
        return None


class LocalHosts:
    """A host factory for :class:`~clonefleet.scheduler.SchedulerCore` that makes
    :class:`LocalHost` instances and remembers them (to kill one, or count its starts)."""

    def __init__(self) -> None:
        self.made: list[LocalHost] = []

    def __call__(self, host_id: str, control: Any) -> LocalHost:
        self.made.append(LocalHost(host_id, control))
        return self.made[-1]

    def host(self, host_id: str) -> LocalHost:
        return next(h for h in self.made if h.host_id == host_id)


def batch_config(
    *,
    restarts: int | None = None,
    checkpoint_s: float | None = None,
    latency_ms: int | None = None,
    models: dict[str, Any] | None = None,
) -> Config:
    """A config for test batches: ``limits.max_restarts``, ``durability.checkpoint_interval_s``,
    the simulated provider's ``latency_ms`` and ``models`` when given, the defaults otherwise."""
    fields: dict[str, Any] = {}
    if restarts is not None:
        fields["limits"] = {"max_restarts": restarts}
    if checkpoint_s is not None:
        fields["durability"] = {"checkpoint_interval_s": checkpoint_s}
    if latency_ms is not None:
        fields["providers"] = {
            "sim": {"kind": "simulated", "simulated": {"latency_ms": latency_ms}}
        }
    if models is not None:
        fields["models"] = models
    return Config(**fields)


def make_submission(
    core: Any,
    count: int,
    *,
    config: Config | None = None,
    script: SimScript | dict[str, Any] | None = None,
    cap: int | None = None,
    per: int | None = None,
    parent: str | None = None,
    budget_tokens: int | None = None,
    budget_usd: float | None = None,
    **settings: Any,
) -> BatchSubmission:
    """A batch of ``count`` test clones with ids reserved from ``core``: under ``config``, or
    one :func:`batch_config` makes of ``settings``; nested under job ``parent`` (one level down)
    when given; with the batch's cap ``cap``, ``per`` clones per host and a budget when given."""
    if config is None:
        config = batch_config(**settings)
    elif settings:
        raise TypeError(f"give a config or its settings, not both: {sorted(settings)}")
    batch_id, ids = core.reserve_ids(count)
    specs = tuple(
        make_spec(
            job_id=j,
            batch_id=batch_id,
            clone_index=i,
            clone_count=count,
            **({"parent": parent, "depth": 1} if parent is not None else {}),
        )
        for i, j in enumerate(ids)
    )
    return BatchSubmission(
        batch_id=batch_id,
        specs=specs,
        config=config,
        sim_script=SimScript.from_data(script) if isinstance(script, dict) else script,
        max_concurrency=cap,
        clones_per_actor=per,
        budget_tokens=budget_tokens,
        budget_usd=budget_usd,
    )


async def wait_until(predicate: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail after ``limit_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def open_journaled_core(folder: Any, hosts: LocalHosts) -> tuple[SchedulerCore, Journal, Any]:
    """A scheduler core over the journal in ``folder`` (group commit every 10 ms), with the job
    table its replay folds to (what a restarted scheduler restores from)."""
    journal, replay = Journal.open(folder)
    journal.start_background(0.01)
    core = SchedulerCore(hosts, durable=Durable(journal))
    return core, journal, read_table(replay)


def crash_core(core: SchedulerCore, journal: Journal, hosts: LocalHosts) -> None:
    """The scheduler's process dies: its hosts die with it, its journal file is let go."""
    for host in hosts.made:
        host.kill()
    for task in core.tasks:
        task.cancel()
    journal.close()
