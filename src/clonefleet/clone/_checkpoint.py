"""Clone checkpoints: a clone's state after a finished turn as plain data, and its restore.

The clone hands its state over as a :class:`CloneState`; :func:`checkpoint_data` makes plain
data of it (dicts with string keys, lists, strings, numbers, booleans and ``None``, so the
scheduler can journal it as msgpack or JSON). :func:`read_checkpoint` takes it back and trusts
nothing: every field is checked before the clone applies any, and a checkpoint that fails a
check leaves the clone as a fresh start. What a checkpoint holds: docs/durability.md, "Clone
checkpoints".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type hints

from clonefleet.clone.exit._judge import ExitJudge
from clonefleet.clone.tools._todos import check_todos
from clonefleet.providers import Message, Role, ToolCall, Usage

__all__ = [
    "CHECKPOINT_VERSION",
    "CloneState",
    "checkpoint_data",
    "message_from_json",
    "message_json",
    "pack_state",
    "read_checkpoint",
    "state_of",
]

CHECKPOINT_VERSION = 1
"""The checkpoint format; a checkpoint of another version is ignored (the clone starts afresh)."""

_ROLES = frozenset(str(r) for r in Role)


class _Malformed(ValueError):
    """A checkpoint field that fails its check."""


def message_json(m: Message) -> dict[str, Any]:
    """One message as plain data; fields at their defaults are left out."""
    out: dict[str, Any] = {"role": str(m.role), "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    if m.is_error:
        out["is_error"] = True
    if m.pinned:
        out["pinned"] = True
    if m.cache_break:
        out["cache_break"] = True
    return out


def message_from_json(data: Any) -> Message:
    """The message :func:`message_json` wrote.

    Raises:
        ValueError: ``data`` is not such a message.
    """
    role = data.get("role") if isinstance(data, dict) else None
    if not isinstance(role, str) or role not in _ROLES:
        raise _Malformed("a message needs a known role")
    calls = data.get("tool_calls", [])
    if not isinstance(calls, list):
        raise _Malformed("a message's tool_calls must be a list")
    return Message(
        role=Role(role),
        content=_typed(data.get("content", ""), str, "message content"),
        tool_calls=tuple(_tool_call(c) for c in calls),
        tool_call_id=_optional_str(data.get("tool_call_id"), "tool_call_id"),
        name=_optional_str(data.get("name"), "message name"),
        is_error=_typed(data.get("is_error", False), bool, "is_error"),
        pinned=_typed(data.get("pinned", False), bool, "pinned"),
        cache_break=_typed(data.get("cache_break", False), bool, "cache_break"),
    )


def _tool_call(data: Any) -> ToolCall:
    if not isinstance(data, dict):
        raise _Malformed("a tool call must be a mapping")
    return ToolCall(
        id=_typed(data.get("id"), str, "tool call id"),
        name=_typed(data.get("name"), str, "tool call name"),
        arguments=_typed(data.get("arguments"), dict, "tool call arguments"),
    )


@dataclass(slots=True, kw_only=True)
class CloneState:
    """A clone's state after a finished turn: what its checkpoint holds."""

    turns: int
    usage: Usage
    messages: list[Message]
    summary: list[str]
    """One line per message compacted away, oldest first."""
    loaded_skills: dict[str, str]
    """The skills the clone loaded, name to body."""
    visible: set[str]
    """The tools the model sees (the others are deferred)."""
    judge: ExitJudge
    progress: dict[str, Any] | None
    todos: list[dict[str, Any]] | None
    model_name: str | None
    failover: dict[str, Any] | None
    """The failover model's cursor (``None``: the clone's model is a bare one)."""
    warnings: list[str]
    delivered: list[str]
    """Ids of the inbox deliveries taken into the context, in order."""


def checkpoint_data(job_id: str, state: CloneState) -> dict[str, Any]:
    """The checkpoint of job ``job_id`` in ``state``, as plain data.

    Lists are copied shallowly; what they hold (strings, message dicts, the progress dict, the
    todo list, tool arguments) is never changed in place by the loop, so it is shared rather
    than copied.
    """
    return {
        "v": CHECKPOINT_VERSION,
        "job_id": job_id,
        "turns": state.turns,
        "usage": {
            "input_tokens": state.usage.input_tokens,
            "output_tokens": state.usage.output_tokens,
            "cache_read_tokens": state.usage.cache_read_tokens,
            "cache_write_tokens": state.usage.cache_write_tokens,
        },
        "messages": [message_json(m) for m in state.messages],
        "summary": list(state.summary),
        "loaded_skills": list(state.loaded_skills),
        "visible": sorted(state.visible),
        "judge": state.judge.export_state(),
        "progress": state.progress,
        "todos": state.todos,
        "model_name": state.model_name,
        "failover": state.failover,
        "warnings": list(state.warnings),
        "delivered": list(state.delivered),
    }


def pack_state(state: dict[str, Any]) -> bytes | dict[str, Any]:
    """A checkpoint as it travels and is kept: msgpack bytes, packed once by its clone's host.

    The scheduler keeps and journals the bytes as they are (no walk over the messages, a fraction
    of the memory of the dicts), and only a restart unpacks them (:func:`state_of`). A state
    msgpack cannot pack (nothing the loop makes) stays a dict, as before.
    """
    try:
        return msgpack.packb(state, use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError):
        return state


def state_of(value: Any) -> dict[str, Any] | None:
    """The checkpoint in ``value`` (packed by :func:`pack_state`, or a dict) as a dict; ``None``
    when there is none or it cannot be unpacked (the job then starts afresh)."""
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            value = msgpack.unpackb(value, raw=False, strict_map_key=False)
        except Exception:  # noqa: BLE001 - msgpack raises many kinds; a bad checkpoint is none
            return None
    return value if isinstance(value, dict) else None


def read_checkpoint(
    data: Any,
    *,
    job_id: str,
    exit_schema: dict[str, Any],
    skill_catalog: Mapping[str, tuple[str, str]],
    tools: Collection[str],
) -> CloneState:
    """The state in checkpoint ``data`` (packed or a dict) of job ``job_id``, every field checked.

    Skills are taken from ``skill_catalog`` (name to description and body) and visible tools
    kept only when in ``tools``: a checkpoint names them, the clone's definition grants them.

    Raises:
        ValueError: the checkpoint cannot be unpacked, is of another job or format version, or
            fails a check (the message says which).
        TypeError: a check that missed a shape.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        data = state_of(data)
        if data is None:
            raise _Malformed("it cannot be unpacked")
    if not isinstance(data, Mapping):
        raise _Malformed(f"not a mapping but {type(data).__name__}")
    version = data.get("v")
    if version != CHECKPOINT_VERSION or isinstance(version, bool):
        raise _Malformed(f"unknown format version {str(version)[:20]!r}")
    if data.get("job_id") != job_id:
        raise _Malformed("it belongs to another job")
    messages = [message_from_json(m) for m in _typed(data.get("messages"), list, "messages")]
    if not messages:
        raise _Malformed("it holds no messages")
    usage = _typed(data.get("usage"), dict, "usage")
    judge = ExitJudge(exit_schema)
    judge.restore_state(_typed(data.get("judge"), dict, "judge"))
    skills = _strings(data.get("loaded_skills"), "loaded_skills")
    progress, todos = data.get("progress"), data.get("todos")
    return CloneState(
        turns=_count(data.get("turns"), "turns"),
        usage=Usage(
            input_tokens=_count(usage.get("input_tokens"), "input_tokens"),
            output_tokens=_count(usage.get("output_tokens"), "output_tokens"),
            cache_read_tokens=_count(usage.get("cache_read_tokens", 0), "cache_read_tokens"),
            cache_write_tokens=_count(usage.get("cache_write_tokens", 0), "cache_write_tokens"),
        ),
        messages=messages,
        summary=_strings(data.get("summary"), "summary"),
        loaded_skills={n: skill_catalog[n][1] for n in skills if n in skill_catalog},
        visible=set(_strings(data.get("visible"), "visible")) & set(tools),
        judge=judge,
        progress=None if progress is None else _typed(progress, dict, "progress"),
        todos=None if todos is None else check_todos(todos),
        model_name=_optional_str(data.get("model_name"), "model_name"),
        failover=_optional(data.get("failover"), dict, "failover"),
        warnings=_strings(data.get("warnings"), "warnings"),
        delivered=_strings(data.get("delivered"), "delivered"),
    )


def _typed(value: Any, kind: type[Any], what: str) -> Any:
    # bool is an int: an int field never takes one, a bool field is asked for by name.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _Malformed(f"{what} must be of type {kind.__name__}")
    return value


def _optional(value: Any, kind: type[Any], what: str) -> Any:
    return None if value is None else _typed(value, kind, what)


def _optional_str(value: Any, what: str) -> str | None:
    return None if value is None else _typed(value, str, what)


def _count(value: Any, what: str) -> int:
    if _typed(value, int, what) < 0:
        raise _Malformed(f"{what} must not be negative")
    return value  # type: ignore[no-any-return]


def _strings(value: Any, what: str) -> list[str]:
    items = _typed(value, list, what)
    if not all(isinstance(s, str) for s in items):
        raise _Malformed(f"{what} must hold only strings")
    return list(items)  # a copy: the loop appends to some, and the caller keeps the checkpoint
