"""Turning parsed frontmatter into a validated :class:`Definition`, for all three dialects.

This module owns what the keys mean: the strict native ``clonefleet:`` namespace (a pydantic model
with ``extra="forbid"``), the forgiving Claude-style keys, the python/config keys, tool-name
normalisation, every validation rule of SPEC §2.3 and the exit-schema checks. Rule violations
raise ``DefinitionError(reason="invalid-definition")`` whose message names the rule and the key.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import DefinitionError
from ._model import (
    CLAUDE_TOOL_ALIASES,
    CONTROL_TOOLS,
    KNOWN_TOOLS,
    RESERVED_NAME,
    SPAWN_TOOLS,
    STATUS_FAMILIES,
    Definition,
    Dialect,
    LoadReason,
)
from ._parse import NAMESPACE_KEYS, RawDefinition

__all__ = [
    "NativeKeys",
    "build_definition",
    "build_python",
    "check_exit_schema",
    "exit_schema_enum_warnings",
]

PROTECTED_FROM_DENY: tuple[str, ...] = (
    "exit_tool",
    "progress_update",
    "job_status",
    "job_result",
    "job_cancel",
    "job_block",
    "list_jobs",
    "tool_search",
    "subagent",
    "skill",
)
"""Tools ``tools_deny`` may not name: the run could not finish or be controlled without them."""

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@+-]{0,127}$")
_PATTERNED_TOOL = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)\((.*)\)$")
_CLAUDE_USED_KEYS = frozenset(
    {"name", "description", "tools", "disallowedTools", "model", "maxTurns", "skills"}
)
_CLAUDE_QUIET_KEYS = frozenset({"color"})
_CLAUDE_UNSUPPORTED_KEYS = frozenset({"mcpServers", "hooks", "permissionMode"})
_NATIVE_TOP_KEYS = frozenset({"name", "description", *NAMESPACE_KEYS})


class NativeKeys(BaseModel):
    """The keys allowed under a native definition's ``clonefleet:`` namespace (typos are errors)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, protected_namespaces=())

    model: str | None = None
    """``@mg:GROUP``, an alias or a model id; unknown ids are resolved at spawn time, not here."""
    fallback_models: list[str] = Field(default_factory=list)
    """Models tried after the group's candidates, in order."""
    tools: list[str] | None = None
    """Granted tools; absent = every tool of the caller; ``[]`` = none."""
    tools_deny: list[str] = Field(default_factory=list)
    """Literal tool names removed from the granted set."""
    skills_allow: list[str] = Field(default_factory=list)
    """Skills the subagent may use; empty = all not denied."""
    skills_deny: list[str] = Field(default_factory=list)
    """Skills the subagent may never use."""
    undeferred_tools: list[str] = Field(default_factory=list)
    """Tools whose full schemas are shown up front."""
    autonomous_hint: str | None = None
    """Hint passed to an autonomous permission classifier."""
    auto_facet_hint: str | None = None
    """Older spelling of ``autonomous_hint``; ``autonomous_hint`` wins when both are given."""
    inherit_tools: bool = False
    """Union the caller's tools into ``tools`` at spawn time."""
    allow_subagent_spawn: bool = False
    """Let this subagent spawn subagents of its own."""
    exit_tool_schema: dict[str, Any] | None = None
    """JSON Schema (Draft 2020-12) of the ``exit_tool`` payload."""
    max_turns: int | None = Field(None, ge=1)
    """Most model turns of one run."""
    max_tokens: int | None = Field(None, ge=1)
    """Token budget of one run."""


class _PythonKeys(NativeKeys):
    """Keys of a python-dialect definition (``AgentDefinition`` kwargs or a config entry)."""

    name: str | None = None
    description: str | None = None
    body: str | None = None
    prompt: str | None = None
    """agent-kit's spelling of ``body``."""


def _rule_error(rule: str, key: str, message: str, path: str | None) -> DefinitionError:
    return DefinitionError(
        f"{message} [rule {rule}, key `{key}`]", LoadReason.INVALID_DEFINITION, path, key
    )


def _pydantic_error(
    exc: ValidationError, prefix: str, path: str | None, known: Sequence[str]
) -> DefinitionError:
    problems: list[str] = []
    first_key = prefix.rstrip(".")
    for i, err in enumerate(exc.errors()):
        key = prefix + ".".join(str(p) for p in err["loc"])
        if i == 0:
            first_key = key
        if err["type"] == "extra_forbidden":
            guess = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
            hint = (
                f"; did you mean `{prefix}{guess[0]}`?"
                if guess
                else f"; known keys: {', '.join(known)}"
            )
            problems.append(f"`{key}` is not a known key{hint} [rule unknown-key]")
        else:
            problems.append(f"`{key}`: {err['msg'].lower()} [rule key-type]")
    return DefinitionError("; ".join(problems), LoadReason.INVALID_DEFINITION, path, first_key)


def _check_name(name: Any, key: str, path: str | None, *, shipped: bool) -> str:
    if not isinstance(name, str) or not name.strip():
        raise _rule_error(
            "name-required", key, "the definition needs a non-empty string `name`", path
        )
    if not _NAME.match(name):
        raise _rule_error(
            "name-format",
            key,
            f"name {name!r} must be 1-128 characters of letters, digits and `_.:@+-`, without spaces",
            path,
        )
    if name == RESERVED_NAME and not shipped:
        raise _rule_error(
            "reserved-name",
            key,
            f"`{RESERVED_NAME}` is built in and cannot be replaced; choose another name",
            path,
        )
    return name


def _split_tool_string(value: str) -> list[str]:
    pieces: list[str] = []
    for part in value.split(","):
        part = part.strip()
        pieces.extend([part] if "(" in part else part.split())
    return [p for p in pieces if p]


def _is_shorthand(tool: str) -> bool:
    return tool.startswith("tag!") or (tool.startswith("mcp__") and "__" not in tool[5:])


def _normalise_tools(
    values: Sequence[str], key: str, warnings: list[str], *, grant: bool
) -> tuple[str, ...]:
    """Map aliases, handle ``Tool(pattern)`` entries and warn about tools clonefleet lacks."""
    out: list[str] = []
    for raw in values:
        name = raw.strip()
        patterned = _PATTERNED_TOOL.match(name)
        if patterned:
            base = CLAUDE_TOOL_ALIASES.get(patterned.group(1), patterned.group(1))
            if grant:
                warnings.append(
                    f"`{key}` entry {raw!r}: argument patterns are not supported; {base} is not granted"
                )
                continue
            warnings.append(
                f"`{key}` entry {raw!r}: argument patterns are not supported; all of {base} is denied"
            )
            name = patterned.group(1)
        name = CLAUDE_TOOL_ALIASES.get(name, name)
        if not name or name in out:
            continue
        if grant and name not in KNOWN_TOOLS and name not in ("tag!ALL", "tag!ALL_MCP"):
            warnings.append(
                f"`{key}` names tool {name!r}, which is not available in clonefleet; the definition loads and"
                " the tool is left out unless a host provides it"
            )
        out.append(name)
    return tuple(out)


def _rules(
    *,
    tools: tuple[str, ...] | None,
    tools_deny: tuple[str, ...],
    undeferred: tuple[str, ...],
    inherit_tools: bool,
    allow_spawn: bool,
    keys: Mapping[str, str],
) -> list[tuple[str, str, str]]:
    """Return every broken SPEC §2.3 tool rule as ``(rule, key, message)``."""
    broken: list[tuple[str, str, str]] = []
    granted = tools or ()
    if "exit_tool" in granted:
        broken.append(
            (
                "exit-tool-in-tools",
                keys["tools"],
                "`exit_tool` is given to every subagent; do not list it",
            )
        )
    for key, listed in (("tools", granted), ("undeferred_tools", undeferred)):
        if "switch_facet" in listed:
            broken.append(
                (
                    "switch-facet-listed",
                    keys[key],
                    "`switch_facet` is never available to a subagent",
                )
            )
    for tool in tools_deny:
        if tool.startswith("tag!"):
            broken.append(
                (
                    "tools-deny-tag",
                    keys["tools_deny"],
                    f"{tool!r}: use literal tool names, not tag! references",
                )
            )
        elif _is_shorthand(tool):
            broken.append(
                (
                    "tools-deny-mcp-shorthand",
                    keys["tools_deny"],
                    f"{tool!r}: name full mcp__<server>__<tool> tools",
                )
            )
        elif tool in PROTECTED_FROM_DENY:
            broken.append(
                ("tools-deny-protected", keys["tools_deny"], f"{tool!r} cannot be denied")
            )
    for tool in undeferred:
        if tool.startswith("tag!"):
            broken.append(
                ("undeferred-tag", keys["undeferred_tools"], f"{tool!r}: use literal tool names")
            )
        elif tool in tools_deny:
            broken.append(
                ("deny-and-undeferred", keys["undeferred_tools"], f"{tool!r} is also in tools_deny")
            )
    if not inherit_tools and tools is not None and not any(_is_shorthand(t) for t in tools):
        always = set(CONTROL_TOOLS) | (set(SPAWN_TOOLS) if allow_spawn else set())
        missing = [
            t for t in undeferred if t not in tools and t not in always and not t.startswith("tag!")
        ]
        broken += [
            (
                "undeferred-not-granted",
                keys["undeferred_tools"],
                f"{t!r} is undeferred but not in tools",
            )
            for t in missing
        ]
    return broken


def _walk_refs(node: Any) -> list[str]:
    refs: list[str] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if k in ("$ref", "$dynamicRef") and isinstance(v, str):
                    refs.append(v)
                else:
                    stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
    return refs


def _anchors(node: Any) -> set[str]:
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if k in ("$anchor", "$dynamicAnchor") and isinstance(v, str):
                    found.add(v)
                stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _resolve_pointer(doc: Any, fragment: str) -> Any:
    """Resolve ``#/a/b`` inside ``doc``; raise ``LookupError`` when it leads nowhere."""
    node = doc
    for token in fragment.lstrip("/").split("/") if fragment.strip("/") else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise LookupError(token)
    return node


def check_exit_schema(schema: Any, key: str, path: str | None) -> dict[str, Any]:
    """Validate a declared ``exit_tool_schema`` and return it as plain JSON data.

    Raises:
        DefinitionError: ``invalid-definition`` with rule ``exit-schema-invalid`` (not a Draft
            2020-12 schema, not JSON data) or ``exit-schema-ref`` (a ``$ref`` outside the document).
    """
    if not isinstance(schema, dict):
        raise _rule_error("exit-schema-invalid", key, "the exit schema must be a JSON object", path)
    try:
        plain: dict[str, Any] = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise _rule_error(
            "exit-schema-invalid", key, f"the exit schema is not JSON data ({exc})", path
        ) from None
    try:
        jsonschema.Draft202012Validator.check_schema(plain)
    except jsonschema.SchemaError as exc:
        raise _rule_error(
            "exit-schema-invalid",
            key,
            f"not a valid Draft 2020-12 JSON Schema at {exc.json_path}: {exc.message}",
            path,
        ) from None
    anchors = _anchors(plain)
    for ref in _walk_refs(plain):
        if not ref.startswith("#"):
            raise _rule_error(
                "exit-schema-ref",
                key,
                f"$ref {ref!r} points outside the schema document (refs are never fetched)",
                path,
            )
        fragment = ref[1:]
        if fragment and not fragment.startswith("/"):
            if fragment not in anchors:
                raise _rule_error(
                    "exit-schema-ref", key, f"$ref {ref!r} names no anchor in the document", path
                )
            continue
        try:
            _resolve_pointer(plain, fragment)
        except LookupError:
            raise _rule_error(
                "exit-schema-ref", key, f"$ref {ref!r} does not resolve inside the document", path
            ) from None
    return plain


def exit_schema_enum_warnings(schema: Mapping[str, Any], key: str) -> list[str]:
    """Warn about ``status``/``kind``/``outcome`` string enums outside the recognised families."""
    recognised = frozenset().union(*STATUS_FAMILIES.values())
    warnings: list[str] = []
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return warnings
    for field_name in ("status", "kind", "outcome"):
        prop = properties.get(field_name)
        if (
            isinstance(prop, dict)
            and isinstance(prop.get("$ref"), str)
            and prop["$ref"].startswith("#/")
        ):
            try:
                prop = _resolve_pointer(schema, prop["$ref"][1:])
            except LookupError:
                continue
        if not isinstance(prop, dict):
            continue
        values = list(prop.get("enum") or []) if isinstance(prop.get("enum"), list) else []
        if "const" in prop:
            values.append(prop["const"])
        odd = [v for v in values if isinstance(v, str) and v.lower() not in recognised]
        if odd:
            warnings.append(
                f"`{key}` property `{field_name}` allows {', '.join(repr(v) for v in odd)}, outside the recognised"
                " status families (success/ok/done/completed, failure/failed/error, cancelled/canceled/cancel);"
                " the exit check will not recognise them - use recognised values or add a `success` boolean"
            )
    if schema.get("type") not in ("object", None):
        warnings.append(
            f"`{key}` top-level type is not `object`; exit_tool arguments are always an object"
        )
    return warnings


def _finish(
    *,
    dialect: Dialect,
    name: str,
    description: str,
    body: str,
    keys: NativeKeys,
    path: str | None,
    warnings: list[str],
    key_names: Mapping[str, str],
    extra_keys: tuple[str, ...] = (),
) -> Definition:
    """Normalise tool lists, apply every rule and assemble the :class:`Definition`."""
    tools = (
        None
        if keys.tools is None
        else _normalise_tools(keys.tools, key_names["tools"], warnings, grant=True)
    )
    deny = _normalise_tools(keys.tools_deny, key_names["tools_deny"], warnings, grant=False)
    undeferred = _normalise_tools(
        keys.undeferred_tools, key_names["undeferred_tools"], warnings, grant=True
    )
    broken = _rules(
        tools=tools,
        tools_deny=deny,
        undeferred=undeferred,
        inherit_tools=keys.inherit_tools,
        allow_spawn=keys.allow_subagent_spawn,
        keys=key_names,
    )
    model = keys.model.strip() if keys.model is not None else None
    if model is not None and not model:
        broken.append(
            (
                "model-format",
                key_names["model"],
                "`model` must not be empty; omit it for the default group",
            )
        )
    elif model is not None and model.startswith("@mg:") and not model[4:].strip():
        broken.append(
            ("model-format", key_names["model"], "`@mg:` must be followed by a model group name")
        )
    if broken:
        first = broken[0][1]
        message = "; ".join(f"{msg} [rule {rule}, key `{key}`]" for rule, key, msg in broken)
        raise DefinitionError(message, LoadReason.INVALID_DEFINITION, path, first)
    schema = None
    if keys.exit_tool_schema is not None:
        schema = check_exit_schema(keys.exit_tool_schema, key_names["exit_tool_schema"], path)
        warnings.extend(exit_schema_enum_warnings(schema, key_names["exit_tool_schema"]))
    return Definition(
        name=name,
        description=description,
        dialect=dialect,
        path=path,
        body=body,
        model=None if model == "inherit" else model,
        fallback_models=tuple(m.strip() for m in keys.fallback_models if m.strip()),
        tools=tools,
        tools_deny=deny,
        skills_allow=tuple(keys.skills_allow),
        skills_deny=tuple(keys.skills_deny),
        undeferred_tools=undeferred,
        autonomous_hint=keys.autonomous_hint
        if keys.autonomous_hint is not None
        else keys.auto_facet_hint,
        inherit_tools=keys.inherit_tools,
        allow_subagent_spawn=keys.allow_subagent_spawn,
        exit_tool_schema=schema,
        max_turns=keys.max_turns,
        max_tokens=keys.max_tokens,
        templated=dialect is Dialect.NATIVE,
        warnings=tuple(dict.fromkeys(warnings)),
        extra_keys=extra_keys,
    )


def _native_key_names(ns: str) -> dict[str, str]:
    return {k: f"{ns}.{k}" for k in NativeKeys.model_fields}


def _build_native(raw: RawDefinition, stem: str | None, shipped: bool) -> Definition:
    fm, path = raw.frontmatter, raw.path
    present = [k for k in NAMESPACE_KEYS if k in fm]
    if len(present) > 1:
        raise _rule_error(
            "one-namespace", "polytoken", "use either `clonefleet:` or `polytoken:`, not both", path
        )
    ns = present[0] if present else "clonefleet"
    name = _check_name(fm.get("name"), "name", path, shipped=shipped)
    if stem is not None and name != stem:
        raise DefinitionError(
            f"name {name!r} must equal the file name {stem!r} in a native definition; rename one of them",
            LoadReason.NAME_MISMATCH,
            path,
            "name",
        )
    description = fm.get("description")
    if not isinstance(description, str) or not description.strip():
        raise _rule_error(
            "description-required",
            "description",
            "a native definition needs a `description` string",
            path,
        )
    table = fm.get(ns) or {}
    if not isinstance(table, dict):
        raise _rule_error("key-type", ns, f"`{ns}:` must be a mapping of keys", path)
    try:
        keys = NativeKeys.model_validate(table)
    except ValidationError as exc:
        raise _pydantic_error(exc, f"{ns}.", path, list(NativeKeys.model_fields)) from None
    warnings = list(raw.warnings)
    warnings += [
        f"top-level key `{k}` is ignored in a native definition; put it under `{ns}:`"
        for k in fm
        if k not in _NATIVE_TOP_KEYS
    ]
    return _finish(
        dialect=Dialect.NATIVE,
        name=name,
        description=description.strip(),
        body=raw.body,
        keys=keys,
        path=path,
        warnings=warnings,
        key_names=_native_key_names(ns),
    )


def _claude_list(value: Any, key: str, path: str | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return _split_tool_string(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [p for v in value for p in (_split_tool_string(v) if "," in v else [v.strip()]) if p]
    raise _rule_error(
        "key-type", key, f"`{key}` must be a list of names or a comma-separated string", path
    )


def _claude_scalar(value: Any, key: str, path: str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise _rule_error("key-type", key, f"`{key}` must be a string", path)


def _claude_max_turns(value: Any, path: str | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _rule_error("key-type", "maxTurns", "`maxTurns` must be a positive integer", path)
    return value


def _build_claude(raw: RawDefinition, stem: str | None, shipped: bool) -> Definition:
    fm, path = raw.frontmatter, raw.path
    warnings = list(raw.warnings)
    name = _claude_scalar(fm.get("name"), "name", path)
    if name is None and stem is not None:
        warnings.append(f"no `name` key; using the file name {stem!r}")
        name = stem
    name = _check_name(
        name.strip() if isinstance(name, str) else name, "name", path, shipped=shipped
    )
    description = _claude_scalar(fm.get("description"), "description", path)
    if not description or not description.strip():
        warnings.append("no `description`; callers will not know when to use this subagent")
        description = ""
    tools = _claude_list(fm.get("tools"), "tools", path)
    if tools == [] and isinstance(fm.get("tools"), str):
        warnings.append(
            "`tools` is an empty string, read as absent: every tool of the caller; use [] for none"
        )
        tools = None
    if tools == ["*"]:
        tools = None  # "all tools", as some shared agent files spell it
    extra = tuple(k for k in fm if k not in _CLAUDE_USED_KEYS)
    for k in extra:
        if k in _CLAUDE_UNSUPPORTED_KEYS:
            warnings.append(f"key `{k}` is not supported by clonefleet and is ignored")
        elif k not in _CLAUDE_QUIET_KEYS:
            warnings.append(f"unknown key `{k}` is kept and ignored")
    keys = NativeKeys.model_construct(
        model=_claude_scalar(fm.get("model"), "model", path),
        fallback_models=[],
        tools=tools,
        tools_deny=_claude_list(fm.get("disallowedTools"), "disallowedTools", path) or [],
        skills_allow=_claude_list(fm.get("skills"), "skills", path) or [],
        skills_deny=[],
        undeferred_tools=[],
        autonomous_hint=None,
        auto_facet_hint=None,
        inherit_tools=False,
        allow_subagent_spawn=False,
        exit_tool_schema=None,
        max_turns=_claude_max_turns(fm.get("maxTurns"), path),
        max_tokens=None,
    )
    names = {k: k for k in NativeKeys.model_fields} | {
        "tools_deny": "disallowedTools",
        "max_turns": "maxTurns",
    }
    return _finish(
        dialect=Dialect.CLAUDE,
        name=name,
        description=description.strip(),
        body=raw.body,
        keys=keys,
        path=path,
        warnings=warnings,
        key_names=names,
        extra_keys=extra,
    )


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
        return _build_native(raw, stem, shipped)
    return _build_claude(raw, stem, shipped)


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
        raise _pydantic_error(exc, "", path, list(_PythonKeys.model_fields)) from None
    name = _check_name(keys.name, "name", path, shipped=False)
    if expected_name is not None and name != expected_name:
        raise DefinitionError(
            f"name {name!r} must equal its config key {expected_name!r}",
            LoadReason.NAME_MISMATCH,
            path,
            "name",
        )
    if not keys.description or not keys.description.strip():
        raise _rule_error(
            "description-required", "description", "a definition needs a `description` string", path
        )
    if keys.body is not None and keys.prompt is not None:
        raise _rule_error("one-body", "prompt", "give either `body` or `prompt`, not both", path)
    return _finish(
        dialect=Dialect.PYTHON,
        name=name,
        description=keys.description.strip(),
        body=keys.body if keys.body is not None else keys.prompt or "",
        keys=keys,
        path=path,
        warnings=[],
        key_names={k: k for k in NativeKeys.model_fields},
    )
