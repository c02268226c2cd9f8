"""The ``todo_write`` tool: a clone's own todo list, replaced whole by each call.

The list lives in the clone's :class:`~clonefleet.clone.tools._tool.CloneToolState`; each call
emits a ``todo`` event with the whole list, which the scheduler keeps on the job (``todos`` in
the job status) as it keeps the latest progress, and the clone's checkpoint keeps it too. The
list is bounded: :data:`MAX_TODOS` items of at most :data:`MAX_TODO_CHARS` characters per text.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from clonefleet.clone.tools._tool import ToolContext

__all__ = ["MAX_TODO_CHARS", "MAX_TODOS", "TODO_FIELDS", "TODO_SCHEMA", "check_todos", "todo_tool"]

MAX_TODOS = 100
"""Items one todo list may hold."""
MAX_TODO_CHARS = 1000
"""Characters of one item's ``content`` (and of its ``activeForm``)."""
TODO_STATUSES = ("pending", "in_progress", "completed")

_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_TODO_CHARS}
TODO_FIELDS: dict[str, dict[str, Any]] = {
    "content": {**_TEXT, "description": "what is to be done, imperative: 'Run the tests'"},
    "status": {"type": "string", "enum": list(TODO_STATUSES)},
    "activeForm": {**_TEXT, "description": "the same while it is done: 'Running the tests'"},
    "id": {"type": "string", "maxLength": 100},
    "priority": {"type": "string", "enum": ["high", "medium", "low"]},
}
"""The fields of one item (``id`` and ``priority`` are accepted for older Claude prompts)."""

TODO_SCHEMA: dict[str, Any] = {
    "type": "array",
    "maxItems": MAX_TODOS,
    "items": {
        "type": "object",
        "properties": TODO_FIELDS,
        "required": ["content", "status"],
        "additionalProperties": False,
    },
}
"""The ``todos`` argument: the whole new list."""


def check_todos(value: Any) -> list[dict[str, Any]]:
    """``value`` when it is a todo list within the bounds (a checkpoint's, read back from disk).

    Raises:
        ValueError: it is not.
    """
    if not isinstance(value, list) or len(value) > MAX_TODOS:
        raise ValueError(f"todos must be a list of at most {MAX_TODOS} items")
    for item in value:
        if not isinstance(item, dict) or set(item) - set(TODO_FIELDS):
            raise ValueError("a todo must be a mapping of known fields")
        if item.get("status") not in TODO_STATUSES:
            raise ValueError("a todo's status must be pending, in_progress or completed")
        for key, text in item.items():
            if not isinstance(text, str) or len(text) > MAX_TODO_CHARS:
                raise ValueError(f"a todo's {key} must be text of at most {MAX_TODO_CHARS} chars")
    return [dict(item) for item in value]


async def todo_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    state = ctx.clone_state("todo_write")
    todos = [dict(item) for item in args["todos"]]
    state.set_todos(todos)
    counts = Counter(t["status"] for t in todos)
    done = ", ".join(f"{counts[s]} {s.replace('_', ' ')}" for s in TODO_STATUSES if counts[s])
    return f"todo list updated: {len(todos)} items" + (f" ({done})" if done else "")
