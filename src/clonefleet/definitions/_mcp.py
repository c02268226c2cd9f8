"""A definition's own MCP servers: the claude dialect's ``mcpServers`` and the native
``mcp_servers``, checked and turned into ``(name, server entry)`` pairs (docs/mcp.md).

An entry is the config's server shape (``clonefleet.config.McpServerConfig``): ``{command,
args, env, cwd}`` or ``{url, headers}``, plus time limits. A bare name, as Claude Code files may
list, refers to a server of the config and becomes ``(name, {})``; whether the config has it is
only known where the batch is planned. Nothing here starts a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from clonefleet.config import McpServerConfig, check_mcp_server_name
from clonefleet.definitions._rules import rule_error
from clonefleet.errors import DefinitionError

__all__ = ["McpEntries", "read_mcp_servers"]

McpEntries = tuple[tuple[str, dict[str, Any]], ...]
"""``(name, server entry)`` pairs; an empty entry names a server of the config."""

_RULE = "mcp-servers"


def read_mcp_servers(value: object, key: str, path: str | None) -> McpEntries:
    """Check a definition's MCP servers and return them as ``(name, entry)`` pairs, in order.

    Args:
        value: the key's value: absent, a mapping of name → entry, or a list whose items are
            names (servers of the config) or one-key mappings ``{name: entry}``.
        key: how the file spells the key (``mcpServers``, ``clonefleet.mcp_servers``).
        path: the definition's file, for the error.

    Raises:
        DefinitionError: ``invalid-definition`` (rule ``mcp-servers``) naming the key and the
            server: a bad shape, name or entry, or a name given twice.
    """
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list):
        items = [_list_item(item, key, path) for item in value]
    else:
        raise rule_error(
            _RULE, key, f"`{key}` must be a mapping of server name to server, or a list", path
        )
    out: dict[str, dict[str, Any]] = {}
    for name, entry in items:
        try:
            check_mcp_server_name(name)
        except ValueError as exc:
            raise rule_error(_RULE, key, str(exc), path) from None
        if name in out:
            raise rule_error(_RULE, key, f"MCP server {name!r} is given twice", path)
        out[name] = {} if entry is None else _entry(name, entry, key, path)
    return tuple(out.items())


def _list_item(item: object, key: str, path: str | None) -> tuple[object, object]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, Mapping) and len(item) == 1:
        return next(iter(item.items()))
    raise rule_error(
        _RULE,
        key,
        f"each item of `{key}` must be a configured server's name or one `name: server` pair",
        path,
    )


def _entry(name: str, entry: object, key: str, path: str | None) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise rule_error(
            _RULE, key, f"MCP server {name!r} must be a mapping (`command` or `url`)", path
        )
    try:
        config = McpServerConfig.model_validate(dict(entry))
    except ValidationError as exc:
        raise _entry_error(name, exc, key, path) from None
    return config.model_dump(mode="json", exclude_defaults=True)


def _entry_error(name: str, exc: ValidationError, key: str, path: str | None) -> DefinitionError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    problem = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        problem = "not a known key of an MCP server"
    at = f" `{where}`" if where else ""
    return rule_error(_RULE, key, f"MCP server {name!r}{at}: {problem}", path)
