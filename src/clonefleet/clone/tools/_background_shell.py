"""Background shells: ``shell`` with ``run_in_background``, read with ``shell_output`` and stopped
with ``shell_kill``.

Each clone has at most :data:`MAX_LIVE_SHELLS` running at once. Each shell runs in a session
(process group) of its own, like a foreground ``shell`` command, and a reader task of the
clone's registry keeps its output: the newest :data:`MAX_SHELL_BUFFER` bytes not read yet (older
ones are dropped, and the next read says how many). A read answers at most ``MAX_OUTPUT`` bytes;
the rest waits for the next read. Every shell still running is killed, its whole group, when the
clone's run ends, is cancelled, or its host closes (``CloneServices.aclose``).
"""

from __future__ import annotations

import asyncio
import codecs
from enum import StrEnum
from pathlib import Path
from typing import Any

import regex

from clonefleet.clone.tools._bounded import Budget
from clonefleet.clone.tools._shell import kill_group, start_process
from clonefleet.clone.tools._tool import MAX_OUTPUT, ToolContext, off_loop
from clonefleet.errors import ToolRetry

__all__ = [
    "MAX_KEPT_SHELLS",
    "MAX_LIVE_SHELLS",
    "MAX_SHELL_BUFFER",
    "BackgroundShell",
    "ShellRegistry",
    "ShellStatus",
    "shell_kill_tool",
    "shell_output_tool",
]

MAX_LIVE_SHELLS = 8
"""Background shells one clone may have running at once."""
MAX_KEPT_SHELLS = 16
"""Background shells one clone's registry remembers; past it the oldest finished one is
forgotten (with any output not read yet)."""
MAX_SHELL_BUFFER = 1024 * 1024
"""Bytes of unread output kept per background shell (the newest)."""
MAX_FILTER = 2000
"""Characters a ``shell_output`` filter may have."""
_KILL_WAIT_S = 5.0
"""How long closing waits for a killed shell to be reaped."""


class ShellStatus(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    KILLED = "killed"


class BackgroundShell:
    """One background command, its reader task and its unread output."""

    def __init__(self, shell_id: str, command: str, proc: asyncio.subprocess.Process) -> None:
        self.shell_id, self.command, self.proc = shell_id, command, proc
        self.killed = False
        self._buf = bytearray()
        self._dropped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._reader = asyncio.get_running_loop().create_task(
            self._read_all(), name=f"background {shell_id}"
        )

    async def _read_all(self) -> None:
        stream = self.proc.stdout
        while stream is not None and (chunk := await stream.read(64 * 1024)):
            self._buf += chunk
            excess = len(self._buf) - MAX_SHELL_BUFFER
            if excess > 0:
                del self._buf[:excess]
                self._dropped += excess
        await self.proc.wait()

    @property
    def status(self) -> ShellStatus:
        if self.proc.returncode is None:
            return ShellStatus.RUNNING
        return ShellStatus.KILLED if self.killed else ShellStatus.EXITED

    @property
    def is_done(self) -> bool:
        """The command ended and every byte of its output has been collected."""
        return self.proc.returncode is not None and self._reader.done()

    def take(self, limit: int) -> tuple[str, int, int]:
        """Up to ``limit`` bytes of unread output as text, the bytes dropped since the last take,
        and the bytes still waiting."""
        data = bytes(self._buf[:limit])
        del self._buf[:limit]
        dropped, self._dropped = self._dropped, 0
        text = self._decoder.decode(data, final=self.is_done and not self._buf)
        return text, dropped, len(self._buf)

    def kill(self) -> None:
        """Kill the command's whole process group (nothing when it has ended)."""
        if self.proc.returncode is None:
            self.killed = True
            kill_group(self.proc)

    async def reap(self) -> None:
        """Wait (bounded) for the killed command to end and its reader to finish."""
        try:
            async with asyncio.timeout(_KILL_WAIT_S):
                await asyncio.shield(self.proc.wait())
                await asyncio.shield(self._reader)
        except TimeoutError:
            pass  # a child outside the group holds the pipe: the reader is cancelled below
        finally:
            if not self._reader.done():
                self._reader.cancel()
                await asyncio.gather(self._reader, return_exceptions=True)

    def describe(self) -> str:
        status = self.status
        if status is ShellStatus.EXITED:
            return f"shell {self.shell_id}: exited with status {self.proc.returncode}"
        return f"shell {self.shell_id}: {status}"


class ShellRegistry:
    """The background shells of one clone."""

    def __init__(self) -> None:
        self._shells: dict[str, BackgroundShell] = {}
        self._count = 0

    @property
    def live(self) -> int:
        return sum(s.status is ShellStatus.RUNNING for s in self._shells.values())

    async def start(self, command: str, root: Path) -> BackgroundShell:
        """Start ``command`` in the background.

        Raises:
            ToolRetry: :data:`MAX_LIVE_SHELLS` are running already.
        """
        if self.live >= MAX_LIVE_SHELLS:
            raise ToolRetry(
                f"{MAX_LIVE_SHELLS} background shells are running already; stop one with shell_kill"
            )
        while len(self._shells) >= MAX_KEPT_SHELLS:
            oldest = next((k for k, s in self._shells.items() if s.is_done), None)
            if oldest is None:
                break
            del self._shells[oldest]
        proc = await start_process(command, root)
        self._count += 1
        shell = BackgroundShell(f"shell_{self._count}", command, proc)
        self._shells[shell.shell_id] = shell
        return shell

    def get(self, shell_id: str) -> BackgroundShell:
        """Raises:
        ToolRetry: no such shell (the message lists the known ones)."""
        shell = self._shells.get(shell_id)
        if shell is None:
            known = ", ".join(self._shells) or "none"
            raise ToolRetry(f"no background shell {shell_id!r}; known: {known}")
        return shell

    async def kill(self, shell_id: str) -> BackgroundShell:
        shell = self.get(shell_id)
        shell.kill()
        await shell.reap()
        return shell

    async def aclose(self) -> None:
        """Kill every running shell, then reap them all."""
        shells = list(self._shells.values())
        for shell in shells:
            shell.kill()  # all at once, before any wait
        await asyncio.gather(*(s.reap() for s in shells), return_exceptions=True)


def _filtered(text: str, pattern: regex.Pattern[str], timeout_s: float, budget: Budget) -> str:
    kept = []
    for line in text.splitlines(keepends=True):
        budget.check()
        try:
            if pattern.search(line, timeout=timeout_s) is not None:
                kept.append(line)
        except TimeoutError:
            raise ToolRetry(
                f"the filter took longer than {timeout_s:g}s on one line; simplify it"
            ) from None
    return "".join(kept)


def _compile(pattern: str) -> regex.Pattern[str]:
    if len(pattern) > MAX_FILTER:
        raise ToolRetry(f"the filter has {len(pattern)} characters; at most {MAX_FILTER}")
    try:
        return regex.compile(pattern)
    except (regex.error, OverflowError, RecursionError) as exc:
        raise ToolRetry(f"the filter is not a valid regular expression: {exc}") from None


async def shell_output_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    shell = ctx.clone_services("shell_output").shells.get(str(args["shell_id"]))
    pattern = _compile(str(args["filter"])) if args.get("filter") else None
    text, dropped, waiting = shell.take(MAX_OUTPUT)
    if pattern is not None and text:
        text = await off_loop(
            ctx,
            "shell_output",
            lambda budget: _filtered(text, pattern, ctx.match_timeout_s, budget),
        )
    lines = [shell.describe()]
    if dropped:
        lines.append(
            f"[{dropped} bytes of output were dropped unread: a background shell keeps the "
            f"newest {MAX_SHELL_BUFFER // 1024} KiB]"
        )
    if waiting:
        lines.append(f"[{waiting} more bytes waiting: call shell_output again]")
    lines.append(text if text else "(no new output)")
    return "\n".join(lines)


async def shell_kill_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    shell = await ctx.clone_services("shell_kill").shells.kill(str(args["shell_id"]))
    return shell.describe()
