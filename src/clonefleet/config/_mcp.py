"""The schema of an MCP server entry: config ``mcp_servers.<name>`` and a definition's
``mcpServers`` (docs/mcp.md). Pydantic models and name checks only; starting and talking to a
server is ``clonefleet.clone.mcp._manager``'s business.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from clonefleet.config._urls import check_base_url
from clonefleet.errors import ConfigError

__all__ = [
    "MCP_SERVER_NAME",
    "McpServerConfig",
    "McpServers",
    "check_mcp_server_name",
]

MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")
"""A server name: letters, digits, ``-`` and single inner ``_``. No ``__``, so a tool name
``mcp__<server>__<tool>`` always splits at its second ``__``."""

_STDIO_ONLY = ("args", "env", "cwd")


def check_mcp_server_name(name: object) -> str:
    """Return ``name`` when it is a valid server name.

    Raises:
        ValueError: it is not a string of letters, digits, ``-`` and single inner ``_``.
    """
    if not isinstance(name, str) or not MCP_SERVER_NAME.match(name) or len(name) > 64:
        raise ValueError(
            f"MCP server name {name!r} must be 1-64 letters, digits, `-` and single `_` between "
            "them (no `__`, no leading or trailing `_`)"
        )
    return name


class McpServerConfig(BaseModel):
    """How to reach one MCP server: a local command spoken to over stdio, or a streamable-HTTP
    URL. Exactly one of ``command`` and ``url`` is given."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["stdio", "http", "streamable-http", "sse"] | None = None
    """Transport, as Claude Code's ``.mcp.json`` spells it; optional (``command`` means stdio,
    ``url`` means streamable HTTP). ``sse`` is refused: only streamable HTTP is supported."""
    command: str | tuple[str, ...] | None = None
    """The executable (a string; not a shell line), or the executable and its arguments (a
    list). Looked up on ``PATH`` of the clone host."""
    args: tuple[str, ...] = ()
    """Arguments after those of ``command``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set for the command, over a minimal inherited set (``HOME``, ``PATH``,
    ``USER``, ``SHELL``, ``TERM``, ``LOGNAME``); nothing else of the host's environment."""
    cwd: str | None = None
    """Working directory of the command; ``None`` = the clone host's."""
    url: str | None = None
    """``http://`` or ``https://`` endpoint of a streamable-HTTP server, e.g.
    ``http://127.0.0.1:8000/mcp``."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent with every request to ``url`` (used as written, no expansion)."""
    timeout_s: float = Field(default=60.0, gt=0, le=3600, allow_inf_nan=False)
    """Longest one call (a tool call, a resource read or list) may take, in seconds; then it
    answers the clone with a tool error."""
    startup_timeout_s: float = Field(default=30.0, gt=0, le=600, allow_inf_nan=False)
    """Longest starting the server (spawn or connect, handshake, tool listing) may take."""
    max_restarts: int = Field(default=3, ge=0, le=100)
    """How often one clone host restarts the server after it failed to start or died; then
    its tools answer with the last failure for the rest of the host's life."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) and `url` (streamable HTTP)")
        if self.type == "sse":
            raise ValueError("the SSE transport is not supported; use a streamable-HTTP `url`")
        if self.url is not None:
            if self.type == "stdio":
                raise ValueError("`type: stdio` needs a `command`, not a `url`")
            given = [k for k in _STDIO_ONLY if getattr(self, k)]
            if given:
                raise ValueError(f"`{given[0]}` applies to a `command` server, not to a `url`")
            _check_url(self.url)
        else:
            if self.type in ("http", "streamable-http"):
                raise ValueError(f"`type: {self.type}` needs a `url`, not a `command`")
            if self.headers:
                raise ValueError("`headers` applies to a `url` server, not to a `command`")
            if not self.argv or not self.argv[0].strip():
                raise ValueError("`command` must name an executable")
        return self

    @property
    def argv(self) -> tuple[str, ...]:
        """The command line of a stdio server (``()`` for a URL server)."""
        if self.command is None:
            return ()
        head = (self.command,) if isinstance(self.command, str) else self.command
        return (*head, *self.args)

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


def _check_url(url: str) -> None:
    try:
        check_base_url(url, None, "url")
    except ConfigError as exc:
        raise ValueError(exc.message.replace("base_url", "url")) from None


def _check_names(servers: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
    for name in servers:
        check_mcp_server_name(name)
    return servers


McpServers = Annotated[dict[str, McpServerConfig], AfterValidator(_check_names)]
"""Config ``mcp_servers``: server name → :class:`McpServerConfig`."""
