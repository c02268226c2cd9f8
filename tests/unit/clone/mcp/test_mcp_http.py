"""An MCP server over streamable HTTP on 127.0.0.1, built with the SDK (``MCPServer``, the
SDK's FastMCP) and started by the fixture: tools, resources, headers, and a server killed and
started again on the same port."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clonefleet.clone import ToolContext
from clonefleet.clone.mcp._manager import McpManager
from clonefleet.config import McpServerConfig
from clonefleet.errors import ToolRetry
from clonefleet.testing import make_spec

pytestmark = pytest.mark.timeout(60)

DEMO = Path(__file__).parents[3] / "fixtures" / "mcp" / "demo_server.py"
CTX = ToolContext(root=Path("."))


class HttpDemo:
    """The demo server as a child process serving ``http://127.0.0.1:<port>/mcp``."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(DEMO), "http", str(self.port), stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        self.port = int(line)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


@pytest.fixture
async def http_demo() -> AsyncIterator[HttpDemo]:
    server = HttpDemo()
    await server.start()
    try:
        yield server
    finally:
        await server.kill()


async def call(tools: dict[str, Any], name: str, **args: Any) -> str:
    text: str = await tools[name].run(args, CTX)
    return text


async def test_http_server_tools_and_resources(http_demo: HttpDemo) -> None:
    config = McpServerConfig(url=http_demo.url, headers={"X-Clonefleet-Test": "1"})
    manager = McpManager()
    try:
        spec = make_spec(tools=("mcp__web__echo", "ListMcpResourcesTool", "ReadMcpResourceTool"))
        tools = await manager.tools_for(spec, {"web": config})
        assert sorted(tools) == ["mcp__web__echo", "mcp_list_resources", "mcp_read_resource"]
        assert await call(tools, "mcp__web__echo", text="over http") == "over http"
        (resource,) = json.loads(await call(tools, "mcp_list_resources"))
        assert resource == {
            "server": "web",
            "uri": "memo://greeting",
            "name": "greeting",
            "description": "a greeting",
            "mimeType": "text/plain",
        }
        read = await call(tools, "mcp_read_resource", server="web", uri="memo://greeting")
        assert read == "hello from demo"
        with pytest.raises(ToolRetry, match="refused a read of 'memo://nothing'"):
            await call(tools, "mcp_read_resource", server="web", uri="memo://nothing")
        with pytest.raises(ToolRetry, match="unknown MCP server 'nope'; your servers: web"):
            await call(tools, "mcp_read_resource", server="nope", uri="memo://greeting")
    finally:
        await manager.aclose()


async def test_http_server_killed_gives_a_tool_error_then_reconnects(http_demo: HttpDemo) -> None:
    manager = McpManager()
    try:
        spec = make_spec(tools=("mcp__web",))
        tools = await manager.tools_for(spec, {"web": McpServerConfig(url=http_demo.url)})
        assert await call(tools, "mcp__web__echo", text="one") == "one"
        await http_demo.kill()
        with pytest.raises(ToolRetry, match="MCP server 'web' is unavailable: it stopped"):
            await asyncio.wait_for(call(tools, "mcp__web__echo", text="two"), 30)
        await http_demo.start()  # the same port again
        assert await call(tools, "mcp__web__echo", text="three") == "three"
        assert manager.servers[0].starts == 2
    finally:
        await manager.aclose()


async def test_http_server_that_is_not_there_fails_to_start_in_bounds() -> None:
    manager = McpManager()
    try:
        config = McpServerConfig(url="http://127.0.0.1:9/mcp", startup_timeout_s=5)
        tools = await manager.tools_for(make_spec(tools=("mcp__web__echo",)), {"web": config})
        with pytest.raises(ToolRetry, match="MCP server 'web' is unavailable: it failed to start"):
            await call(tools, "mcp__web__echo", text="x")
    finally:
        await manager.aclose()
