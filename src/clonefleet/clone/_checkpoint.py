"""Clone checkpoints: a clone's state after a finished turn as plain data, and its restore.

A checkpoint is what a restarted clone needs to continue the run on another host
(docs/durability.md): its context, compaction summary, loaded skills, visible tools, exit judge
counters, usage, turn count, progress, todo list, model and failover cursor, warnings and the ids
of the inbox deliveries already in its context. It holds only dicts with string keys, lists, strings,
numbers, booleans and ``None``, so the scheduler can journal it as msgpack or JSON.

A checkpoint comes back from disk, so :func:`restore` trusts nothing: every field is checked
before any is applied, and a checkpoint that fails a check leaves the clone as a fresh start.
This module is the loop's companion: it reads and writes the :class:`Clone`'s own state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]  # msgpack ships no type hints

from clonefleet.clone._failover import FailoverModel
from clonefleet.clone.exit._judge import ExitJudge
from clonefleet.clone.tools._todos import check_todos
from clonefleet.providers import Message, Role, ToolCall, Usage

if TYPE_CHECKING:
    from clonefleet.clone._loop import Clone

__all__ = [
    "CHECKPOINT_VERSION",
    "message_from_json",
    "message_json",
    "pack_state",
    "restore",
    "snapshot",
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
    )


def _tool_call(data: Any) -> ToolCall:
    if not isinstance(data, dict):
        raise _Malformed("a tool call must be a mapping")
    return ToolCall(
        id=_typed(data.get("id"), str, "tool call id"),
        name=_typed(data.get("name"), str, "tool call name"),
        arguments=_typed(data.get("arguments"), dict, "tool call arguments"),
    )


def snapshot(clone: Clone) -> dict[str, Any]:
    """The clone's state after its latest finished turn, as plain data.

    Lists are copied shallowly; what they hold (strings, message dicts, the progress dict, the
    todo list, tool arguments) is never changed in place by the loop, so it is shared rather than copied.
    """
    model = clone.model
    return {
        "v": CHECKPOINT_VERSION,
        "job_id": clone.spec.job_id,
        "turns": clone.turns,
        "usage": {
            "input_tokens": clone.usage.input_tokens,
            "output_tokens": clone.usage.output_tokens,
        },
        "messages": [message_json(m) for m in clone.messages],
        "summary": list(clone._summary),
        "loaded_skills": list(clone._loaded_skills),
        "visible": sorted(clone._visible),
        "judge": clone.judge.export_state(),
        "progress": clone.progress,
        "todos": clone.todos,
        "model_name": clone.model_name,
        "failover": model.export_cursor() if isinstance(model, FailoverModel) else None,
        "warnings": list(clone.warnings),
        "delivered": list(clone.delivered),
    }


@dataclass(slots=True, kw_only=True)
class _Checked:
    """A checkpoint whose every field passed its check, ready to apply."""

    turns: int
    usage: Usage
    messages: list[Message]
    summary: list[str]
    loaded_skills: dict[str, str]
    visible: set[str]
    judge: ExitJudge
    progress: dict[str, Any] | None
    todos: list[dict[str, Any]] | None
    model_name: str | None
    failover: dict[str, Any] | None
    warnings: list[str]
    delivered: list[str]


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


def restore(clone: Clone, state: Any) -> bool:
    """Put ``clone`` (freshly built) in the state of checkpoint ``state``.

    Returns ``True`` when it did. A checkpoint of another job or format version, or one that
    fails a check, changes nothing but a warning in ``clone.warnings``: the clone starts afresh.
    """
    if isinstance(state, bytes | bytearray | memoryview):
        state = state_of(state)
        if state is None:
            clone.warnings.append(
                "checkpoint ignored, the run started afresh: it cannot be unpacked"
            )
            return False
    try:
        checked = _check(clone, state)
        if checked.failover is not None and isinstance(clone.model, FailoverModel):
            clone.model.restore_cursor(checked.failover)  # the last check: it changes the model
    except (ValueError, TypeError) as exc:  # TypeError: a check that missed a shape, still no crash
        clone.warnings.append(f"checkpoint ignored, the run started afresh: {exc}")
        return False
    clone.turns, clone.usage, clone.messages = checked.turns, checked.usage, checked.messages
    clone._summary, clone._loaded_skills = checked.summary, checked.loaded_skills
    clone._visible, clone.judge, clone.progress = checked.visible, checked.judge, checked.progress
    clone.model_name, clone.warnings = checked.model_name, checked.warnings
    clone.todos = checked.todos
    clone.delivered = checked.delivered
    return True


def _check(clone: Clone, state: Any) -> _Checked:
    if not isinstance(state, Mapping):
        raise _Malformed(f"not a mapping but {type(state).__name__}")
    version = state.get("v")
    if version != CHECKPOINT_VERSION or isinstance(version, bool):
        raise _Malformed(f"unknown format version {str(version)[:20]!r}")
    if state.get("job_id") != clone.spec.job_id:
        raise _Malformed("it belongs to another job")
    messages = [message_from_json(m) for m in _typed(state.get("messages"), list, "messages")]
    if not messages:
        raise _Malformed("it holds no messages")
    usage = _typed(state.get("usage"), dict, "usage")
    judge = ExitJudge(clone.spec.exit_schema)
    judge.restore_state(_typed(state.get("judge"), dict, "judge"))
    skills = _strings(state.get("loaded_skills"), "loaded_skills")
    progress, todos = state.get("progress"), state.get("todos")
    return _Checked(
        turns=_count(state.get("turns"), "turns"),
        usage=Usage(
            input_tokens=_count(usage.get("input_tokens"), "input_tokens"),
            output_tokens=_count(usage.get("output_tokens"), "output_tokens"),
        ),
        messages=messages,
        summary=_strings(state.get("summary"), "summary"),
        loaded_skills={n: clone.skill_catalog[n][1] for n in skills if n in clone.skill_catalog},
        visible=set(_strings(state.get("visible"), "visible")) & set(clone.tools),
        judge=judge,
        progress=None if progress is None else _typed(progress, dict, "progress"),
        todos=None if todos is None else check_todos(todos),
        model_name=_optional_str(state.get("model_name"), "model_name"),
        failover=_optional(state.get("failover"), dict, "failover"),
        warnings=_strings(state.get("warnings"), "warnings"),
        delivered=_strings(state.get("delivered"), "delivered"),
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
