"""What every tool shares: :class:`Tool`, :class:`ToolContext` with the clone's own
:class:`CloneToolState`, the output caps, the off-loop runner.

A :class:`CloneToolState` is made on the clone's first tool call, and each piece inside it only on
its tool's first use, so a clone that never calls ``todo_write`` or starts a background shell
pays nothing for them (a host runs thousands of clones in one process). The clone closes it when
its run ends, however it ends: every background shell is killed then.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from clonefleet.clone.tools._bounded import ToolDeadline, run_bounded
from clonefleet.clone.tools._shell_processes import ShellRegistry
from clonefleet.clone.tools._web_access import WebAccess
from clonefleet.errors import ToolRetry
from clonefleet.permissions import ALLOW_ALL, Policy
from clonefleet.providers import ToolSpec

__all__ = [
    "MAX_ENTRIES",
    "MAX_HITS",
    "MAX_OUTPUT",
    "CloneToolState",
    "Todos",
    "Tool",
    "ToolContext",
    "ToolFn",
    "off_loop",
]

MAX_OUTPUT = 64 * 1024
"""Bytes of a file (``file_read``, each file ``grep`` reads) or of a command's output kept."""
MAX_ENTRIES = 1000
"""Names ``list_dir`` and ``glob`` answer with."""
MAX_HITS = 500
"""Matching lines ``grep`` answers with."""

T = TypeVar("T")

Todos = list[dict[str, Any]]
"""A todo list: ``[{content, status, activeForm?}]`` (``_todos``)."""


class CloneToolState:
    """One clone's state behind its stateful work tools: its todo list and background shells.

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool may touch: the launch directory, and the limits its work runs under."""

    root: Path
    """The launch directory; file tools never leave it."""
    shell_timeout_s: float = 60.0
    """Longest a ``shell`` command may run, in seconds; then its whole process group is killed."""
    tool_timeout_s: float = 10.0
    """Longest a file tool call (read, write, edit, list, glob, grep) may take, in seconds; then
    it answers with a tool error and its work stops."""
    match_timeout_s: float = 0.5
    """Longest one regular-expression search over one line may take in ``grep``, in seconds."""
    max_visits: int = 100_000
    """Directory entries one ``glob`` or ``grep`` call may look at."""
    web: WebAccess | None = None
    """The clone host's way to the web (config ``web`` and one shared HTTP client); ``None``:
    ``web_fetch`` and ``web_search`` answer that they are not configured."""
    policy: Policy = ALLOW_ALL
    """The clone's permission policy. The loop checks each call against it before the tool runs;
    ``web_fetch`` also checks every URL it is redirected to and every address it connects to."""
    state: CloneToolState | None = None
    """The clone's own state behind the stateful tools (its todo list, its background shells);
    ``None`` outside a clone, where those tools answer an error."""

    def clone_state(self, tool: str) -> CloneToolState:
        """The clone's own state, for a tool that keeps state between calls.

        Raises:
            ToolRetry: the tool runs outside a clone.
        """
        if self.state is None:
            raise ToolRetry(f"{tool} keeps state per clone and is not available here")
        return self.state


ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A callable tool: its model-facing spec plus the coroutine that runs it."""

    spec: ToolSpec
    run: ToolFn
    parallel_safe: bool = False
    """Safe to run concurrently with other parallel-safe calls of the same turn."""

    @property
    def name(self) -> str:
        return self.spec.name


async def off_loop(ctx: ToolContext, what: str, work: Callable[[ToolDeadline], T]) -> T:
    """Run a file tool's blocking ``work`` in a worker thread under the context's limits.

    See :func:`clonefleet.clone.tools._bounded.run_bounded`: the event loop is never held, the call
    answers within ``ctx.tool_timeout_s`` and a cancelled clone stops the work.
    """
    return await run_bounded(
        work, what=what, timeout_s=ctx.tool_timeout_s, max_visits=ctx.max_visits
    )
