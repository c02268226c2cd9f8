"""The budget of the render in progress: its wall-clock deadline, the bytes its values have
made, and samples of the process's resident memory, held in a context variable that every guarded
operation checks."""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clonefleet.definitions.template._limits import (
    MAX_ITEMS,
    MAX_RENDER_MEMORY,
    MEMORY_SAMPLE_S,
    Size,
    TemplateLimitError,
)

FIRST_SAMPLE_S = 0.002
"""When, into a render, its process's resident memory is first read (the baseline)."""

__all__ = [
    "RenderBudget",
    "check_render",
    "current_render_budget",
    "reset_render_budget",
    "resident_bytes",
    "set_render_budget",
]

_STATM: dict[int, int] = {}
"""Per process id, an open descriptor of ``/proc/self/statm`` (reopened after a fork)."""
_STATM_LOCK = threading.Lock()


def resident_bytes() -> int:
    """The process's resident memory in bytes, or ``-1`` where it cannot be read (not Linux)."""
    pid = os.getpid()
    try:
        fd = _STATM.get(pid)
        if fd is None:
            with _STATM_LOCK:
                fd = _STATM.get(pid)
                if fd is None:
                    _STATM.clear()
                    fd = _STATM[pid] = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return -1


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(slots=True)
class RenderBudget:
    """The deadline and memory allowance of the render in progress."""

    deadline: float
    clock: Callable[[], float] = time.monotonic
    memory_limit: int = MAX_RENDER_MEMORY
    baseline: int = -1
    """Resident memory at the first sample, :data:`FIRST_SAMPLE_S` into the render (``-1``: not
    measured yet, or not measurable here)."""
    next_sample: float = 0.0
    sizes: dict[int, tuple[Any, Size]] = field(default_factory=dict)
    """Sizes of the large containers measured last, by ``id`` (the object is kept alive, and
    the sandbox lets no template mutate a container); see :meth:`remember`."""
    remembered: int = 0
    """Objects held by the containers in :attr:`sizes`."""
    allocated: int = 0
    """Bytes of the values made so far (``_sizes.charge``)."""

    def __post_init__(self) -> None:
        # Reading the resident size costs tens of microseconds, as much as rendering a short
        # prompt; most renders end before the first sample and never pay it. What a render makes
        # before then is still charged (``charge``).
        self.next_sample = self.clock() + FIRST_SAMPLE_S

    def check(self) -> None:
        now = self.clock()
        if now > self.deadline:
            raise TemplateLimitError(
                "rendering took longer than its time budget (a loop or recursion too large?)"
            )
        if now < self.next_sample:
            return
        self.next_sample = now + MEMORY_SAMPLE_S
        if self.baseline == -1:
            self.baseline = resident_bytes()
            if self.baseline < 0:
                self.baseline, self.next_sample = -2, float("inf")  # not measurable here
        else:
            grown = resident_bytes() - self.baseline
            if grown > self.memory_limit:
                raise TemplateLimitError(
                    f"rendering grew the process's memory by {grown >> 20:,} MiB, over the"
                    f" template limit of {self.memory_limit >> 20:,} MiB"
                )

    def remember(self, value: Any, size: Size) -> None:
        """Keep ``value``'s size for the rest of the render, dropping the oldest sizes so that the
        containers kept alive hold at most twice :data:`MAX_ITEMS` objects."""
        while self.sizes and self.remembered + size.objects > 2 * MAX_ITEMS:
            oldest = next(iter(self.sizes))
            self.remembered -= self.sizes.pop(oldest)[1].objects
        self.sizes[id(value)] = (value, size)
        self.remembered += size.objects

    def charge(self, size: int) -> None:
        self.allocated += size
        if self.allocated > self.memory_limit:
            raise TemplateLimitError(
                f"rendering made values of over {self.memory_limit >> 20:,} MiB in all, the"
                " template limit"
            )


_BUDGET: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar(
    "clonefleet_template_budget", default=None
)


def check_render() -> None:
    """Check the render in progress (if any) against its :class:`RenderBudget`: its deadline,
    and, every :data:`MEMORY_SAMPLE_S`, the growth of the process's resident memory.

    Raises:
        TemplateLimitError: the render is over its time or memory allowance.
    """
    budget = _BUDGET.get()
    if budget is not None:
        budget.check()


def set_render_budget(budget: RenderBudget | None) -> contextvars.Token[RenderBudget | None]:
    """Install the deadline for the render in progress; reset with the returned token."""
    return _BUDGET.set(budget)


def reset_render_budget(token: contextvars.Token[RenderBudget | None]) -> None:
    """Restore the budget in force before :func:`set_render_budget` returned ``token``."""
    _BUDGET.reset(token)


def current_render_budget() -> RenderBudget | None:
    """The deadline of the render in progress in this context, if any."""
    return _BUDGET.get()
