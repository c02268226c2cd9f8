"""Turning parsed frontmatter into a validated :class:`Definition`, for all three dialects.

Each dialect has a reader: the strict native ``clonefleet:`` namespace, the forgiving Claude-style
keys and the python/config keys. A reader checks the name and description and turns the keys into
:class:`~._rules.NativeKeys`; :func:`_assemble` then applies the rules of ``_rules``, checks a
declared exit schema (``_exit_schema``) and makes the :class:`Definition`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from clonefleet.definitions._definition import Definition, Dialect
from clonefleet.definitions._exit_schema import check_exit_schema, exit_schema_enum_warnings
from clonefleet.definitions._mcp import read_mcp_servers
from clonefleet.definitions._parse import NAMESPACE_KEYS, RawDefinition
from clonefleet.definitions._rules import (
    NativeKeys,
    broken_rules,
    check_expected_name,
    check_name,
    claude_permissions,
    claude_spawn,
    pydantic_error,
    raise_broken,
    rule_error,
    tool_lists,
)

__all__ = ["build_definition", "build_python"]

_CLAUDE_USED_KEYS = frozenset(
    {"name", "description", "tools", "disallowedTools", "model", "maxTurns", "skills", "mcpServers"}
    | {"permissions", "subagent_provider"}
)
_CLAUDE_QUIET_KEYS = frozenset({"color"})
_CLAUDE_UNSUPPORTED_KEYS = frozenset({"hooks", "permissionMode"})
_NATIVE_TOP_KEYS = frozenset({"name", "description", *NAMESPACE_KEYS})


class _PythonKeys(NativeKeys):
    """Keys of a python-dialect definition (``AgentDefinition`` kwargs or a config entry)."""

    name: str | None = None
    description: str | None = None
    body: str | None = None
    prompt: str | None = None
    """agent-kit's spelling of ``body``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Read:
    """What a dialect's reader made of a definition, before the rules are applied."""

    name: str
    description: str
    body: str
    keys: NativeKeys
    key_names: Mapping[str, str]
    """How the source spells each key of :class:`NativeKeys` (for error messages)."""
    warnings: tuple[str, ...] = ()
    extra_keys: tuple[str, ...] = ()


def _key_names(prefix: str = "") -> dict[str, str]:
    return {k: f"{prefix}{k}" for k in NativeKeys.model_fields}


def _assemble(read: _Read, dialect: Dialect, path: str | None) -> Definition:
    """Normalise the tool lists, apply every rule, check the exit schema; make the definition."""
    keys, warnings = read.keys, list(read.warnings)
    tools = tool_lists(keys, read.key_names, warnings, strict=dialect is not Dialect.CLAUDE)
    model = keys.model.strip() if keys.model is not None else None
    raise_broken(broken_rules(tools, keys, model, read.key_names), path)
    schema = None
    if keys.exit_tool_schema is not None:
        schema_key = read.key_names["exit_tool_schema"]
        schema = check_exit_schema(keys.exit_tool_schema, schema_key, path)
        warnings.extend(exit_schema_enum_warnings(schema, schema_key))
    if keys.subagent_provider is not None and not keys.allow_subagent_spawn:
        warnings.append(
            f"`{read.key_names['subagent_provider']}` has no effect: this subagent may not spawn"
        )
    return Definition(
        name=read.name,
        description=read.description,
        dialect=dialect,
        path=path,
        body=read.body,
        model=None if model == "inherit" else model,
        fallback_models=tuple(m.strip() for m in keys.fallback_models if m.strip()),
        tools=tools.granted,
        tools_deny=tools.denied,
        skills_allow=tuple(keys.skills_allow),
        skills_deny=tuple(keys.skills_deny),
        undeferred_tools=tools.undeferred,
        autonomous_hint=keys.autonomous_hint
        if keys.autonomous_hint is not None
        else keys.auto_facet_hint,
        inherit_tools=keys.inherit_tools,
        allow_subagent_spawn=keys.allow_subagent_spawn,
        subagent_provider=keys.subagent_provider,
        permissions=replace(tools.rules, source=f"definition {read.name}"),
        tools_requested=None
        if keys.tools is None
        else tuple(dict.fromkeys(t.strip() for t in keys.tools if t.strip())),
        exit_tool_schema=schema,
        max_turns=keys.max_turns,
        max_tokens=keys.max_tokens,
        mcp_servers=read_mcp_servers(keys.mcp_servers, read.key_names["mcp_servers"], path),
        templated=dialect is Dialect.NATIVE,
        warnings=tuple(dict.fromkeys(warnings)),
        extra_keys=read.extra_keys,
    )


# -- native ---------------------------------------------------------------------------------------


def _native_namespace(fm: Mapping[str, Any], path: str | None) -> str:
    present = [k for k in NAMESPACE_KEYS if k in fm]
    if len(present) > 1:
        raise rule_error(
            "one-namespace", "polytoken", "use either `clonefleet:` or `polytoken:`, not both", path
        )
    return present[0] if present else "clonefleet"


def _read_native(raw: RawDefinition, stem: str | None, shipped: bool) -> _Read:
    fm, path = raw.frontmatter, raw.path
    ns = _native_namespace(fm, path)
    name = check_name(fm.get("name"), "name", path, shipped=shipped)
    advice = " in a native definition; rename one of them"
    check_expected_name(name, stem, path, what="the file name", advice=advice)
    description = fm.get("description")
    if not isinstance(description, str) or not description.strip():
        raise rule_error(
            "description-required",
            "description",
            "a native definition needs a `description` string",
            path,
        )
    table = fm.get(ns) or {}
    if not isinstance(table, dict):
        raise rule_error("key-type", ns, f"`{ns}:` must be a mapping of keys", path)
    try:
        keys = NativeKeys.model_validate(table)
    except ValidationError as exc:
        raise pydantic_error(exc, f"{ns}.", path, list(NativeKeys.model_fields)) from None
    ignored = tuple(
        f"top-level key `{k}` is ignored in a native definition; put it under `{ns}:`"
        for k in fm
        if k not in _NATIVE_TOP_KEYS
    )
    return _Read(
        name=name,
        description=description.strip(),
        body=raw.body,
        keys=keys,
        key_names=_key_names(f"{ns}."),
        warnings=raw.warnings + ignored,
    )


# -- claude ---------------------------------------------------------------------------------------


def _split_tool_string(value: str) -> list[str]:
    pieces: list[str] = []
    for part in value.split(","):
        part = part.strip()
        pieces.extend([part] if "(" in part else part.split())
    return [p for p in pieces if p]


def _claude_list(value: object, key: str, path: str | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return _split_tool_string(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [p for v in value for p in (_split_tool_string(v) if "," in v else [v.strip()]) if p]
    raise rule_error(
        "key-type", key, f"`{key}` must be a list of names or a comma-separated string", path
    )


def _claude_scalar(value: object, key: str, path: str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise rule_error("key-type", key, f"`{key}` must be a string", path)


def _claude_max_turns(value: object, path: str | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise rule_error("key-type", "maxTurns", "`maxTurns` must be a positive integer", path)
    return value


def _claude_name(
    fm: Mapping[str, Any], stem: str | None, path: str | None, shipped: bool, warnings: list[str]
) -> str:
    name = _claude_scalar(fm.get("name"), "name", path)
    if name is None and stem is not None:
        warnings.append(f"no `name` key; using the file name {stem!r}")
        name = stem
    return check_name(
        name.strip() if isinstance(name, str) else name, "name", path, shipped=shipped
    )


def _claude_tools(fm: Mapping[str, Any], path: str | None, warnings: list[str]) -> list[str] | None:
    tools = _claude_list(fm.get("tools"), "tools", path)
    if tools == [] and isinstance(fm.get("tools"), str):
        warnings.append(
            "`tools` is an empty string, read as absent: every tool of the caller; use [] for none"
        )
        return None
    if tools == ["*"]:
        return None  # "all tools", as some shared agent files spell it
    return tools


def _claude_provider(value: object, path: str | None) -> str | None:
    if value is None or value in ("spawn", "fork"):
        return value
    raise rule_error(
        "key-type", "subagent_provider", "`subagent_provider` must be `spawn` or `fork`", path
    )


def _claude_extra_keys(fm: Mapping[str, Any], warnings: list[str]) -> tuple[str, ...]:
    extra = tuple(k for k in fm if k not in _CLAUDE_USED_KEYS)
    for k in extra:
        if k in _CLAUDE_UNSUPPORTED_KEYS:
            warnings.append(f"key `{k}` is not supported by clonefleet and is ignored")
        elif k not in _CLAUDE_QUIET_KEYS:
            warnings.append(f"unknown key `{k}` is kept and ignored")
    return extra


def _read_claude(raw: RawDefinition, stem: str | None, shipped: bool) -> _Read:
    fm, path = raw.frontmatter, raw.path
    warnings = list(raw.warnings)
    name = _claude_name(fm, stem, path, shipped, warnings)
    description = _claude_scalar(fm.get("description"), "description", path)
    if not description or not description.strip():
        warnings.append("no `description`; callers will not know when to use this subagent")
        description = ""
    tools = _claude_tools(fm, path, warnings)
    extra = _claude_extra_keys(fm, warnings)
    denied = _claude_list(fm.get("disallowedTools"), "disallowedTools", path) or []
    spawn, denied = claude_spawn(tools, denied, warnings)  # `Task` in tools: may spawn
    keys = NativeKeys.model_construct(  # the keys not given keep their defaults
        model=_claude_scalar(fm.get("model"), "model", path),
        tools=tools,
        tools_deny=denied,
        allow_subagent_spawn=spawn,
        subagent_provider=_claude_provider(fm.get("subagent_provider"), path),
        permissions=claude_permissions(fm.get("permissions"), path, warnings),
        skills_allow=_claude_list(fm.get("skills"), "skills", path) or [],
        max_turns=_claude_max_turns(fm.get("maxTurns"), path),
        mcp_servers=fm.get("mcpServers"),  # checked in _assemble
    )
    return _Read(
        name=name,
        description=description.strip(),
        body=raw.body,
        keys=keys,
        key_names=_key_names()
        | {"tools_deny": "disallowedTools", "max_turns": "maxTurns", "mcp_servers": "mcpServers"},
        warnings=tuple(warnings),
        extra_keys=extra,
    )


# -- entry points ---------------------------------------------------------------------------------


def build_definition(
    raw: RawDefinition, stem: str | None = None, *, shipped: bool = False
) -> Definition:
    """Build a definition from a parsed file, detecting the dialect from its frontmatter.

    Args:
        raw: the parsed file.
        stem: the file name without ``.md``; a native ``name`` must equal it.
        shipped: allow the reserved ``_default`` name (the package's own definitions only).

    Raises:
        DefinitionError: ``invalid-definition`` or ``name-mismatch``.
    """
    if raw.native or any(k in raw.frontmatter for k in NAMESPACE_KEYS):
        return _assemble(_read_native(raw, stem, shipped), Dialect.NATIVE, raw.path)
    return _assemble(_read_claude(raw, stem, shipped), Dialect.CLAUDE, raw.path)


def build_python(
    spec: Mapping[str, Any], *, path: str | None = None, expected_name: str | None = None
) -> Definition:
    """Build a python-dialect definition from keyword arguments or a config ``subagents`` entry.

    Raises:
        DefinitionError: ``invalid-definition`` (a rule or key broken) or ``name-mismatch``
            (a config entry whose ``name`` differs from its key).
    """
    data = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items() if v is not None}
    if expected_name is not None:
        data.setdefault("name", expected_name)
    try:
        keys = _PythonKeys.model_validate(data)
    except ValidationError as exc:
        raise pydantic_error(exc, "", path, list(_PythonKeys.model_fields)) from None
    name = check_name(keys.name, "name", path, shipped=False)
    check_expected_name(name, expected_name, path, what="its config key")
    if not keys.description or not keys.description.strip():
        raise rule_error(
            "description-required", "description", "a definition needs a `description` string", path
        )
    if keys.body is not None and keys.prompt is not None:
        raise rule_error("one-body", "prompt", "give either `body` or `prompt`, not both", path)
    body = keys.body if keys.body is not None else keys.prompt or ""
    read = _Read(
        name=name,
        description=keys.description.strip(),
        body=body,
        keys=keys,
        key_names=_key_names(),
    )
    return _assemble(read, Dialect.PYTHON, path)
