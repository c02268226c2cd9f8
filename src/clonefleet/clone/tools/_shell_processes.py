"""Shell processes: a ``/bin/sh`` command started in a session (process group) of its own, its
whole group killed, and one clone's background shells.

``shell`` runs a command in the foreground or, with ``run_in_background``, in the background;
``shell_output`` reads a background shell and ``shell_kill`` stops it (the tools are in
``_shell``). Each clone has at most :data:`MAX_LIVE_SHELLS` background shells running at once. A
reader task of the clone's registry keeps each one's output: the newest :data:`MAX_SHELL_BUFFER`
bytes not read yet (older ones are dropped, and the next read says how many). Every shell still
running is killed, its whole group, when the clone's run ends, is cancelled, or its host closes
(``CloneToolState.aclose``).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from enum import StrEnum
from pathlib import Path

from clonefleet.errors import ToolRetry

__all__ = [
    "MAX_KEPT_SHELLS",
    "MAX_LIVE_SHELLS",
    "MAX_SHELL_BUFFER",
    "BackgroundShell",
    "ShellRegistry",
    "ShellStatus",
    "kill_group",
    "start_process",
]

MAX_LIVE_SHELLS = 8
"""Background shells one clone may have running at once."""
MAX_KEPT_SHELLS = 16
"""Background shells one clone's registry remembers; past it the oldest finished one is
forgotten (with any output not read yet)."""
MAX_SHELL_BUFFER = 1024 * 1024
"""Bytes of unread output kept per background shell (the newest)."""
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

    @property
    def waiting(self) -> int:
        """Bytes of output kept and not read yet."""
        return len(self._buf)

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


async def start_process(command: str, root: Path) -> asyncio.subprocess.Process:
    """Start ``command`` with ``/bin/sh`` in ``root``, in a session (process group) of its own,
    stdin closed, stdout and stderr into one pipe."""
    return await asyncio.create_subprocess_shell(
        command,
        cwd=root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        env=_shell_environment(),
    )


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill the process's whole group (the command and every child it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # the shell itself, should its group be gone already


_HIDDEN_VARIABLES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""The cluster's credentials: a command the model chose must not print them into its context
(and so to the model provider)."""


def _shell_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _HIDDEN_VARIABLES}
