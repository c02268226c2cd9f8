"""The shared vocabulary: tool names, statuses, stop reasons, event types and record fields.

Every word that more than one layer speaks is written here once, and only here: the loader checks
definitions against these tool names, the clone loop emits these event types, the scheduler files
jobs under these states and the CLI prints these record fields. This module imports nothing but
the standard library, so every layer may import it (``docs/architecture.md``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

__all__ = [
    "CLAUDE_TOOL_ALIASES",
    "CONTROL_TOOLS",
    "EVENT_LEVELS",
    "JOB_TOOLS",
    "MESSAGE_TOOL",
    "PATH_TOOLS",
    "KNOWN_TOOLS",
    "MCP_ALL",
    "MCP_RESOURCE_TOOLS",
    "RUN_RECORD_FIELDS",
    "SEARCH_TOOLS",
    "SKILL_REF",
    "SPAWN_TOOLS",
    "STATUS_FAMILIES",
    "STOP_ERRORS",
    "UNDENIABLE_TOOLS",
    "WEB_TOOLS",
    "WORK_TOOLS",
    "EventType",
    "JobState",
    "Outcome",
    "StopReason",
    "canonical_tool",
    "is_mcp_grant",
    "run_record",
    "skill_refs",
    "status_family",
    "succeeded",
    "stop_error",
]

# -- tools --------------------------------------------------------------------------------------

WORK_TOOLS: tuple[str, ...] = (
    "file_read",
    "file_write",
    "file_edit",
    "list_dir",
    "glob",
    "grep",
    "shell",
    "shell_output",
    "shell_kill",
    "notebook_edit",
    "todo_write",
    "web_fetch",
    "web_search",
)
"""Work tools every clone host provides (the web tools answer an error until config enables them)."""

WEB_TOOLS: tuple[str, ...] = ("web_fetch", "web_search")
"""Work tools that reach the network: a clone gets them by default only when the config's ``web``
section enables them (``docs/config.md``)."""

PATH_TOOLS: tuple[str, ...] = (
    "file_read",
    "file_write",
    "file_edit",
    "notebook_edit",
    "list_dir",
    "glob",
    "grep",
)
"""Work tools whose ``path`` argument names a file or folder: permission rules such as
``Read(./src/**)`` match it (``docs/permissions.md``)."""

SEARCH_TOOLS: tuple[str, ...] = ("list_dir", "glob", "grep")
"""Tools that read below a folder; as in Claude Code, ``Read`` permission rules govern them too."""

CONTROL_TOOLS: tuple[str, ...] = ("exit_tool", "progress_update", "tool_search", "skill")
"""Tools every subagent gets whether or not its definition lists them."""

JOB_TOOLS: tuple[str, ...] = (
    "subagent",
    "job_status",
    "job_result",
    "job_cancel",
    "job_block",
    "list_jobs",
)
"""The job-control tools of a subagent allowed to spawn (they call the job-control API)."""

MESSAGE_TOOL = "message_subagent"
"""The tool a subagent allowed to spawn uses to message its own subagents while they run."""

SPAWN_TOOLS: tuple[str, ...] = (*JOB_TOOLS, MESSAGE_TOOL)
"""Tools a subagent gets only with ``allow_subagent_spawn: true``."""

UNDENIABLE_TOOLS: frozenset[str] = frozenset(
    ("exit_tool", "progress_update", "tool_search", "skill", *JOB_TOOLS)
)
"""Tools a definition's ``tools_deny`` may not name."""

MCP_RESOURCE_TOOLS: tuple[str, ...] = ("mcp_list_resources", "mcp_read_resource")
"""The tools that list and read the resources of a clone's MCP servers (``docs/mcp.md``)."""

MCP_ALL = "tag!ALL_MCP"
"""The grant of every tool of every MCP server a clone may use."""


def is_mcp_grant(name: str) -> bool:
    """Whether a granted tool name is an MCP one, which only a clone host can resolve:
    ``mcp__<server>__<tool>``, the ``mcp__<server>`` shorthand, ``tag!ALL_MCP`` or one of
    :data:`MCP_RESOURCE_TOOLS`."""
    return name.startswith("mcp__") or name == MCP_ALL or name in MCP_RESOURCE_TOOLS


KNOWN_TOOLS: frozenset[str] = frozenset(
    (*WORK_TOOLS, *CONTROL_TOOLS, *SPAWN_TOOLS, *MCP_RESOURCE_TOOLS, "switch_facet")
)
"""Every tool name the loader recognises without a warning (``switch_facet`` only to reject it)."""

CLAUDE_TOOL_ALIASES: dict[str, str] = {
    "Read": "file_read",
    "Write": "file_write",
    "Edit": "file_edit",
    "MultiEdit": "file_edit",
    "LS": "list_dir",
    "Glob": "glob",
    "Grep": "grep",
    "Bash": "shell",
    "BashOutput": "shell_output",
    "KillShell": "shell_kill",
    "KillBash": "shell_kill",
    "NotebookEdit": "notebook_edit",
    "TodoWrite": "todo_write",
    "WebFetch": "web_fetch",
    "WebSearch": "web_search",
    "Task": "subagent",
    "Agent": "subagent",
    "SendMessage": "message_subagent",
    "TaskCreate": "subagent",
    "TaskList": "list_jobs",
    "TaskGet": "job_status",
    "TaskUpdate": "job_cancel",
    "TaskOutput": "job_result",
    "TaskStop": "job_cancel",
    "Skill": "skill",
    "SlashCommand": "skill",
    "ToolSearch": "tool_search",
    "NotebookRead": "file_read",
    "ListMcpResourcesTool": "mcp_list_resources",
    "ReadMcpResourceTool": "mcp_read_resource",
}
"""Claude Code tool names and the tools they mean here (``TaskUpdate``: cancelling is the one
update a job takes here)."""


SKILL_REF = re.compile(r"(?<![\w@])@skill:([A-Za-z0-9_-]+(?:[.:][A-Za-z0-9_-]+)*)")
"""An ``@skill:NAME`` reference, in a spawn prompt or a message to a running clone."""


def skill_refs(text: str) -> list[str]:
    """The skill names ``text`` references as ``@skill:NAME``, in order of first mention."""
    return list(dict.fromkeys(SKILL_REF.findall(text)))


def canonical_tool(name: str) -> str:
    """The tool a name means here: a Claude Code alias becomes its tool, others stay."""
    return CLAUDE_TOOL_ALIASES.get(name, name)


# -- exit payloads --------------------------------------------------------------------------------


class Outcome(StrEnum):
    """What a finished run achieved, read off its exit payload."""

    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"


STATUS_FAMILIES: dict[Outcome, frozenset[str]] = {
    Outcome.SUCCESS: frozenset({"success", "ok", "done", "completed"}),
    Outcome.FAILURE: frozenset({"failure", "failed", "error"}),
    Outcome.CANCELLED: frozenset({"cancelled", "canceled", "cancel"}),
}
"""Recognised exit status strings (lower-cased) per outcome."""

_FAMILY_OF = {word: outcome for outcome, words in STATUS_FAMILIES.items() for word in words}


def status_family(word: str) -> Outcome | None:
    """The outcome a status string means (case-insensitive), or ``None`` when it is unrecognised."""
    return _FAMILY_OF.get(word.lower())


# -- jobs and runs --------------------------------------------------------------------------------


class JobState(StrEnum):
    """A job's status in the job table."""

    RESERVED = "reserved"
    """Accepted and waiting for a slot (or for its host to start it)."""
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StopReason(StrEnum):
    """Why a clone's run ended."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    TOKEN_LIMIT = "token_limit"
    """The run's token budget (``max_tokens``) ran out."""
    MAX_TURNS = "max_turns"
    """The run used every turn ``max_turns`` allows."""
    DECLINED = "declined"
    ABNORMAL = "abnormal"
    BUDGET = "budget"
    """The batch's token or dollar budget (``run --budget-tokens``/``--budget-usd``) was passed:
    the scheduler cancelled the run, or never started it."""


STOP_ERRORS: dict[StopReason, str] = {
    StopReason.CANCELLED: "Error: subagent run was cancelled",
    StopReason.FAILED: "Error: subagent run failed",
    StopReason.TOKEN_LIMIT: "Error: subagent run hit its token limit before finishing",
    StopReason.MAX_TURNS: "Error: subagent run hit its token limit before finishing",
    StopReason.DECLINED: "Error: subagent declined the task",
    StopReason.BUDGET: "Error: subagent run was cancelled: its batch passed its budget",
}
"""The exact error text a caller sees for each stop reason but ``abnormal`` (which carries its
reason) and ``completed`` (no error). A turn limit reads as the token-limit text: callers of the
``subagent`` tool know five error texts, and running out of turns is running out of budget."""


def stop_error(reason: StopReason, detail: str = "") -> str | None:
    """The caller-facing error text of a stop reason (``None`` for a completed run)."""
    if reason is StopReason.COMPLETED:
        return None
    if reason is StopReason.ABNORMAL:
        return f"Error: subagent run ended abnormally ({detail or 'unknown'})"
    return STOP_ERRORS[reason]


def succeeded(record: Mapping[str, Any]) -> bool:
    """Whether a run record or job status is a success: completed, with outcome ``success``.

    The exit status of ``clonefleet run`` and ``jobs wait`` is 0 only when every job succeeded.
    """
    return bool(record["status"] == JobState.COMPLETED and record["outcome"] == Outcome.SUCCESS)


RUN_RECORD_FIELDS: tuple[str, ...] = (
    "job_id",
    "batch_id",
    "agent",
    "clone_index",
    "key",
    "status",
    "stop_reason",
    "outcome",
    "result",
    "salvaged",
    "nonconforming",
    "concerns",
    "warnings",
    "error",
    "model",
    "turns",
    "usage",
    "cause",
)
"""The fields of one ``run --json`` record, in order (``docs/json.md``)."""


def run_record(source: object, **overrides: Any) -> dict[str, Any]:
    """The ``run --json`` record of anything with those attributes, ``overrides`` winning.

    The one place the record is built: a clone's result, a job of the table and a crashed job's
    record all go through it, so they cannot drift apart.
    """
    out = {
        name: overrides[name] if name in overrides else getattr(source, name)
        for name in RUN_RECORD_FIELDS
    }
    # Plain strings on the wire: enum members cost more to pickle and to decode.
    for name in ("status", "stop_reason", "outcome"):
        if out[name] is not None:  # a job still running has no stop reason or outcome yet
            out[name] = str(out[name])
    out["concerns"], out["warnings"] = list(out["concerns"]), list(out["warnings"])
    out["usage"] = dict(out["usage"])
    return out


# -- events ---------------------------------------------------------------------------------------


class EventType(StrEnum):
    """The ``type`` of a clone's event (inside a ``subagent_event`` envelope)."""

    QUEUED = "queued"
    STARTED = "started"
    ASSISTANT = "assistant"
    TOOL_CALL_START = "tool_call_start"
    TOOL_CALL_END = "tool_call_end"
    USAGE = "usage"
    PROGRESS = "progress"
    TODO = "todo"
    """The clone's whole todo list after a ``todo_write`` call."""
    COMPACTION = "compaction"
    MODEL_FAILOVER = "model_failover"
    RATE_LIMITED = "rate_limited"
    """A provider refused one of the clone's requests for its rate: the request waits for
    capacity (docs/rate-limits.md)."""
    MESSAGE_QUEUED = "message_queued"
    MESSAGE_DELIVERED = "message_delivered"
    MESSAGE_UNDELIVERED = "message_undelivered"
    RESTARTED = "restarted"
    """The job's clone host died and the clone was started again from its last checkpoint."""
    HOST_PENDING = "host_pending"
    """The job's clone host asks the cluster for resources no node has free yet (an autoscaler
    may be adding a node); the clone starts when the host does (docs/cluster.md, "Capacity")."""
    BUDGET = "budget"
    """The scheduler saw its batch's usage pass the batch's budget (on the job whose usage did)."""
    RESULT = "result"
    ERROR = "error"
    FINAL = "_final"
    """Internal: a clone host's last word on a job (its run record); never shown to clients."""
    CHECKPOINT = "_checkpoint"
    """Internal: a clone's state after its latest finished turn, for a restart on another host
    (docs/durability.md); never shown to clients."""
    ENVELOPE = "subagent_event"
    """The envelope every event travels in."""


_LIFECYCLE = frozenset(
    {
        EventType.QUEUED,
        EventType.STARTED,
        EventType.PROGRESS,
        EventType.TODO,
        EventType.RESULT,
        EventType.ERROR,
        EventType.MODEL_FAILOVER,
        EventType.RATE_LIMITED,
        EventType.MESSAGE_QUEUED,
        EventType.MESSAGE_DELIVERED,
        EventType.MESSAGE_UNDELIVERED,
        EventType.COMPACTION,
        EventType.RESTARTED,
        EventType.HOST_PENDING,
        EventType.BUDGET,
    }
)
_TOOLS = _LIFECYCLE | {EventType.TOOL_CALL_START, EventType.TOOL_CALL_END}

EVENT_LEVELS: dict[str, frozenset[str]] = {
    "lifecycle": frozenset(str(e) for e in _LIFECYCLE),
    "tools": frozenset(str(e) for e in _TOOLS),
    "all": frozenset(str(e) for e in _TOOLS | {EventType.ASSISTANT, EventType.USAGE}),
}
"""Event types shown at each verbosity of ``clonefleet events --level``."""
