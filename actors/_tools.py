"""Built-in tools and Python functions as tools.

Owns the file and shell tools a clone can call, the claude-dialect aliases and
:func:`tool_from_function`. Every path goes through the launch-directory sandbox of
``_sandbox`` (the check, then an open that follows no symbolic link). Control tools
(``exit_tool``, ``progress_update``, ``tool_search``, ``skill``) live in the agent loop.

The ``shell`` tool starts in the launch directory but is not otherwise confined: a command can
read or write anything the host process can. Grant it only where that is acceptable.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import inspect
import json
import os
import re
import signal
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from ..errors import ToolRetry
from ..providers import ToolSpec
from ..vocab import WORK_TOOLS
from ._sandbox import open_checked, open_inside, resolve_inside

__all__ = [
    "WORK_TOOL_TABLE",
    "Tool",
    "ToolContext",
    "resolve_inside",
    "tool_from_function",
]

_MAX_OUTPUT = 64 * 1024
_MAX_ENTRIES = 1000
_MAX_HITS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool may touch: the launch directory, and a deadline for shell commands."""

    root: Path
    """The launch directory; file tools never leave it."""
    shell_timeout_s: float = 60.0
    """Longest a ``shell`` command may run, in seconds; then its whole process group is killed."""


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


# -- file tools ---------------------------------------------------------------------------------
def _read_fd(fd: int) -> str:
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_MAX_OUTPUT + 1)
    text = data[:_MAX_OUTPUT].decode("utf-8", errors="replace")
    return text + ("\n[truncated]" if len(data) > _MAX_OUTPUT else "")


def _read_text(root: Path, path: str) -> str:
    real = resolve_inside(root, path)
    if not real.is_file():
        raise ToolRetry(f"{path} is not a file")
    return _read_fd(open_checked(root, real, os.O_RDONLY))


def _write_text(root: Path, path: str, text: str) -> None:
    fd = open_inside(root, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_parents=True)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


async def _file_read(args: dict[str, Any], ctx: ToolContext) -> str:
    return await asyncio.to_thread(_read_text, ctx.root, str(args["path"]))


async def _file_write(args: dict[str, Any], ctx: ToolContext) -> str:
    content = str(args.get("content", ""))
    await asyncio.to_thread(_write_text, ctx.root, str(args["path"]), content)
    return f"wrote {len(content)} characters to {args['path']}"


def _edit(root: Path, path: str, old: str, new: str) -> None:
    text = _read_text(root, path)
    count = text.count(old) if old else 0
    if count != 1:
        raise ToolRetry(f"old_string occurs {count} times in {path}; it must occur exactly once")
    _write_text(root, path, text.replace(old, new, 1))


async def _file_edit(args: dict[str, Any], ctx: ToolContext) -> str:
    await asyncio.to_thread(
        _edit, ctx.root, str(args["path"]), str(args["old_string"]), str(args["new_string"])
    )
    return f"edited {args['path']}"


def _list(root: Path, path: str) -> str:
    real = resolve_inside(root, path)
    if not real.is_dir():
        raise ToolRetry(f"{path} is not a directory")
    fd = open_checked(root, real, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as it:
            entries = sorted(
                e.name + ("@" if e.is_symlink() else "/" if e.is_dir(follow_symlinks=False) else "")
                for e in it
            )
    finally:
        os.close(fd)
    more = f"\n[{len(entries) - _MAX_ENTRIES} more]" if len(entries) > _MAX_ENTRIES else ""
    return "\n".join(entries[:_MAX_ENTRIES]) + more


async def _list_dir(args: dict[str, Any], ctx: ToolContext) -> str:
    return await asyncio.to_thread(_list, ctx.root, str(args.get("path") or "."))


def _check_pattern(pattern: str) -> str:
    if not pattern or Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        raise ToolRetry("glob patterns are relative to the search directory and may not use `..`")
    return pattern


def _walk(root: Path, base: str, pattern: str) -> list[str]:
    """Paths matching ``pattern`` under ``base``, relative to the launch directory.

    Symbolic links are not listed, and nothing whose real path is outside the launch directory.
    """
    real_root = Path(os.path.realpath(root))
    start = resolve_inside(root, base)
    if not start.is_dir():
        raise ToolRetry(f"{base} is not a directory")
    out = []
    for p in sorted(start.glob(_check_pattern(pattern))):
        if p.is_symlink() or real_root not in Path(os.path.realpath(p)).parents:
            continue
        out.append(str(p.relative_to(real_root)))
        if len(out) >= _MAX_ENTRIES:
            break
    return out


async def _glob(args: dict[str, Any], ctx: ToolContext) -> str:
    found = await asyncio.to_thread(
        _walk, ctx.root, str(args.get("path") or "."), str(args["pattern"])
    )
    return "\n".join(found) or "no files match"


def _grep_files(root: Path, base: str, regex: re.Pattern[str], include: str) -> list[str]:
    hits: list[str] = []
    for rel in _walk(root, base, "**/*"):
        if not fnmatch.fnmatch(Path(rel).name, include):
            continue
        try:
            real = resolve_inside(root, rel)
            if not real.is_file():
                continue
            lines = _read_fd(open_checked(root, real, os.O_RDONLY)).splitlines()
        except (ToolRetry, OSError):
            continue  # vanished, unreadable, or swapped for a link meanwhile: skip it
        hits.extend(
            f"{rel}:{n}:{line[:200]}" for n, line in enumerate(lines, 1) if regex.search(line)
        )
        if len(hits) >= _MAX_HITS:
            break
    return hits[:_MAX_HITS]


async def _grep(args: dict[str, Any], ctx: ToolContext) -> str:
    try:
        regex = re.compile(str(args["pattern"]))
    except re.error as exc:
        raise ToolRetry(f"bad regular expression: {exc}") from None
    include = str(args.get("include") or "*")
    hits = await asyncio.to_thread(
        _grep_files, ctx.root, str(args.get("path") or "."), regex, include
    )
    return "\n".join(hits) or "no matches"


# -- shell --------------------------------------------------------------------------------------
def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # the shell itself, should its group be gone already


async def _shell(args: dict[str, Any], ctx: ToolContext) -> str:
    # Its own session, so a timeout or a cancelled clone kills the command's children too.
    proc = await asyncio.create_subprocess_shell(
        str(args["command"]),
        cwd=ctx.root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(ctx.shell_timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        raise ToolRetry(f"command timed out after {ctx.shell_timeout_s:g}s") from None
    finally:
        if proc.returncode is None:
            _kill_group(proc)
            await asyncio.shield(proc.wait())
    text = out[:_MAX_OUTPUT].decode("utf-8", errors="replace")
    return f"exit status {proc.returncode}\n{text}"


def _spec(name: str, description: str, props: dict[str, Any], required: list[str]) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        parameters={
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        },
    )


def _s(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


_PATH = _s("path relative to the launch directory")
_DIR = _s("directory to search, relative to the launch directory (default: the launch directory)")
_WRITE = {"path": _PATH, "content": _s("the whole new content")}
_EDIT = {
    "path": _PATH,
    "old_string": _s("text that occurs exactly once"),
    "new_string": _s("its replacement"),
}
_GREP = {
    "pattern": _s("Python regular expression"),
    "include": _s("file-name glob, e.g. *.py"),
    "path": _DIR,
}
_TABLE: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            spec=_spec(
                "file_read", "Read a text file in the launch directory.", {"path": _PATH}, ["path"]
            ),
            run=_file_read,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "file_write",
                "Create or overwrite a file in the launch directory.",
                _WRITE,
                ["path", "content"],
            ),
            run=_file_write,
        ),
        Tool(
            spec=_spec(
                "file_edit",
                "Replace the one exact occurrence of old_string in a file.",
                _EDIT,
                list(_EDIT),
            ),
            run=_file_edit,
        ),
        Tool(
            spec=_spec(
                "list_dir", "List a directory (dirs end in /, links in @).", {"path": _PATH}, []
            ),
            run=_list_dir,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "glob",
                "Find files by glob pattern, e.g. **/*.py.",
                {"pattern": _s("glob pattern"), "path": _DIR},
                ["pattern"],
            ),
            run=_glob,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "grep",
                "Search file contents by regular expression; answers path:line:text.",
                _GREP,
                ["pattern"],
            ),
            run=_grep,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "shell",
                "Run a shell command; it starts in the launch directory.",
                {"command": _s("command for /bin/sh")},
                ["command"],
            ),
            run=_shell,
        ),
    )
}
WORK_TOOL_TABLE: dict[str, Tool] = {name: _TABLE[name] for name in WORK_TOOLS}
"""The implementation of each work tool of :data:`clonefleet.vocab.WORK_TOOLS`, by name."""


# -- Python functions as tools --------------------------------------------------------------------
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _doc_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and Google-style ``Args:`` entries of a docstring."""
    doc = inspect.getdoc(fn) or ""
    description = " ".join(doc.split("\n\n")[0].split()) or fn.__name__
    args: dict[str, str] = {}
    lines = doc.splitlines()
    start = next(
        (
            i + 1
            for i, line in enumerate(lines)
            if line.strip() in ("Args:", "Arguments:", "Parameters:")
        ),
        len(lines),
    )
    entry_indent: int | None = None
    current = None
    for raw in lines[start:]:
        if raw.strip() and not raw[0].isspace():
            break  # the next section (Returns:, Raises:, ...)
        indent = len(raw) - len(raw.lstrip())
        match = _ARG_LINE.match(raw.strip())
        if match and (entry_indent is None or indent == entry_indent):
            entry_indent, current = indent, match.group(1).lstrip("*")
            args[current] = match.group(2)
        elif current and raw.strip():
            args[current] = f"{args[current]} {raw.strip()}".strip()
    return description, args


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's generated ``title`` keys (noise for a model); property names are kept."""
    if isinstance(node, list):
        return [_strip_titles(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "patternProperties") and isinstance(value, dict):
            out[key] = {k: _strip_titles(v) for k, v in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


class _FunctionRunner:
    """Runs a Python function as a tool: checks the arguments, calls it, turns the answer into text.

    Module-level and without live state, so a tool pickles with its :class:`CloneSpec` (the
    function itself must be importable or picklable by cloudpickle).
    """

    def __init__(
        self, fn: Callable[..., Any], name: str, ctx_param: str | None, fields: dict[str, Any]
    ) -> None:
        self.fn, self.name, self.ctx_param, self.fields = fn, name, ctx_param, fields
        self._model: type[pydantic.BaseModel] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "fn": self.fn,
            "name": self.name,
            "ctx_param": self.ctx_param,
            "fields": self.fields,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _model=None)

    def model(self) -> type[pydantic.BaseModel]:
        if self._model is None:
            config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
            self._model = pydantic.create_model(
                f"{self.name}_arguments", __config__=config, **self.fields
            )
        return self._model

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            parsed = self.model().model_validate(args)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            raise ToolRetry(f"invalid arguments for {self.name}: {problems}") from None
        kwargs = {k: getattr(parsed, k) for k in self.fields}
        if self.ctx_param:
            kwargs[self.ctx_param] = ctx
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(**kwargs)
        else:
            value = await asyncio.to_thread(self.fn, **kwargs)
        return _as_text(value)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def tool_from_function(
    fn: Callable[..., Any], *, name: str | None = None, parallel_safe: bool = False
) -> Tool:
    """Make a tool of a Python function: its typed parameters become the arguments' JSON Schema.

    Type hints map as pydantic maps them (``int`` → integer, ``list[str]`` → array of strings,
    ``Optional[X]`` → ``X`` or null, ``Literal['a', 'b']`` → an enum, models and dataclasses →
    objects); a parameter without a hint takes any JSON value. Parameters with defaults are
    optional. A parameter annotated :class:`ToolContext` is not shown to the model and receives
    the clone's tool context. The docstring's first paragraph is the description and its
    Google-style ``Args:`` entries describe the parameters. The model's arguments are validated
    first (a mismatch goes back to the model as a tool error). The function may be sync (run in a
    thread) or async; a string answer is returned as it is, anything else as JSON.

    Raises:
        TypeError: the function takes ``*args`` or ``**kwargs``, or a hint cannot be expressed
            as JSON Schema.
    """
    tool_name = name or fn.__name__
    hints = typing.get_type_hints(fn)
    description, arg_docs = _doc_parts(fn)
    fields: dict[str, Any] = {}
    ctx_param = None
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(
                f"tool function {tool_name!r} must take named parameters only, not *{pname}"
            )
        hint = hints.get(pname, Any)
        if hint is ToolContext:
            ctx_param = pname
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hint, pydantic.Field(default, description=arg_docs.get(pname)))
    runner = _FunctionRunner(fn, tool_name, ctx_param, fields)
    try:
        schema = _strip_titles(runner.model().model_json_schema())
    except pydantic.PydanticUserError as exc:
        raise TypeError(
            f"tool function {tool_name!r} has a parameter type without a JSON Schema: {exc}"
        ) from exc
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return Tool(
        spec=ToolSpec(name=tool_name, description=description, parameters=schema),
        run=runner,
        parallel_safe=parallel_safe,
    )
