"""MCP servers in config and definitions, before any server runs: the entry schema, trust of a
project's config, the definitions' ``mcpServers``, and how grants reach a clone spec."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from clonefleet.config import Config, ConfigSource, McpServerConfig, load_config, trust_folder
from clonefleet.definitions import AgentDefinition, load_catalog, load_file
from clonefleet.errors import ConfigError, DefinitionError
from clonefleet.planning import BatchRequest, plan_specs, resolve_tools
from clonefleet.vocab import canonical_tool

pytestmark = pytest.mark.timeout(20)

TIME = {"command": ["mcp-server-time", "--local-timezone", "UTC"]}


# -- the entry schema ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({}, "exactly one of `command`"),
        ({"command": "x", "url": "http://127.0.0.1:1/mcp"}, "exactly one of `command`"),
        ({"command": []}, "must name an executable"),
        ({"url": "file:///etc/passwd"}, "http:// or https://"),
        ({"url": "http://127.0.0.1:1/mcp", "env": {"A": "b"}}, "`env` applies to a `command`"),
        ({"command": "x", "headers": {"A": "b"}}, "`headers` applies to a `url`"),
        ({"type": "sse", "url": "http://127.0.0.1:1/sse"}, "SSE transport is not supported"),
        ({"type": "http", "command": "x"}, "needs a `url`"),
        ({"command": "x", "timeout_s": 0}, "greater than 0"),
        ({"command": "x", "bogus": 1}, "Extra inputs"),
    ],
    ids=[
        "none",
        "both",
        "empty",
        "file-url",
        "env-on-url",
        "headers-on-command",
        "sse",
        "type",
        "timeout",
        "typo",
    ],
)
def test_bad_server_entries_are_refused(entry: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Config(mcp_servers={"s": entry})


@pytest.mark.parametrize("name", ["a__b", "_a", "a_", "a.b", "", "x" * 65])
def test_server_names_keep_the_double_underscore_free(name: str) -> None:
    with pytest.raises(ValidationError, match="MCP server name"):
        Config(mcp_servers={name: TIME})


def test_good_entries_load_with_their_command_line_and_limits() -> None:
    config = Config(
        mcp_servers={
            "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
            "web-1": {"type": "http", "url": "http://127.0.0.1:8000/mcp", "headers": {"X": "y"}},
        }
    )
    time, web = config.mcp_servers["time"], config.mcp_servers["web-1"]
    assert time.argv == ("mcp-server-time", "--local-timezone", "UTC")
    assert (time.transport, web.transport) == ("stdio", "http")
    assert (time.timeout_s, time.startup_timeout_s, time.max_restarts) == (60.0, 30.0, 3)


# -- trust -----------------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("CLONEFLEET_CONFIG", raising=False)
    (tmp_path / "project" / ".clonefleet").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project")
    return tmp_path


SERVER_YAML = "mcp_servers:\n  time: {command: [mcp-server-time, --local-timezone, UTC]}\n"


def test_untrusted_project_may_not_add_an_mcp_server(home: Path) -> None:
    path = home / "project" / ".clonefleet" / "config.yaml"
    path.write_text(SERVER_YAML)
    with pytest.raises(ConfigError) as info:
        load_config()
    assert (info.value.path, info.value.key) == (str(path), "mcp_servers.time")
    assert "mcp-server-time" in info.value.message and "clonefleet trust" in info.value.message


def test_untrusted_project_may_name_the_users_own_server_and_a_trusted_one_any(home: Path) -> None:
    project = home / "project" / ".clonefleet" / "config.yaml"
    project.write_text(SERVER_YAML)
    own = home / "XDG_CONFIG_HOME" / "clonefleet" / "config.yaml"
    own.parent.mkdir()
    own.write_text(SERVER_YAML)
    assert load_config().mcp_servers["time"].argv[0] == "mcp-server-time"
    project.write_text(SERVER_YAML.replace("UTC", "Europe/Paris"))  # changed: refused again
    with pytest.raises(ConfigError, match="not trusted"):
        load_config()
    trust_folder(str(home / "project"))
    config = load_config()
    assert config.source == ConfigSource("project", str(project), True, str(project.parent.parent))


# -- definitions -----------------------------------------------------------------------------------
def _load(text: str, stem: str) -> Any:
    """The definition in ``text``, loaded from a file ``<stem>.md`` as the loader reads one."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{stem}.md"
        path.write_text(text)
        return load_file(path)


def _claude(frontmatter: str) -> Any:
    return _load(f"---\nname: c\ndescription: d\n{frontmatter}---\nbody\n", "c")


def test_claude_mcp_servers_mapping_list_and_names() -> None:
    defn = _claude(
        "mcpServers:\n  time: {type: stdio, command: uvx, args: [mcp-server-time]}\n"
        "  web: {type: http, url: 'http://127.0.0.1:9/mcp'}\n"
    )
    assert defn.mcp_servers == (
        ("time", {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]}),
        ("web", {"type": "http", "url": "http://127.0.0.1:9/mcp"}),
    )
    assert not defn.warnings and not defn.extra_keys
    listed = _claude("mcpServers:\n  - github\n  - time: {command: mcp-server-time}\n")
    assert listed.mcp_servers == (("github", {}), ("time", {"command": "mcp-server-time"}))


def test_native_and_python_definitions_take_mcp_servers() -> None:
    native = _load(
        "---\nname: n\ndescription: d\nclonefleet:\n  mcp_servers: {t: {command: x}}\n---\n", "n"
    )
    assert native.mcp_servers == (("t", {"command": "x"}),)
    defn = AgentDefinition("p", "d", mcp_servers=["time"])
    assert defn.mcp_servers == (("time", {}),)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("3", "must be a mapping of server name"),
        ("{a__b: {command: x}}", "MCP server name 'a__b'"),
        ("{a: {command: x, bogus: 1}}", "MCP server 'a' `bogus`: not a known key"),
        ("{a: {url: 'ftp://h/x'}}", "MCP server 'a': url 'ftp://h/x'"),
        ("{a: 5}", "MCP server 'a' must be a mapping"),
        ("[[1]]", "configured server's name"),
        ("[a, a]", "given twice"),
    ],
)
def test_bad_mcp_servers_are_invalid_definitions(value: str, problem: str) -> None:
    with pytest.raises(DefinitionError) as info:
        _claude(f"mcpServers: {value}\n")
    assert info.value.reason == "invalid-definition"
    assert (
        problem in info.value.message and "rule mcp-servers, key `mcpServers`" in info.value.message
    )


def test_resource_tool_aliases_are_known_tools() -> None:
    defn = _claude("tools: [ListMcpResourcesTool, ReadMcpResourceTool]\n")
    assert defn.tools == ("mcp_list_resources", "mcp_read_resource")
    assert not defn.warnings
    assert canonical_tool("ReadMcpResourceTool") == "mcp_read_resource"


# -- grants and specs ------------------------------------------------------------------------------
def test_mcp_grants_pass_through_to_the_spec_and_absent_tools_mean_every_mcp_tool() -> None:
    granted = AgentDefinition(
        "g",
        "d",
        tools=["Read", "mcp__time__get_current_time", "mcp__demo", "ReadMcpResourceTool"],
        tools_deny=["mcp__demo__die"],
    )
    assert resolve_tools(granted) == (
        "file_read",
        "mcp__time__get_current_time",
        "mcp__demo",
        "mcp_read_resource",
    )
    assert "tag!ALL_MCP" in resolve_tools(AgentDefinition("all", "d"))
    assert "tag!ALL_MCP" in resolve_tools(AgentDefinition("tag", "d", tools=["tag!ALL"]))
    denied = AgentDefinition("x", "d", tools=["mcp__t__a", "mcp__t__b"], tools_deny=["mcp__t__b"])
    assert resolve_tools(denied) == ("mcp__t__a",)


def test_a_bare_server_name_in_tools_grants_that_servers_tools() -> None:
    # Older Claude Code files list an MCP server by its bare name; with that server configured
    # it means every tool of the server, and an unconfigured name is still no tool.
    defn = AgentDefinition("old", "d", tools=["Read", "context7", "pytest"])
    assert resolve_tools(defn, servers={"context7"}) == ("file_read", "mcp__context7")
    assert resolve_tools(defn) == ("file_read",)
    # A configured server named like a tool does not shadow the tool.
    shell = AgentDefinition("sh", "d", tools=["shell"])
    assert resolve_tools(shell, servers={"shell"}) == ("shell",)


def test_plan_carries_the_definitions_servers_into_every_clone_spec(tmp_path: Path) -> None:
    agents = tmp_path / "agents"  # a folder the user names (a project's own needs trust)
    agents.mkdir(parents=True)
    (agents / "clock.md").write_text(
        "---\nname: clock\ndescription: Tells the time.\ntools: [mcp__time__get_current_time]\n"
        "mcpServers:\n  time: {command: [mcp-server-time]}\n---\nSay the time.\n"
    )
    config = Config()
    specs = plan_specs(
        BatchRequest(agent="clock", prompt="now?", count=2),
        load_catalog(tmp_path, (agents,), config),
        config,
        batch_id="b_1",
        job_ids=["sa_00000001", "sa_00000002"],
        caller_cwd=tmp_path,
    )
    for spec in specs:
        assert spec.mcp_servers == (("time", {"command": ["mcp-server-time"]}),)
        assert spec.tools == ("mcp__time__get_current_time",)
    assert McpServerConfig(**specs[0].mcp_servers[0][1]).argv == ("mcp-server-time",)


def test_an_untrusted_projects_definition_may_not_start_a_server_command(home: Path) -> None:
    project = home / "project"
    agents = project / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "evil.md").write_text(
        "---\nname: evil\ndescription: d\nmcpServers:\n"
        "  x: {command: touch, args: [pwned]}\n---\nbody\n"
    )
    (agents / "named.md").write_text(  # naming a configured server starts nothing new
        "---\nname: named\ndescription: d\nmcpServers: [time]\n---\nbody\n"
    )
    catalog = load_catalog(project)
    assert "evil" not in catalog.definitions and "named" in catalog.definitions
    (failure,) = [e for e in catalog.errors if e.path.endswith("evil.md")]
    assert failure.reason == "invalid-definition"
    assert "untrusted-mcp-server" in failure.message and "'touch pwned'" in failure.message
    assert "clonefleet trust" in failure.message
    trust_folder(project)
    assert "evil" in load_catalog(project).definitions
