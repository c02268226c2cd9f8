"""Value objects of the definitions layer: dialects, the loaded :class:`Definition`, load reports
and what each clone of a batch is rendered with.

This module only declares data; it reads no files and renders nothing (the tool and status words
the loader checks against are in ``clonefleet.vocab``). Every class here is defined at module
level, frozen and keyword-only, so it pickles across Ray process boundaries.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from clonefleet.permissions import RuleSet

RESERVED_NAME = "_default"
"""The built-in general-purpose definition; no file, config entry or registration replaces it."""

DEFAULT_EXIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"success": {"type": "boolean"}, "summary": {"type": "string"}},
    "required": ["success", "summary"],
}
"""The ``exit_tool`` payload schema of a definition that declares none. Do not mutate; use
:attr:`Definition.effective_exit_schema`, which returns a copy."""


class Dialect(StrEnum):
    """Where a definition came from, which decides how it is read and whether it is templated."""

    NATIVE = "native"
    """``clonefleet:`` (or ``polytoken:``) namespace in the frontmatter; the body is a template."""
    CLAUDE = "claude"
    """Claude Code / skawld / agent-kit Markdown; the body is used verbatim."""
    PYTHON = "python"
    """Made in code (``AgentDefinition``) or inline in the config file; the body is verbatim."""


class LoadReason(StrEnum):
    """Structured reason of a per-file load failure (``docs/definitions.md``)."""

    MISSING_FRONTMATTER = "missing-frontmatter"
    INVALID_FRONTMATTER = "invalid-frontmatter"
    NAME_MISMATCH = "name-mismatch"
    NAME_COLLISION = "name-collision"
    IO_ERROR = "io-error"
    INVALID_DEFINITION = "invalid-definition"


@dataclass(frozen=True, slots=True, kw_only=True)
class Definition:
    """One validated subagent definition, ready to be rendered and launched.

    Instances are immutable and picklable. Build them through the loader, ``AgentDefinition(...)``
    or config entries, which apply every validation rule; constructing one directly skips them.
    """

    name: str
    """Identity used by ``clonefleet run NAME`` and ``subagent_type``."""
    description: str
    """When to use this subagent; shown to callers in catalogs."""
    body: str
    """Instructions appended to the base prompt: a Jinja template when :attr:`templated`."""
    dialect: Dialect = Dialect.PYTHON
    """How the definition was written (detected per file)."""
    path: str | None = None
    """Source file; ``<config file>:subagents.<name>`` for config entries; ``None`` for code."""
    model: str | None = None
    """``@mg:GROUP``, a model alias (``sonnet``) or a model id; ``None`` = the ``default`` group."""
    fallback_models: tuple[str, ...] = ()
    """Models tried, in order, after every candidate of :attr:`model` has failed."""
    tools: tuple[str, ...] | None = None
    """Granted tools (normalised names, shorthands such as ``tag!ALL`` kept); ``None`` = every
    tool of the caller (full access); ``()`` = no work tools at all."""
    tools_deny: tuple[str, ...] = ()
    """Tools removed from the granted set."""
    skills_allow: tuple[str, ...] = ()
    """Skills this subagent may use; empty = every skill not denied."""
    skills_deny: tuple[str, ...] = ()
    """Skills this subagent may never use."""
    undeferred_tools: tuple[str, ...] = ()
    """Tools whose full schemas appear up front instead of behind ``tool_search``."""
    autonomous_hint: str | None = None
    """Hint for an autonomous permission classifier (older spelling ``auto_facet_hint``)."""
    inherit_tools: bool = False
    """Union the caller's tools (never ``switch_facet``) into :attr:`tools` at spawn time."""
    allow_subagent_spawn: bool = False
    """Grant ``subagent`` and the job-control tools so this subagent can spawn its own."""
    subagent_provider: str | None = None
    """How its ``subagent`` tool starts children: ``spawn`` (a fresh context) or ``fork`` (a
    child of this definition inheriting the caller's turns); ``None`` = the config's
    ``subagent_provider`` (docs/prompt-cache.md, "Fork spawns")."""
    permissions: RuleSet = RuleSet()
    """This definition's layer of the permission policy: its ``tools`` and ``tools_deny``
    entries and its ``permissions`` table, as rules (docs/permissions.md)."""
    tools_requested: tuple[str, ...] | None = None
    """The ``tools`` entries as written (``Read``, ``Bash(git diff:*)``), for ``validate
    --tools``; ``None`` when the definition has no ``tools`` key."""
    exit_tool_schema: dict[str, Any] | None = field(default=None, hash=False)
    """Declared JSON Schema of the ``exit_tool`` payload; ``None`` = :data:`DEFAULT_EXIT_SCHEMA`."""
    max_turns: int | None = None
    """Most model turns of one run; ``None`` = no per-definition cap."""
    max_tokens: int | None = None
    """Token budget of one run; ``None`` = no per-definition cap."""
    mcp_servers: tuple[tuple[str, dict[str, Any]], ...] = field(default=(), hash=False)
    """The definition's own MCP servers (``mcpServers``) as ``(name, server entry)``, beside
    the config's; an empty entry names a server of the config (docs/mcp.md)."""
    templated: bool = False
    """Whether :attr:`body` is rendered as a template (native definitions only)."""
    warnings: tuple[str, ...] = ()
    """Problems found at load that did not stop the definition from loading."""
    shadows: tuple[str, ...] = ()
    """Sources of same-named definitions this one replaced, earliest first."""
    extra_keys: tuple[str, ...] = ()
    """Frontmatter keys kept but not used (claude dialect), in file order."""

    @property
    def effective_exit_schema(self) -> dict[str, Any]:
        """The ``exit_tool`` payload schema in force (a fresh copy, safe to mutate)."""
        return copy.deepcopy(
            self.exit_tool_schema if self.exit_tool_schema is not None else DEFAULT_EXIT_SCHEMA
        )

    @property
    def declares_exit_schema(self) -> bool:
        """True when the definition declared ``exit_tool_schema`` explicitly."""
        return self.exit_tool_schema is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadFailure:
    """A file (or config entry) that did not load."""

    path: str
    """The file, directory or config entry at fault."""
    reason: str
    """One of :class:`LoadReason`."""
    message: str
    """One sentence: what is wrong and how to fix it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadWarning:
    """A problem that did not stop a definition from loading."""

    path: str | None
    """Where it was found."""
    name: str | None
    """The definition it belongs to, when known."""
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectedSkill:
    """A skill referenced with ``@skill:NAME`` whose body is injected ahead of the first instruction."""

    name: str
    body: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CloneInfo:
    """What ``clone.*`` means inside a template."""

    index: int
    """0-based position of the clone in its batch."""
    count: int
    """Clones in the batch."""
    job_id: str
    """This clone's job handle (``sa_`` + 8 hex)."""
    number: int
    """1-based position (``index + 1``), for human-facing text such as "clone 3 of 5"."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderedClone:
    """The launch metadata of one clone, rendered once and never re-rendered on retry/failover."""

    index: int
    """0-based clone index within its batch."""
    task: str
    """The rendered task prompt (the caller's text after templating)."""
    instructions: str
    """Rendered body (native) or the verbatim body (claude, python)."""
    skills: tuple[InjectedSkill, ...] = ()
    """Skills referenced by ``@skill:`` in the task, in order of first mention."""
    job_id: str = ""
    """The job id this clone was rendered for (``clone.job_id``)."""
