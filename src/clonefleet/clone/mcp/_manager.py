"""The MCP servers of one clone host process and the tools they give its clones (docs/mcp.md).

:class:`McpManager` keeps one :class:`~clonefleet.clone.mcp._server.McpServer` per server name
and config, shared by every clone of the host and started on first need, never once per clone.
For each clone it answers :meth:`McpManager.tools_for`: the server tools the clone's spec grants,
named ``mcp__<server>__<tool>``, plus ``mcp_list_resources`` and ``mcp_read_resource`` when granted.
Pure asyncio and the ``mcp`` SDK; no Ray, no definitions.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from clonefleet.clone._clone_spec import CloneSpec
from clonefleet.clone.tools._tool import Tool, ToolContext
from clonefleet.config import McpServerConfig
from clonefleet.errors import ToolRetry
from clonefleet.providers import ToolSpec
from clonefleet.vocab import MCP_ALL, MCP_RESOURCE_TOOLS, canonical_tool

if TYPE_CHECKING:  # the SDK is imported with the first server (about a second): not before
    from mcp import types as mt

    from clonefleet.clone.mcp._server import McpServer

__all__ = ["McpManager", "mcp_tool_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_DESCRIPTION = 2000
_MAX_RESOURCES = 1000
"""Resources one ``mcp_list_resources`` call lists at most per server."""
_SERVER_MODULE = f"{__package__}._server"


def mcp_tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>``, the tool's characters outside ``[A-Za-z0-9_-]`` made ``_``
    (model APIs accept no others in a tool name)."""
    return f"mcp__{server}__{_UNSAFE.sub('_', tool)}"


@dataclass(frozen=True, slots=True)
class _Grants:
    """Which MCP tools a spec's ``tools`` grant."""

    every: bool
    """``tag!ALL_MCP`` (or ``tag!ALL``): every tool of every server, and the resource tools."""
    servers: frozenset[str]
    """``mcp__<server>`` shorthands: every tool of these servers."""
    named: frozenset[str]
    """Full ``mcp__<server>__<tool>`` names."""
    resources: frozenset[str]
    """The resource tools granted by name."""

    @classmethod
    def of(cls, tools: Iterable[str]) -> _Grants:
        names = {canonical_tool(t) for t in tools}
        mcp = {n for n in names if n.startswith("mcp__")}
        return cls(
            every=MCP_ALL in names or "tag!ALL" in names,
            servers=frozenset(n[5:] for n in mcp if "__" not in n[5:]),
            named=frozenset(n for n in mcp if "__" in n[5:]),
            resources=frozenset(names & set(MCP_RESOURCE_TOOLS)),
        )

    def any(self) -> bool:
        return self.every or bool(self.servers or self.named or self.resources)

    def wants(self, server: str) -> bool:
        """Whether any granted tool belongs to ``server`` (so it must be running)."""
        return (
            self.every
            or server in self.servers
            or any(n.startswith(f"mcp__{server}__") for n in self.named)
        )


class McpManager:
    """The MCP servers of one clone host process.

    Args:
        clock: monotonic clock of the servers' restart backoff, injected for tests.
        backoff_s: see :class:`~clonefleet.clone.mcp._server.McpServer`.
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, backoff_s: float = 1.0
    ) -> None:
        self._clock, self._backoff_s = clock, backoff_s
        self._servers: dict[str, McpServer] = {}
        self._parsed: dict[str, McpServerConfig | str] = {}
        """A definition's server entry (as JSON) → its config, or why it is invalid."""
        self._tables: dict[McpServer, tuple[int, dict[str, Tool]]] = {}
        """Server → (its listing number, its tools by full name)."""
        self._dumps: dict[int, tuple[McpServerConfig, str]] = {}
        """``id(config)`` → (the config, its JSON): each clone's call costs no re-dump."""
        self._closed = False

    @property
    def servers(self) -> list[McpServer]:
        """Every server this host has made, in order."""
        return list(self._servers.values())

    def server(self, name: str, config: McpServerConfig) -> McpServer:
        """The host's one server of this name and config (made on first use; not started)."""
        dumped = self._dumps.get(id(config))
        if dumped is None or dumped[0] is not config:
            if len(self._dumps) >= 1024:  # each batch brings its own config objects
                self._dumps.clear()
            dumped = self._dumps[id(config)] = (config, config.model_dump_json())
        key = f"{name}\x00{dumped[1]}"
        found = self._servers.get(key)
        if found is None:
            from clonefleet.clone.mcp._server import McpServer

            found = self._servers[key] = McpServer(
                name, config, clock=self._clock, backoff_s=self._backoff_s
            )
        return found

    async def tools_for(
        self, spec: CloneSpec, configured: Mapping[str, McpServerConfig]
    ) -> dict[str, Tool]:
        """The MCP tools a clone of ``spec`` is granted, by name, starting the servers it needs.

        The clone's servers are those of ``configured`` (the config's ``mcp_servers``) and its spec's
        own (``spec.mcp_servers``; an entry ``(name, {})`` names a configured server); its grants are
        ``spec.tools`` (docs/mcp.md, "Which tools a clone gets"). A granted tool of a server that cannot
        start now still appears and answers with the failure (docs/mcp.md, "Failures are tool errors").

        Returns:
            the tools by name; empty (at no cost) when nothing MCP is granted.
        """
        grants = _Grants.of(spec.tools)
        if not grants.any():
            return {}
        if _SERVER_MODULE not in sys.modules:
            # The SDK takes about a second to import: not on the loop the clones run on.
            await asyncio.to_thread(importlib.import_module, _SERVER_MODULE)
        servers, broken = self._servers_of(spec.mcp_servers, configured)
        wanted = [s for n, s in servers.items() if grants.wants(n)]
        waiting = [s for s in wanted if not s.ready]
        if waiting and not self._closed:
            async with asyncio.TaskGroup() as tg:
                for server in waiting:
                    tg.create_task(server.warm())
        tools: dict[str, Tool] = {}
        for name, server in servers.items():
            if grants.wants(name):
                tools.update(self._granted(server, grants))
        for name in sorted(grants.named | {f"mcp__{n}" for n in grants.servers}):
            server_name = name[5:].split("__", 1)[0]
            if server_name in broken or server_name not in servers:
                why = broken.get(server_name, "no MCP server of that name is configured")
                tools.setdefault(name, _failing(name, f"MCP server {server_name!r}: {why}"))
        if grants.every or grants.resources:
            tools.update(self._resource_tools(servers, grants))
        return tools

    def _servers_of(
        self, declared: Iterable[tuple[str, Mapping[str, Any]]], configured: Mapping[str, Any]
    ) -> tuple[dict[str, McpServer], dict[str, str]]:
        configs: dict[str, McpServerConfig] = dict(configured)
        broken: dict[str, str] = {}
        for name, raw in declared:
            if not raw:  # a reference to a configured server
                if name not in configured:
                    broken[name] = "the definition names it, but the config has no such server"
                continue
            parsed = self._parse(raw)
            if isinstance(parsed, str):
                broken[name] = parsed
            else:
                configs[name] = parsed  # the definition's own beats the config's of that name
        return {n: self.server(n, c) for n, c in configs.items() if n not in broken}, broken

    def _parse(self, raw: Mapping[str, Any]) -> McpServerConfig | str:
        key = json.dumps(raw, sort_keys=True, default=str)
        found = self._parsed.get(key)
        if found is None:
            try:
                found = McpServerConfig.model_validate(dict(raw))
            except ValidationError as exc:
                found = f"invalid server entry: {exc.errors()[0]['msg']}"
            self._parsed[key] = found
        return found

    def _granted(self, server: McpServer, grants: _Grants) -> dict[str, Tool]:
        table = self._table(server)
        if grants.every or server.name in grants.servers:
            if table or server.ready:
                return dict(table)
            name = f"mcp__{server.name}"  # it never listed its tools: one tool says why
            return {name: _failing(name, "", server)}
        out: dict[str, Tool] = {}
        for name in grants.named:
            if name.startswith(f"mcp__{server.name}__"):
                tool = table.get(name)
                if tool is not None:
                    out[name] = tool
                elif not server.ready:
                    out[name] = _failing(name, "", server)
        return out

    def _table(self, server: McpServer) -> dict[str, Tool]:
        """The server's tools by full name, built once per listing."""
        cached = self._tables.get(server)
        if cached is not None and cached[0] == server.listing:
            return cached[1]
        table: dict[str, Tool] = {}
        for tool in server.tools:
            name = mcp_tool_name(server.name, tool.name)
            table.setdefault(name, _server_tool(server, tool, name))
        self._tables[server] = (server.listing, table)
        return table

    def _resource_tools(self, servers: Mapping[str, McpServer], grants: _Grants) -> dict[str, Tool]:
        names = set(MCP_RESOURCE_TOOLS) if grants.every else set(grants.resources)
        listing = ", ".join(sorted(servers)) or "none"
        tools = {
            "mcp_list_resources": Tool(
                spec=_spec(
                    "mcp_list_resources",
                    f"List the resources of your MCP servers ({listing}), or of one.",
                    {"server": {"type": "string", "description": "one server's name"}},
                    [],
                ),
                run=lambda args, ctx: _list_resources(servers, args),
                parallel_safe=True,
            ),
            "mcp_read_resource": Tool(
                spec=_spec(
                    "mcp_read_resource",
                    f"Read one resource of an MCP server ({listing}) by its URI.",
                    {
                        "server": {"type": "string", "description": "the server's name"},
                        "uri": {"type": "string", "description": "the resource's URI"},
                    },
                    ["server", "uri"],
                ),
                run=lambda args, ctx: _read_resource(servers, args),
                parallel_safe=True,
            ),
        }
        return {n: t for n, t in tools.items() if n in names}

    async def aclose(self) -> None:
        """Stop every server (killing stdio servers' process groups); closing twice is harmless."""
        self._closed = True
        await asyncio.gather(*(s.aclose() for s in self._servers.values()))


def _spec(name: str, description: str, props: dict[str, Any], required: list[str]) -> ToolSpec:
    schema = {"type": "object", "properties": props, "required": required}
    return ToolSpec(name=name, description=description, parameters=schema)


def _server_tool(server: McpServer, tool: mt.Tool, name: str) -> Tool:
    schema = dict(tool.input_schema) if isinstance(tool.input_schema, dict) else {}
    if schema.get("type") != "object":
        schema = {"type": "object", "properties": {}}
    description = (tool.description or tool.title or tool.name)[:_MAX_DESCRIPTION]
    read_only = bool(tool.annotations is not None and tool.annotations.read_only_hint)

    async def run(args: dict[str, Any], ctx: ToolContext) -> str:
        from clonefleet.clone.mcp._result_text import tool_text

        what = f"a call of tool {tool.name!r}"
        result = await server.request(what, lambda s: s.call_tool(tool.name, args))
        text = tool_text(result)
        if result.is_error:
            raise ToolRetry(text or f"MCP tool {name} failed without saying why")
        return text

    return Tool(
        spec=ToolSpec(
            name=name, description=f"[MCP {server.name}] {description}", parameters=schema
        ),
        run=run,
        parallel_safe=read_only,
    )


def _failing(name: str, why: str, server: McpServer | None = None) -> Tool:
    """A granted tool that cannot work now: each call says why (and may restart its server)."""

    async def run(args: dict[str, Any], ctx: ToolContext) -> str:
        if server is None:
            raise ToolRetry(why)
        await server.session()  # raises the server's failure, or it is back up
        raise ToolRetry(
            f"MCP server {server.name!r} is running again; {name} is not among its tools "
            "for this run"
        )

    what = why or (server.unavailable() if server is not None else "")
    return Tool(
        spec=ToolSpec(
            name=name,
            description=f"Unavailable MCP tool. {what}"[:_MAX_DESCRIPTION],
            parameters={"type": "object", "properties": {}},
        ),
        run=run,
    )


async def _list_resources(servers: Mapping[str, McpServer], args: Mapping[str, Any]) -> str:
    only = args.get("server")
    if only is not None and only not in servers:
        raise ToolRetry(_unknown_server(only, servers))
    picked = (
        [servers[only]]
        if only is not None
        else [s for s in servers.values() if s.has_resources or not s.ready]
    )
    parts = await asyncio.gather(*(_resources_of(s) for s in picked))  # each one bounded
    from clonefleet.clone.mcp._result_text import capped

    return capped(json.dumps([r for part in parts for r in part], ensure_ascii=False))


async def _resources_of(server: McpServer) -> list[dict[str, Any]]:
    try:
        resources = await server.request("a resource listing", _all_resources)
    except ToolRetry as exc:
        return [{"server": server.name, "error": str(exc)}]
    return [
        {
            "server": server.name,
            "uri": str(r.uri),
            "name": r.name,
            **({"description": r.description} if r.description else {}),
            **({"mimeType": r.mime_type} if r.mime_type else {}),
        }
        for r in resources
    ]


async def _all_resources(session: Any) -> list[mt.Resource]:
    from mcp import types as mt

    found: list[mt.Resource] = []
    cursor: str | None = None
    while len(found) < _MAX_RESOURCES:
        params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_resources(params=params)
        found += page.resources
        cursor = page.next_cursor
        if not cursor:
            break
    return found[:_MAX_RESOURCES]


async def _read_resource(servers: Mapping[str, McpServer], args: Mapping[str, Any]) -> str:
    name, uri = args.get("server"), args.get("uri")
    if not isinstance(name, str) or name not in servers:
        raise ToolRetry(_unknown_server(name, servers))
    if not isinstance(uri, str) or not uri:
        raise ToolRetry("mcp_read_resource needs the resource's `uri` (a string)")
    server = servers[name]
    result = await server.request(f"a read of {uri!r}", lambda s: s.read_resource(uri))
    from clonefleet.clone.mcp._result_text import resource_text

    return resource_text(result)


def _unknown_server(name: object, servers: Mapping[str, McpServer]) -> str:
    known = ", ".join(sorted(servers)) or "none"
    return f"unknown MCP server {name!r}; your servers: {known}"
