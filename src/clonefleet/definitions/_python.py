"""Python-dialect definitions: ``AgentDefinition(...)`` objects made in code and their registry.

Registered definitions join every catalog loaded afterwards in this process, after all files and
before config ``subagents.<name>`` entries. The registry is per process: a Ray worker does not see
what the driver registered, so catalogs are loaded where definitions are registered.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from clonefleet.definitions._build import build_python
from clonefleet.definitions._definition import RESERVED_NAME, Definition, LoadReason
from clonefleet.errors import DefinitionError

__all__ = ["AgentDefinition", "register", "registered", "unregister"]

_LOCK = threading.Lock()
_REGISTRY: dict[str, Definition] = {}


def AgentDefinition(  # noqa: N802 - named like the agent-kit type it mirrors
    name: str,
    description: str,
    body: str | None = None,
    *,
    prompt: str | None = None,
    model: str | None = None,
    fallback_models: Sequence[str] = (),
    tools: Sequence[str] | None = None,
    tools_deny: Sequence[str] = (),
    skills_allow: Sequence[str] = (),
    skills_deny: Sequence[str] = (),
    undeferred_tools: Sequence[str] = (),
    autonomous_hint: str | None = None,
    inherit_tools: bool = False,
    allow_subagent_spawn: bool = False,
    subagent_provider: str | None = None,
    exit_tool_schema: dict[str, Any] | None = None,
    max_turns: int | None = None,
    max_tokens: int | None = None,
    mcp_servers: Mapping[str, Any] | Sequence[Any] | None = None,
    permissions: Mapping[str, Any] | None = None,
) -> Definition:
    """Make a validated python-dialect :class:`Definition` in code (agent-kit style).

    The keyword arguments mirror the native ``clonefleet:`` keys; ``prompt`` is accepted as
    agent-kit's name for ``body``. The body is used verbatim (not templated). Call
    :func:`register` to make the definition visible to catalogs.

    Raises:
        DefinitionError: ``invalid-definition`` when a validation rule or a key type is broken
            (docs/definitions.md).
    """
    spec: dict[str, Any] = {
        "name": name,
        "description": description,
        "body": body,
        "prompt": prompt,
        "model": model,
        "fallback_models": list(fallback_models),
        "tools": None if tools is None else list(tools),
        "tools_deny": list(tools_deny),
        "skills_allow": list(skills_allow),
        "skills_deny": list(skills_deny),
        "undeferred_tools": list(undeferred_tools),
        "autonomous_hint": autonomous_hint,
        "inherit_tools": inherit_tools,
        "allow_subagent_spawn": allow_subagent_spawn,
        "subagent_provider": subagent_provider,
        "exit_tool_schema": exit_tool_schema,
        "max_turns": max_turns,
        "max_tokens": max_tokens,
        "mcp_servers": dict(mcp_servers) if isinstance(mcp_servers, Mapping) else mcp_servers,
        "permissions": None if permissions is None else dict(permissions),
    }
    return build_python(spec)


def register(defn: Definition) -> Definition:
    """Add ``defn`` to this process's registry, replacing a registered one of the same name.

    Returns:
        ``defn``, so ``register(AgentDefinition(...))`` reads naturally.

    Raises:
        DefinitionError: ``invalid-definition`` for the reserved ``_default`` name or a non-definition.
    """
    if not isinstance(defn, Definition):
        raise DefinitionError(
            f"register() takes a Definition (from AgentDefinition(...)), not {type(defn).__name__}",
            LoadReason.INVALID_DEFINITION,
        )
    if defn.name == RESERVED_NAME:
        raise DefinitionError(
            f"`{RESERVED_NAME}` is built in and cannot be replaced [rule reserved-name, key `name`]",
            LoadReason.INVALID_DEFINITION,
            None,
            "name",
        )
    with _LOCK:
        _REGISTRY[defn.name] = defn
    return defn


def unregister(name: str) -> bool:
    """Remove a registered definition; returns whether one was registered under ``name``."""
    with _LOCK:
        return _REGISTRY.pop(name, None) is not None


def registered() -> tuple[Definition, ...]:
    """The registered definitions, in registration order."""
    with _LOCK:
        return tuple(_REGISTRY.values())
