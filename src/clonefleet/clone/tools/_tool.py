"""What every tool shares: :class:`Tool`, :class:`ToolContext`, the output caps, the off-loop runner."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from clonefleet.clone.tools._bounded import Budget, run_bounded
from clonefleet.errors import ToolRetry
from clonefleet.permissions import ALLOW_ALL, Policy
from clonefleet.providers import ToolSpec

if TYPE_CHECKING:
    from clonefleet.clone.tools._web import WebAccess
    from clonefleet.clone.tools._work_state import CloneServices

__all__ = [
    "MAX_ENTRIES",
    "MAX_HITS",
    "MAX_OUTPUT",
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
    services: CloneServices | None = None
    """The clone's own state behind the stateful tools (its todo list, its background shells);
    ``None`` outside a clone, where those tools answer an error."""

    def clone_services(self, tool: str) -> CloneServices:
        """The clone's services, for a tool that keeps state between calls.

        Raises:
            ToolRetry: the tool runs outside a clone.
        """
        if self.services is None:
            raise ToolRetry(f"{tool} keeps state per clone and is not available here")
        return self.services


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


async def off_loop(ctx: ToolContext, what: str, work: Callable[[Budget], T]) -> T:
    """Run a file tool's blocking ``work`` in a worker thread under the context's limits.

    See :func:`clonefleet.clone.tools._bounded.run_bounded`: the event loop is never held, the call
    answers within ``ctx.tool_timeout_s`` and a cancelled clone stops the work.
    """
    return await run_bounded(
        work, what=what, timeout_s=ctx.tool_timeout_s, max_visits=ctx.max_visits
    )
