"""The shell tools: ``shell`` runs a ``/bin/sh`` command in the launch directory, under a deadline,
or in the background (``run_in_background``); ``shell_output`` reads a background shell's new
output and ``shell_kill`` stops it. The processes and the background shells are in
``_shell_processes``.

The command starts in the launch directory but is not otherwise confined: it can read or write
anything the host process can. Grant it only where that is acceptable. It runs in a session of its
own, so a timeout or a cancelled clone kills the command's whole process group. It never holds the
event loop: the loop waits on the process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import regex

from clonefleet.clone.tools._bounded import ToolDeadline
from clonefleet.clone.tools._shell_processes import MAX_SHELL_BUFFER, kill_group, start_process
from clonefleet.clone.tools._tool import MAX_OUTPUT, ToolContext, off_loop
from clonefleet.errors import ToolRetry

__all__ = ["MAX_FILTER", "shell_kill_tool", "shell_output_tool", "shell_tool"]

MAX_FILTER = 2000
"""Characters a ``shell_output`` filter may have."""


async def _first_bytes(stream: asyncio.StreamReader | None) -> bytes:
    """The first ``MAX_OUTPUT`` bytes of the stream; the rest is read and dropped, not kept."""
    kept = bytearray()
    while stream is not None and (chunk := await stream.read(64 * 1024)):
        kept += chunk[: MAX_OUTPUT - len(kept)]
    return bytes(kept)


async def shell_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    command = str(args["command"])
    if args.get("run_in_background"):
        shells = ctx.clone_state("shell (run_in_background)").shells
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


def _filtered(
    text: str, pattern: regex.Pattern[str], timeout_s: float, deadline: ToolDeadline
) -> str:
    kept = []
    for line in text.splitlines(keepends=True):
        deadline.check()
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
    shell = ctx.clone_state("shell_output").shells.get(str(args["shell_id"]))
    pattern = _compile(str(args["filter"])) if args.get("filter") else None
    text, dropped, waiting = shell.take(MAX_OUTPUT)
    if pattern is not None and text:
        text = await off_loop(
            ctx,
            "shell_output",
            lambda deadline: _filtered(text, pattern, ctx.match_timeout_s, deadline),
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
    shell = await ctx.clone_state("shell_kill").shells.kill(str(args["shell_id"]))
    return shell.describe()
