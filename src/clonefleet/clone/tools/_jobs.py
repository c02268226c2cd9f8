"""Job-control tools for subagents that may spawn: ``subagent``, ``job_status``, ``job_result``,
``job_cancel``, ``job_block``, ``list_jobs`` and ``message_subagent``.

Each tool calls one method of :class:`clonefleet.control.JobControl` (:data:`TOOL_METHODS`), so the
loop stays free of Ray: a clone host passes an actor-backed implementation, tests pass the
in-process scheduler core. A tool's parameters are its method's (``subagent``'s arguments are the
request). A clone whose subagent provider is ``fork`` gets the fork ``subagent``: same parameters,
the fork descriptions (:data:`FORK_DESCRIPTION`), and a request that carries the clone's completed
turns (docs/prompt-cache.md, "Fork spawns").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from clonefleet.clone.tools._table import Tool, ToolContext, ToolFn
from clonefleet.control import JobControl
from clonefleet.errors import ClonefleetError, ToolRetry
from clonefleet.providers import ToolSpec
from clonefleet.vocab import JOB_TOOLS, MESSAGE_TOOL, JobState

__all__ = ["FORK_DESCRIPTION", "TOOL_METHODS", "ForkSource", "job_tools"]

_BLOCK_SLICE_S = 30.0

TOOL_METHODS: dict[str, Callable[..., Any]] = {
    "subagent": JobControl.spawn_nested,
    "job_status": JobControl.job_status,
    "job_result": JobControl.job_result,
    "job_cancel": JobControl.job_cancel,
    "job_block": JobControl.job_block,
    "list_jobs": JobControl.list_jobs,
}
"""The job-control method each job tool calls."""


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_S, _N = {"type": "string"}, {"type": "number"}
_IDS = {"type": "array", "items": _S}


def _one_job(name: str, description: str) -> ToolSpec:
    return ToolSpec(name=name, description=description, parameters=_obj({"job_id": _S}, ["job_id"]))


_SPECS = {
    "subagent": ToolSpec(
        name="subagent",
        description=(
            "Delegate a self-contained task to a subagent (or `count` clones of it). Blocks until they finish "
            "and returns the result, unless `background` is true: then it returns job ids to poll."
        ),
        parameters=_obj(
            {
                "description": _S,
                "prompt": _S,
                "subagent_type": _S,
                "count": {"type": "integer", "minimum": 1},
                "model_override": _S,
                "cwd": _S,
                "background": {"type": "boolean"},
            },
            ["description", "prompt"],
        ),
    ),
    "job_status": _one_job("job_status", "Status of a job."),
    "job_result": _one_job("job_result", "Result of a finished job (error while it runs)."),
    "job_cancel": _one_job("job_cancel", "Cancel a job and its descendants (idempotent)."),
    "job_block": ToolSpec(
        name="job_block",
        description="Wait for jobs to finish, or until the time is up; returns their current statuses.",
        parameters=_obj({"job_ids": _IDS, "wait_seconds": _N, "timeout_seconds": _N}, ["job_ids"]),
    ),
    MESSAGE_TOOL: ToolSpec(
        name=MESSAGE_TOOL,
        description=(
            "Send a message to one of your running subagents (a job you started): it reads it at "
            "its next turn. Returns a delivery id and its status."
        ),
        parameters=_obj({"job_id": _S, "text": _S}, ["job_id", "text"]),
    ),
    "list_jobs": ToolSpec(
        name="list_jobs",
        description=(
            "List jobs (filter by status, batch, definition, parent, dataset row key) with "
            "capacity in use and queued and usage totals; pass limit for a page and the reply's "
            "next_cursor as cursor for the next."
        ),
        parameters=_obj(
            {
                "status": _S,
                "batch": _S,
                "agent": _S,
                "parent": _S,
                "key": _S,
                "cursor": _S,
                "limit": {"type": "integer", "minimum": 1},
            },
            [],
        ),
    ),
}


FORK_DESCRIPTION = (
    "Delegate a task to a subagent that INHERITS this conversation: a child agent seeded with all "
    "completed turns so far (it does not see the current in-flight turn), returning only its "
    "final result. Use this when the subtask builds on this conversation's context — a follow-up "
    "analysis, a review, a continuation — without consuming this conversation's context for the "
    "work itself. You receive only its final answer, not its intermediate steps."
)
"""The fork ``subagent`` tool's description, and its ``prompt`` parameter's."""


def _fork_spec(spawn: ToolSpec) -> ToolSpec:
    params = dict(spawn.parameters)
    props = dict(params["properties"])
    props["prompt"] = {"type": "string", "description": FORK_DESCRIPTION}
    return replace(spawn, description=FORK_DESCRIPTION, parameters={**params, "properties": props})


_FORK_SPEC = _fork_spec(_SPECS["subagent"])

_REQUEST_KEYS = ("description", "prompt", "subagent_type", "count", "model_override", "cwd")
"""The ``subagent`` arguments a spawn request carries (``background`` stays with the tool)."""


@dataclass(frozen=True, slots=True)
class ForkSource:
    """What the fork ``subagent`` tool takes from its clone: the clone's definition name and a
    call answering the fork part of a request (``messages``: the completed turns as
    ``message_json`` dicts, ``visible``: the tools shown in full, ``model``: the model in use)."""

    agent: str
    turns: Callable[[], dict[str, Any]]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _summarise(record: dict[str, Any]) -> str:
    if record["status"] != JobState.COMPLETED:
        # The loop puts "Error: " before a tool error: the model reads the exact text once.
        text = record.get("error") or "Error: subagent run failed"
        raise ToolRetry(text.removeprefix("Error: "))
    return _text(record["result"])


def _opt(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    return str(value) if value else None


class _Tools:
    def __init__(self, control: JobControl, job_id: str, fork: ForkSource | None) -> None:
        self.control, self.job_id, self.fork = control, job_id, fork

    def _request(self, args: dict[str, Any]) -> dict[str, Any]:
        request = {k: args[k] for k in _REQUEST_KEYS if k in args}
        if self.fork is None:
            return request
        # A fork's child policy is the configuration's, never the call's (docs/prompt-cache.md).
        wanted = args.get("subagent_type")
        if wanted and wanted != self.fork.agent:
            raise ToolRetry(
                f"a fork runs the caller's own definition ({self.fork.agent}), not {wanted!r}:"
                " leave subagent_type out"
            )
        if args.get("model_override"):
            raise ToolRetry("a fork runs on the caller's own model: leave model_override out")
        request["subagent_type"] = self.fork.agent
        request.pop("model_override", None)
        request["fork"] = self.fork.turns()
        return request

    async def subagent(self, args: dict[str, Any], ctx: ToolContext) -> str:
        out = await self.control.spawn_nested(self._request(args), self.job_id)
        ids = list(out["job_ids"])
        if args.get("background"):
            return json.dumps({"batch_id": out["batch_id"], "job_ids": ids})
        while not (await self.control.job_block(ids, _BLOCK_SLICE_S))["done"]:
            pass
        records = [await self.control.job_result(j) for j in ids]
        if len(records) == 1:
            return _summarise(records[0])
        return json.dumps(
            [
                {k: r[k] for k in ("job_id", "clone_index", "status", "result", "error")}
                for r in records
            ],
            default=str,
        )

    async def job_status(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return _text(await self.control.job_status(str(args["job_id"])))

    async def job_result(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return _text(await self.control.job_result(str(args["job_id"])))

    async def job_cancel(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return _text(await self.control.job_cancel(str(args["job_id"])))

    async def job_block(self, args: dict[str, Any], ctx: ToolContext) -> str:
        ids = [str(j) for j in args.get("job_ids", [])]
        wait, timeout = args.get("wait_seconds"), args.get("timeout_seconds")
        return _text(await self.control.job_block(ids, wait, timeout))

    async def message_subagent(self, args: dict[str, Any], ctx: ToolContext) -> str:
        send = getattr(self.control, "message", None)
        if send is None:
            raise ToolRetry("messaging subagents is not available here")
        return _text(await send(str(args["job_id"]), str(args["text"]), sender=self.job_id))

    async def list_jobs(self, args: dict[str, Any], ctx: ToolContext) -> str:
        listing = await self.control.list_jobs(
            status=_opt(args, "status"),
            batch=_opt(args, "batch"),
            agent=_opt(args, "agent"),
            parent=_opt(args, "parent"),
            key=_opt(args, "key"),
            cursor=_opt(args, "cursor"),
            limit=args.get("limit"),
        )
        return _text(listing)


def job_tools(control: JobControl, job_id: str, fork: ForkSource | None = None) -> dict[str, Tool]:
    """The job-control tools bound to one clone's job (its children get it as parent); with
    ``fork``, ``subagent`` forks the clone (the fork descriptions, the clone's turns)."""
    impl = _Tools(control, job_id, fork)
    specs = {**_SPECS, "subagent": _FORK_SPEC} if fork is not None else _SPECS

    def guarded(name: str) -> ToolFn:
        method: ToolFn = getattr(impl, name)

        async def run(args: dict[str, Any], ctx: ToolContext) -> str:
            try:
                return await method(args, ctx)
            except ClonefleetError as exc:
                raise ToolRetry(str(exc)) from None

        return run

    return {name: Tool(spec=specs[name], run=guarded(name)) for name in (*JOB_TOOLS, MESSAGE_TOOL)}
