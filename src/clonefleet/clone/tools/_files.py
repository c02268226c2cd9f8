"""The file tools: ``file_read``, ``file_write``, ``file_edit`` and ``list_dir``.

Every path goes through the launch-directory confinement of ``_confine`` (the check, then an open
that follows no symbolic link and refuses a regular file with more than one hard link). Only regular
files are read or written: a named pipe or a device inside the launch directory is refused (opened
with ``O_NONBLOCK``, so a pipe without a writer cannot hold the open). The work runs off the event
loop under the call's deadline (``_tool.off_loop``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from clonefleet.clone.tools._bounded import ToolDeadline
from clonefleet.clone.tools._confine import open_checked, resolve_inside
from clonefleet.clone.tools._tool import MAX_ENTRIES, MAX_OUTPUT, ToolContext, off_loop
from clonefleet.errors import ToolRetry

__all__ = ["edit_tool", "list_tool", "read_regular", "read_tool", "write_tool"]


def _open_regular(root: Path, real: Path, flags: int, shown: str) -> int:
    fd = open_checked(root, real, flags | os.O_NONBLOCK, make_parents=bool(flags & os.O_CREAT))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolRetry(f"{shown} is not a file")
    return fd


def read_regular(root: Path, real: Path, shown: str) -> str:
    """The text of the regular file ``real`` (checked by ``resolve_inside``), at most 64 KiB.

    Raises:
        ToolRetry: not a regular file, several hard links, swapped for a link, or unreadable.
    """
    with os.fdopen(_open_regular(root, real, os.O_RDONLY, shown), "rb") as fh:
        data = fh.read(MAX_OUTPUT + 1)
    text = data[:MAX_OUTPUT].decode("utf-8", errors="replace")
    return text + ("\n[truncated]" if len(data) > MAX_OUTPUT else "")


def _read_text(root: Path, path: str) -> str:
    return read_regular(root, resolve_inside(root, path), path)


def _write_text(root: Path, path: str, text: str) -> None:
    real = resolve_inside(root, path)
    fd = _open_regular(root, real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, path)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def _edit(root: Path, path: str, old: str, new: str) -> None:
    text = _read_text(root, path)
    count = text.count(old) if old else 0
    if count != 1:
        raise ToolRetry(f"old_string occurs {count} times in {path}; it must occur exactly once")
    _write_text(root, path, text.replace(old, new, 1))


def _list(root: Path, path: str, deadline: ToolDeadline) -> str:
    real = resolve_inside(root, path)
    if not real.is_dir():
        raise ToolRetry(f"{path} is not a directory")
    fd = open_checked(root, real, os.O_RDONLY | os.O_DIRECTORY)
    entries = []
    try:
        with os.scandir(fd) as it:
            for e in it:
                deadline.check()
                link = e.is_symlink()
                kind = "@" if link else "/" if e.is_dir(follow_symlinks=False) else ""
                entries.append(e.name + kind)
    finally:
        os.close(fd)
    entries.sort()
    more = f"\n[{len(entries) - MAX_ENTRIES} more]" if len(entries) > MAX_ENTRIES else ""
    return "\n".join(entries[:MAX_ENTRIES]) + more


async def read_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    path = str(args["path"])
    return await off_loop(ctx, "file_read", lambda _: _read_text(ctx.root, path))


async def write_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    path, content = str(args["path"]), str(args.get("content", ""))
    await off_loop(ctx, "file_write", lambda _: _write_text(ctx.root, path, content))
    return f"wrote {len(content)} characters to {path}"


async def edit_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    path, old, new = str(args["path"]), str(args["old_string"]), str(args["new_string"])
    await off_loop(ctx, "file_edit", lambda _: _edit(ctx.root, path, old, new))
    return f"edited {path}"


async def list_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    path = str(args.get("path") or ".")
    return await off_loop(ctx, "list_dir", lambda deadline: _list(ctx.root, path, deadline))
