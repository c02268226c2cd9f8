"""The ``shell`` tool: a ``/bin/sh`` command in the launch directory, under a deadline, or in the
background (``run_in_background``, see ``_bgshell``).

The command starts in the launch directory but is not otherwise confined: it can read or write
anything the host process can. Grant it only where that is acceptable. It runs in a session of its
own, so a timeout or a cancelled clone kills the command's whole process group. It never holds the
event loop: the loop waits on the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from clonefleet.clone.tools._tool import MAX_OUTPUT, ToolContext
from clonefleet.errors import ToolRetry

__all__ = ["kill_group", "shell_tool", "start_process"]


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


async def _first_bytes(stream: asyncio.StreamReader | None) -> bytes:
    """The first ``MAX_OUTPUT`` bytes of the stream; the rest is read and dropped, not kept."""
    kept = bytearray()
    while stream is not None and (chunk := await stream.read(64 * 1024)):
        kept += chunk[: MAX_OUTPUT - len(kept)]
    return bytes(kept)


async def shell_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    command = str(args["command"])
    if args.get("run_in_background"):
        shells = ctx.clone_services("shell (run_in_background)").shells
        shell = await shells.start(command, ctx.root)
        return (
            f"shell_id: {shell.shell_id}\nstatus: running\n"
            "Read its output with shell_output and stop it with shell_kill; it is killed when "
            "your run ends."
        )
    # Its own session, so a timeout or a cancelled clone kills the command's children too.
    proc = await start_process(command, ctx.root)
    try:
        async with asyncio.timeout(ctx.shell_timeout_s):
            out = await _first_bytes(proc.stdout)
            await proc.wait()
    except TimeoutError:
        raise ToolRetry(f"command timed out after {ctx.shell_timeout_s:g}s") from None
    finally:
        if proc.returncode is None:
            kill_group(proc)
            await asyncio.shield(proc.wait())
    text = out.decode("utf-8", errors="replace")
    return f"exit status {proc.returncode}\n{text}"


_HIDDEN_VARIABLES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""The cluster's credentials: a command the model chose must not print them into its context
(and so to the model provider)."""


def _shell_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _HIDDEN_VARIABLES}
