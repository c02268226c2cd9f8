"""The built-in work tools, by name, and what every tool module shares.

This module holds the table of the work tools (their model-facing specs and the coroutines that
run them) and re-exports :class:`Tool`, :class:`ToolContext` and :func:`tool_from_function`.
The control tools (``exit_tool``, ``progress_update``, ``tool_search``, ``skill``) are run by
the agent loop. What each tool does, and how far it is confined: docs/definitions.md, "Tools".
"""

from __future__ import annotations

from typing import Any

import jsonschema

from clonefleet.clone.tools._confine import resolve_inside
from clonefleet.clone.tools._files import edit_tool, list_tool, read_tool, write_tool
from clonefleet.clone.tools._from_function import tool_from_function
from clonefleet.clone.tools._notebook import CELL_TYPES, EDIT_MODES, notebook_tool
from clonefleet.clone.tools._search import glob_tool, grep_tool
from clonefleet.clone.tools._shell import shell_kill_tool, shell_output_tool, shell_tool
from clonefleet.clone.tools._todos import TODO_SCHEMA, todo_tool
from clonefleet.clone.tools._tool import Tool, ToolContext, ToolFn
from clonefleet.clone.tools._web import web_fetch_tool, web_search_tool
from clonefleet.errors import ToolRetry
from clonefleet.providers import ToolSpec
from clonefleet.vocab import WORK_TOOLS

__all__ = [
    "check_arguments",
    "WORK_TOOL_TABLE",
    "Tool",
    "ToolContext",
    "ToolFn",
    "resolve_inside",
    "tool_from_function",
]


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
_SHELL = {
    "command": _s("command for /bin/sh"),
    "run_in_background": {
        "type": "boolean",
        "description": "start it in the background and return its shell_id at once",
    },
    "description": _s("a few words on what the command does (not used)"),
}
_FILTER = "regular expression: only matching lines are shown (the others are consumed)"
_NOTEBOOK = {
    "path": _s("the .ipynb file, relative to the launch directory"),
    "cell_id": _s("the cell's id (insert: the new cell goes after it)"),
    "cell_number": {
        "type": "integer",
        "minimum": 0,
        "description": "0-based cell index (insert: the new cell's position)",
    },
    "new_source": _s("the cell's new source (not needed to delete)"),
    "cell_type": {"type": "string", "enum": list(CELL_TYPES)},
    "edit_mode": {"type": "string", "enum": list(EDIT_MODES), "description": "default replace"},
}
_TABLE: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            spec=_spec(
                "file_read", "Read a text file in the launch directory.", {"path": _PATH}, ["path"]
            ),
            run=read_tool,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "file_write",
                "Create or overwrite a file in the launch directory.",
                _WRITE,
                ["path", "content"],
            ),
            run=write_tool,
        ),
        Tool(
            spec=_spec(
                "file_edit",
                "Replace the one exact occurrence of old_string in a file.",
                _EDIT,
                list(_EDIT),
            ),
            run=edit_tool,
        ),
        Tool(
            spec=_spec(
                "list_dir", "List a directory (dirs end in /, links in @).", {"path": _PATH}, []
            ),
            run=list_tool,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "glob",
                "Find files by glob pattern, e.g. **/*.py (at most two `**`).",
                {"pattern": _s("glob pattern"), "path": _DIR},
                ["pattern"],
            ),
            run=glob_tool,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "grep",
                "Search file contents by regular expression; answers path:line:text.",
                _GREP,
                ["pattern"],
            ),
            run=grep_tool,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "shell",
                "Run a shell command; it starts in the launch directory. With run_in_background "
                "it returns a shell_id at once: read its output with shell_output.",
                _SHELL,
                ["command"],
            ),
            run=shell_tool,
        ),
        Tool(
            spec=_spec(
                "shell_output",
                "Read a background shell's new output since the last read, with its status.",
                {"shell_id": _s("the id shell returned"), "filter": _s(_FILTER)},
                ["shell_id"],
            ),
            run=shell_output_tool,
        ),
        Tool(
            spec=_spec(
                "shell_kill",
                "Stop a background shell (its whole process group).",
                {"shell_id": _s("the id shell returned")},
                ["shell_id"],
            ),
            run=shell_kill_tool,
        ),
        Tool(
            spec=_spec(
                "notebook_edit",
                "Replace, insert or delete one cell of a Jupyter notebook (.ipynb).",
                _NOTEBOOK,
                ["path"],
            ),
            run=notebook_tool,
        ),
        Tool(
            spec=_spec(
                "todo_write",
                "Replace your whole todo list (plan and track multi-step work; the caller sees it).",
                {"todos": TODO_SCHEMA},
                ["todos"],
            ),
            run=todo_tool,
        ),
        Tool(
            spec=_spec(
                "web_fetch",
                "Fetch a web page (allowed hosts only) and return it as text/Markdown.",
                {"url": _s("http(s) URL"), "prompt": _s("what to look for in the page")},
                ["url"],
            ),
            run=web_fetch_tool,
            parallel_safe=True,
        ),
        Tool(
            spec=_spec(
                "web_search",
                "Search the web; returns [{title, url, snippet}].",
                {"query": _s("search terms"), "max_results": {"type": "integer", "minimum": 1}},
                ["query"],
            ),
            run=web_search_tool,
            parallel_safe=True,
        ),
    )
}
WORK_TOOL_TABLE: dict[str, Tool] = {name: _TABLE[name] for name in WORK_TOOLS}
"""The implementation of each work tool of :data:`clonefleet.vocab.WORK_TOOLS`, by name."""


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    """Check a built-in tool's arguments against its schema.

    Raises:
        ToolRetry: they do not fit (the model is told where).
    """
    validator = _VALIDATORS.get(tool.name)
    if validator is None:
        validator = _VALIDATORS[tool.name] = jsonschema.Draft202012Validator(tool.spec.parameters)
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "arguments"
        raise ToolRetry(f"invalid arguments for {tool.name}: {where}: {error.message}")


_VALIDATORS: dict[str, jsonschema.Draft202012Validator] = {}
"""Argument validators of the built-in tools (their schemas are fixed)."""
