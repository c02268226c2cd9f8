"""One clone's state behind its stateful work tools: the todo list and the background shells.

A :class:`CloneServices` is made on the clone's first tool call, and each piece inside it only on
its tool's first use, so a clone that never calls ``todo_write`` or starts a background shell
pays nothing for them (a host runs thousands of clones in one process). The clone closes it when
its run ends, however it ends: every background shell is killed then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clonefleet.clone.tools._background_shell import ShellRegistry
from clonefleet.errors import ToolRetry

__all__ = ["CloneServices", "Todos"]

Todos = list[dict[str, Any]]
"""A todo list: ``[{content, status, activeForm?}]`` (``_todos``)."""


class CloneServices:
    """The todo list and background shells of one clone.

    Args:
        on_todos: called with the whole new list after each ``todo_write`` (the clone emits a
            ``todo`` event).
    """

    __slots__ = ("_closed", "_on_todos", "_shells", "todos")

    def __init__(self, on_todos: Callable[[Todos], None] | None = None) -> None:
        self._on_todos = on_todos
        self.todos: Todos | None = None
        """The latest list ``todo_write`` set (``None`` before the first call)."""
        self._shells: ShellRegistry | None = None
        self._closed = False

    def set_todos(self, todos: Todos) -> None:
        """Replace the whole todo list and report it."""
        self.todos = todos
        if self._on_todos is not None:
            self._on_todos(todos)

    @property
    def shells(self) -> ShellRegistry:
        """The clone's background shells, made on first use.

        Raises:
            ToolRetry: the clone's run has ended.
        """
        if self._closed:
            raise ToolRetry("the clone's run has ended; no shell can start or be read")
        if self._shells is None:
            self._shells = ShellRegistry()
        return self._shells

    @property
    def live_shells(self) -> int:
        """Background shells still running."""
        return 0 if self._shells is None else self._shells.live

    async def aclose(self) -> None:
        """Kill every background shell (their whole process groups); closing twice is harmless."""
        self._closed = True
        shells, self._shells = self._shells, None
        if shells is not None:
            await shells.aclose()
