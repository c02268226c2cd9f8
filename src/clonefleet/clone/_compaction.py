"""Context compaction: older turns of a clone's context folded into a short summary.

Kept verbatim: the system prompt, injected skills, the task, skills loaded with the ``skill``
tool, the latest progress snapshot and todo list (as reminders) and the last few messages; an earlier summary
is folded into the new one. Pure functions over :class:`~clonefleet.providers.Message` lists.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from clonefleet.providers import Message, Role

__all__ = ["compact", "context_tokens"]

_SUMMARY, _PROGRESS, _TODOS = "[summary of earlier work]", "[latest progress]", "[todo list]"
_SUMMARY_LINES = 40
"""Most lines of the compaction summary (one per compacted message, about 100 characters each)."""


def context_tokens(messages: list[Message]) -> int:
    """A cheap estimate: four characters a token."""
    return sum(len(m.content) + 40 * len(m.tool_calls) for m in messages) // 4


def compact(
    messages: list[Message],
    *,
    summary: list[str],
    loaded_skills: Mapping[str, str],
    progress: Any,
    todos: Any = None,
) -> tuple[list[Message], list[str], int] | None:
    """The compacted context, the new summary lines and how many messages were folded in.

    ``None`` when there is nothing old enough to fold (only pinned and recent messages).
    """
    reminders = (_SUMMARY, _PROGRESS, _TODOS)
    pinned = [m for m in messages if m.pinned and not m.content.startswith(reminders)]
    rest = [m for m in messages if not m.pinned]
    keep = _tail_from_user(rest, 4)
    dropped = rest[: len(rest) - len(keep)]
    if not dropped:
        return None
    summary = summary + [f"{m.role}: {_brief(m)}" for m in dropped if m.content or m.tool_calls]
    if len(summary) > _SUMMARY_LINES:  # keep how it started and what happened last
        head, tail = _SUMMARY_LINES // 4, _SUMMARY_LINES - _SUMMARY_LINES // 4 - 1
        summary = [*summary[:head], "...", *summary[-tail:]]
    extra = [Message(role=Role.USER, content=f"{_SUMMARY}\n" + "\n".join(summary), pinned=True)]
    pinned_text = {m.content for m in pinned}
    extra += [
        Message(role=Role.USER, content=f"[skill {n}]\n{b}", pinned=True)
        for n, b in loaded_skills.items()
        if f"[skill {n}]\n{b}" not in pinned_text
    ]
    if progress is not None:
        extra.append(
            Message(role=Role.USER, content=f"{_PROGRESS} {json.dumps(progress)}", pinned=True)
        )
    if todos:
        extra.append(Message(role=Role.USER, content=f"{_TODOS} {json.dumps(todos)}", pinned=True))
    return pinned + extra + keep, summary, len(dropped)


def _brief(m: Message) -> str:
    calls = ", ".join(c.name for c in m.tool_calls)
    text = " ".join(m.content.split())[:80]
    return f"{text} [called {calls}]" if calls else text


def _tail_from_user(messages: list[Message], n: int) -> list[Message]:
    """The last ``n``-ish messages, widened so a tool result never loses its assistant call."""
    start = max(len(messages) - n, 0)
    while start > 0 and messages[start].role is Role.TOOL:
        start -= 1
    return messages[start:]
