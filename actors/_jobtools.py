"""Job-control tools for subagents that may spawn: ``subagent``, ``job_status``, ``job_result``,
``job_cancel``, ``job_block`` and ``list_jobs``.

The tools talk to the scheduler through the small :class:`JobControl` protocol, so the loop stays
free of Ray: a clone host passes an actor-backed implementation, tests pass an in-process one.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from ..errors import ClonefleetError, ToolRetry
from ..providers import ToolSpec
from ._tools import Tool, ToolContext

__all__ = ["JOB_TOOL_NAMES", "JobControl", "job_tools"]

JOB_TOOL_NAMES = ("subagent", "job_status", "job_result", "job_cancel", "job_block", "list_jobs")
_BLOCK_SLICE_S = 30.0


class JobControl(Protocol):
    """What a spawning clone may ask of the scheduler."""

    async def spawn(self, request: dict[str, Any], parent_job_id: str) -> dict[str, Any]: ...
    async def job_status(self, job_id: str) -> dict[str, Any]: ...
    async def job_result(self, job_id: str) -> dict[str, Any]: ...
    async def job_cancel(self, job_id: str) -> dict[str, Any]: ...
    async def job_block(
        self, job_ids: list[str], wait_seconds: float | None, timeout_seconds: float | None
    ) -> dict[str, Any]: ...
    async def list_jobs(self, **filters: Any) -> dict[str, Any]: ...


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_S, _N = {"type": "string"}, {"type": "number"}
_IDS = {"type": "array", "items": _S}
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
    "job_status": ToolSpec(
        name="job_status",
        description="Status of a job.",
        parameters=_obj({"job_id": _S}, ["job_id"]),
    ),
    "job_result": ToolSpec(
        name="job_result",
        description="Result of a finished job (error while it runs).",
        parameters=_obj({"job_id": _S}, ["job_id"]),
    ),
    "job_cancel": ToolSpec(
        name="job_cancel",
        description="Cancel a job and its descendants (idempotent).",
        parameters=_obj({"job_id": _S}, ["job_id"]),
    ),
    "job_block": ToolSpec(
        name="job_block",
        description="Wait for jobs to finish, or until the time is up; returns their current statuses.",
        parameters=_obj({"job_ids": _IDS, "wait_seconds": _N, "timeout_seconds": _N}, ["job_ids"]),
    ),
    "list_jobs": ToolSpec(
        name="list_jobs",
        description="List jobs (filter by status, batch, definition, parent) with capacity in use and queued.",
        parameters=_obj({"status": _S, "batch": _S, "agent": _S, "parent": _S}, []),
    ),
}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _summarise(record: dict[str, Any]) -> str:
    if record["status"] != "completed":
        raise ToolRetry(record.get("error") or "Error: subagent run failed")
    return _text(record["result"])


class _Tools:
    def __init__(self, control: JobControl, job_id: str) -> None:
        self.control, self.job_id = control, job_id

    async def subagent(self, args: dict[str, Any], ctx: ToolContext) -> str:
        out = await self.control.spawn(dict(args), self.job_id)
        ids = list(out["job_ids"])
        if args.get("background"):
            return json.dumps({"batch_id": out["batch_id"], "job_ids": ids})
        while not (await self.control.job_block(ids, _BLOCK_SLICE_S, None))["done"]:
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
        return _text(
            await self.control.job_block(ids, args.get("wait_seconds"), args.get("timeout_seconds"))
        )

    async def list_jobs(self, args: dict[str, Any], ctx: ToolContext) -> str:
        filters = {k: args[k] for k in ("status", "batch", "agent", "parent") if args.get(k)}
        return _text(await self.control.list_jobs(**filters))


def job_tools(control: JobControl, job_id: str) -> dict[str, Tool]:
    """The job-control tools bound to one clone's job (its children get it as parent)."""
    impl = _Tools(control, job_id)

    def guarded(name: str) -> Any:
        method = getattr(impl, name)

        async def run(args: dict[str, Any], ctx: ToolContext) -> str:
            try:
                return await method(args, ctx)
            except ClonefleetError as exc:
                raise ToolRetry(str(exc)) from None

        return run

    return {name: Tool(spec=_SPECS[name], run=guarded(name)) for name in JOB_TOOL_NAMES}
