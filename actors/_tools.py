"""Built-in tools and the launch-directory sandbox.

Owns the file and shell tools a clone can call, the claude-dialect aliases, Python functions as
tools, and :func:`resolve_inside`, the one check every path goes through. Control tools
(``exit_tool``, ``progress_update``, ``tool_search``, ``skill``) live in the agent loop.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import os
import re
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ToolRetry
from ._types import ToolSpec

__all__ = [
    "BUILTIN_TOOLS",
    "CLAUDE_ALIASES",
    "Tool",
    "ToolContext",
    "resolve_inside",
    "tool_from_function",
]

CLAUDE_ALIASES = {
    "Read": "file_read",
    "Write": "file_write",
    "Edit": "file_edit",
    "LS": "list_dir",
    "Glob": "glob",
    "Grep": "grep",
    "Bash": "shell",
}
_MAX_OUTPUT = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool may touch: the launch directory, and a deadline for shell commands."""

    root: Path
    shell_timeout_s: float = 60.0


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


def resolve_inside(root: Path, path: str) -> Path:
    """Resolve ``path`` against ``root`` and refuse anything that lands outside it.

    Symbolic links are resolved first, so a link (or ``..``) that leaves the launch directory is
    refused, and ``root_evil/`` is not mistaken for ``root/`` (the check compares whole path parts).

    Raises:
        ToolRetry: the path escapes the launch directory.
    """
    real_root = Path(os.path.realpath(root))
    candidate = Path(path)
    joined = candidate if candidate.is_absolute() else real_root / candidate
    real = Path(os.path.realpath(joined))
    if real != real_root and real_root not in real.parents:
        raise ToolRetry(f"path {path!r} is outside the launch directory {real_root}")
    return real


def _open_nofollow(path: Path, flags: int) -> int:
    # O_NOFOLLOW closes the window where the final component is swapped for a symlink after
    # resolve_inside checked it.
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise ToolRetry(f"cannot open {path.name}: {exc.strerror}") from None


def _read_text(path: Path) -> str:
    fd = _open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_MAX_OUTPUT + 1)
    text = data[:_MAX_OUTPUT].decode("utf-8", errors="replace")
    return text + ("\n[truncated]" if len(data) > _MAX_OUTPUT else "")


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


async def _file_read(args: dict[str, Any], ctx: ToolContext) -> str:
    path = resolve_inside(ctx.root, str(args["path"]))
    if not path.is_file():
        raise ToolRetry(f"{args['path']} is not a file")
    return await asyncio.to_thread(_read_text, path)


async def _file_write(args: dict[str, Any], ctx: ToolContext) -> str:
    path = resolve_inside(ctx.root, str(args["path"]))
    content = str(args.get("content", ""))
    await asyncio.to_thread(_write_text, path, content)
    return f"wrote {len(content)} characters to {args['path']}"


async def _file_edit(args: dict[str, Any], ctx: ToolContext) -> str:
    path = resolve_inside(ctx.root, str(args["path"]))
    old, new = str(args["old_string"]), str(args["new_string"])
    text = await asyncio.to_thread(_read_text, path)
    count = text.count(old)
    if count != 1:
        raise ToolRetry(f"old_string occurs {count} times in {args['path']}; it must occur exactly once")
    await asyncio.to_thread(_write_text, path, text.replace(old, new, 1))
    return f"edited {args['path']}"


async def _list_dir(args: dict[str, Any], ctx: ToolContext) -> str:
    path = resolve_inside(ctx.root, str(args.get("path", ".")))
    if not path.is_dir():
        raise ToolRetry(f"{args.get('path', '.')} is not a directory")
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    return "\n".join(entries[:1000])


def _walk(root: Path, pattern: str) -> list[str]:
    real_root = Path(os.path.realpath(root))
    out = []
    for p in sorted(real_root.glob(pattern)):
        if p.is_symlink() or real_root not in Path(os.path.realpath(p)).parents:
            continue
        out.append(str(p.relative_to(real_root)))
        if len(out) >= 1000:
            break
    return out


async def _glob(args: dict[str, Any], ctx: ToolContext) -> str:
    pattern = str(args["pattern"])
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise ToolRetry("glob patterns are relative to the launch directory and may not use `..`")
    return "\n".join(await asyncio.to_thread(_walk, ctx.root, pattern))


def _grep_files(root: Path, regex: re.Pattern[str], include: str) -> list[str]:
    hits = []
    for rel in _walk(root, "**/*"):
        if not fnmatch.fnmatch(Path(rel).name, include):
            continue
        path = root / rel
        if not path.is_file():
            continue
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        hits.extend(f"{rel}:{n}:{line[:200]}" for n, line in enumerate(lines, 1) if regex.search(line))
        if len(hits) >= 500:
            break
    return hits[:500]


async def _grep(args: dict[str, Any], ctx: ToolContext) -> str:
    try:
        regex = re.compile(str(args["pattern"]))
    except re.error as exc:
        raise ToolRetry(f"bad regular expression: {exc}") from None
    hits = await asyncio.to_thread(_grep_files, Path(os.path.realpath(ctx.root)), regex, str(args.get("include", "*")))
    return "\n".join(hits) or "no matches"


async def _shell(args: dict[str, Any], ctx: ToolContext) -> str:
    proc = await asyncio.create_subprocess_shell(
        str(args["command"]), cwd=ctx.root, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(ctx.shell_timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ToolRetry(f"command timed out after {ctx.shell_timeout_s:g}s") from None
    text = out[:_MAX_OUTPUT].decode("utf-8", errors="replace")
    return f"exit status {proc.returncode}\n{text}"


def _spec(name: str, description: str, props: dict[str, Any], required: list[str]) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        parameters={"type": "object", "properties": props, "required": required, "additionalProperties": False},
    )


_S = {"type": "string"}
BUILTIN_TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(spec=_spec("file_read", "Read a text file in the launch directory.", {"path": _S}, ["path"]), run=_file_read, parallel_safe=True),
        Tool(spec=_spec("file_write", "Create or overwrite a file.", {"path": _S, "content": _S}, ["path", "content"]), run=_file_write),
        Tool(
            spec=_spec("file_edit", "Replace one exact occurrence of old_string.", {"path": _S, "old_string": _S, "new_string": _S}, ["path", "old_string", "new_string"]),
            run=_file_edit,
        ),
        Tool(spec=_spec("list_dir", "List a directory.", {"path": _S}, []), run=_list_dir, parallel_safe=True),
        Tool(spec=_spec("glob", "Find files by glob pattern, e.g. **/*.py.", {"pattern": _S}, ["pattern"]), run=_glob, parallel_safe=True),
        Tool(spec=_spec("grep", "Search file contents by regular expression.", {"pattern": _S, "include": _S}, ["pattern"]), run=_grep, parallel_safe=True),
        Tool(spec=_spec("shell", "Run a shell command in the launch directory.", {"command": _S}, ["command"]), run=_shell),
    )
}

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def tool_from_function(fn: Callable[..., Any], *, name: str | None = None, parallel_safe: bool = False) -> Tool:
    """Make a tool of a Python function: typed parameters become the JSON Schema.

    The function may be sync (run in a thread) or async; its docstring's first line is the
    description; its return value is turned into text with ``str``.
    """
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required = []
    for pname, param in inspect.signature(fn).parameters.items():
        hint = hints.get(pname, str)
        origin = typing.get_origin(hint) or hint
        props[pname] = {"type": _JSON_TYPES.get(origin, "string")}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    doc = (inspect.getdoc(fn) or fn.__name__).splitlines()[0]

    async def run(args: dict[str, Any], ctx: ToolContext) -> str:
        if inspect.iscoroutinefunction(fn):
            return str(await fn(**args))
        return str(await asyncio.to_thread(fn, **args))

    return Tool(spec=_spec(name or fn.__name__, doc, props, required), run=run, parallel_safe=parallel_safe)
