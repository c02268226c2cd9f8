"""MCP servers over stdio, for real: the registry's ``mcp-server-time`` and the SDK-built demo
server of ``tests/fixtures/mcp``. Clones are driven by function models; every failure of a
server (cannot start, hangs, killed mid-call) reaches the clone as a tool error, never a crash.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clonefleet.clone import Candidate, Clone, FailoverModel, ToolContext
from clonefleet.clone.mcp._manager import McpManager
from clonefleet.clone.tools._tool import MAX_OUTPUT
from clonefleet.config import Config, McpServerConfig
from clonefleet.host import HostCore
from clonefleet.providers import ModelRequest, ModelResponse, Role
from clonefleet.testing import FakeClock, FunctionModel, call, make_spec, reply

pytestmark = pytest.mark.timeout(60)

DEMO = Path(__file__).parents[3] / "fixtures" / "mcp" / "demo_server.py"
TIME = McpServerConfig(command=(sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"))
CTX = ToolContext(root=Path("."))


def demo(starts: Path, **limits: Any) -> McpServerConfig:
    return McpServerConfig(
        command=(sys.executable, str(DEMO), "stdio"), env={"DEMO_STARTS": str(starts)}, **limits
    )


def pids(starts: Path) -> list[int]:
    return [int(line) for line in starts.read_text().split()] if starts.exists() else []


async def until(done: Callable[[], bool], within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


def calls_then_exits(*steps: tuple[str, dict[str, Any]]) -> FunctionModel:
    """A model that makes the tool calls in order, then exits with every tool answer."""

    def answer(req: ModelRequest) -> ModelResponse:
        done = [m for m in req.messages if m.role == Role.TOOL]
        if len(done) < len(steps):
            name, args = steps[len(done)]
            return reply("", call(name, f"c{len(done)}", **args))
        texts = [
            f"ERROR {m.content.removeprefix('Error: ')}" if m.is_error else m.content for m in done
        ]
        return reply("", call("exit_tool", "end", success=True, summary=json.dumps(texts)))

    return FunctionModel(answer)


async def run_clone(
    tools: dict[str, Any], *steps: tuple[str, dict[str, Any]], **kw: Any
) -> list[str]:
    result = await Clone(make_spec(), calls_then_exits(*steps), host_tools=tools, **kw).run()
    assert result.status == "completed", result.error
    answers: list[str] = json.loads(result.result["summary"])
    return answers


async def test_time_server_tools_are_named_and_answer_get_current_time() -> None:
    manager = McpManager()
    try:
        tools = await manager.tools_for(make_spec(tools=("mcp__time",)), {"time": TIME})
        assert sorted(tools) == ["mcp__time__convert_time", "mcp__time__get_current_time"]
        schema = tools["mcp__time__get_current_time"].spec.parameters
        assert schema["required"] == ["timezone"]
        (answer,) = await run_clone(
            tools, ("mcp__time__get_current_time", {"timezone": "Europe/Paris"})
        )
        assert json.loads(answer)["timezone"] == "Europe/Paris"
    finally:
        await manager.aclose()


class _Pool:
    """The clones' models come from the test, not from the config's providers."""

    web = None

    def __init__(self, model: Callable[[], Any]) -> None:
        self.model = model

    def failover_for(
        self, spec: Any, on_failover: Any = None, on_rate_limited: Any = None
    ) -> FailoverModel:
        return FailoverModel([Candidate(key="fake", wire_name="fake", model=self.model())])


class _Host(HostCore):
    def __init__(self, model: Callable[[], Any]) -> None:
        super().__init__()
        self._fake = _Pool(model)

    def pool_for(self, config: Any, sim_script: Any) -> Any:
        return self._fake


async def test_clones_of_one_host_share_one_start_of_each_server(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    config = Config(mcp_servers={"time": TIME, "demo": demo(starts)})
    host = _Host(lambda: calls_then_exits(("mcp__time__get_current_time", {"timezone": "UTC"})))
    specs = [
        make_spec(job_id=f"sa_0000000{i}", clone_index=i, tools=("mcp__time", "mcp__demo__echo"))
        for i in range(3)
    ]
    finals: list[dict[str, Any]] = []
    try:
        host.start(specs, config)
        while len(finals) < len(specs):
            events = await host.drain(wait_s=0.05)
            finals += [e["event"]["result"] for e in events if e["event"]["type"] == "_final"]
        assert {r["status"] for r in finals} == {"completed"}, finals
        for r in finals:
            (answer,) = json.loads(r["result"]["summary"])
            assert json.loads(answer)["timezone"] == "UTC"
        assert sorted((s.name, s.starts) for s in host.mcp.servers) == [("demo", 1), ("time", 1)]
        assert len(pids(starts)) == 1
    finally:
        await host.aclose()
    (pid,) = pids(starts)
    await until(lambda: not _alive(pid), 5)  # the host's close ended the server's process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_server_that_cannot_start_gives_a_tool_error_naming_it() -> None:
    crash = "import sys; sys.stderr.write('boom: no config file\\n'); sys.exit(2)"
    servers = {
        "missing": McpServerConfig(command="/nonexistent/mcp-server"),
        "crash": McpServerConfig(command=(sys.executable, "-c", crash)),
    }
    manager = McpManager()
    try:
        spec = make_spec(tools=("mcp__missing__lookup", "mcp__crash"))
        tools = await manager.tools_for(spec, servers)
        assert sorted(tools) == ["mcp__crash", "mcp__missing__lookup"]
        missing, crashed = await run_clone(tools, ("mcp__missing__lookup", {}), ("mcp__crash", {}))
    finally:
        await manager.aclose()
    assert missing.startswith("ERROR MCP server 'missing' is unavailable: it failed to start")
    assert "/nonexistent/mcp-server: no such file" in missing
    assert crashed.startswith("ERROR MCP server 'crash' is unavailable: it failed to start")
    assert "boom: no config file" in crashed  # the tail of its stderr


async def test_a_server_that_never_answers_its_handshake_is_given_up_and_killed(
    tmp_path: Path,
) -> None:
    starts = tmp_path / "starts"
    mute = McpServerConfig(
        command=("/bin/sh", "-c", f"echo $$ >> '{starts}'; exec sleep 600"), startup_timeout_s=1
    )
    manager = McpManager()
    try:
        tools = await manager.tools_for(make_spec(tools=("mcp__mute__ask",)), {"mute": mute})
        (answer,) = await run_clone(tools, ("mcp__mute__ask", {}))
        assert "MCP server 'mute' is unavailable: it failed to start" in answer
        assert "did not start within 1s" in answer
        await until(lambda: len(pids(starts)) == 2)  # the call tried once more
        await until(lambda: not any(map(_alive, pids(starts))))  # both killed, host still up
    finally:
        await manager.aclose()


async def test_a_server_killed_mid_call_gives_a_tool_error_then_restarts(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    manager = McpManager()
    hanging = asyncio.Event()

    def watch(event: dict[str, Any]) -> None:
        if event["type"] == "tool_call_start" and event["tool"] == "mcp__demo__hang":
            hanging.set()

    try:
        tools = await manager.tools_for(make_spec(tools=("mcp__demo",)), {"demo": demo(starts)})
        steps = [("mcp__demo__hang", {}), ("mcp__demo__echo", {"text": "back"})]
        clone = asyncio.create_task(run_clone(tools, *steps, emit=watch))
        await asyncio.wait_for(hanging.wait(), 20)
        (first,) = pids(starts)
        os.kill(first, signal.SIGKILL)
        killed, echoed = await asyncio.wait_for(clone, 30)
    finally:
        await manager.aclose()
    assert killed.startswith("ERROR MCP server 'demo' is unavailable: it stopped")
    assert echoed == "back"
    assert len(pids(starts)) == 2 and manager.servers[0].starts == 2


async def test_a_hanging_tool_is_bounded_by_the_call_timeout(tmp_path: Path) -> None:
    manager = McpManager()
    try:
        servers = {"demo": demo(tmp_path / "starts", timeout_s=0.5)}
        tools = await manager.tools_for(make_spec(tools=("mcp__demo",)), servers)
        began = time.monotonic()
        hung, echoed = await run_clone(
            tools, ("mcp__demo__hang", {}), ("mcp__demo__echo", {"text": "still here"})
        )
        assert time.monotonic() - began < 10
    finally:
        await manager.aclose()
    assert (
        hung
        == "ERROR MCP server 'demo' did not answer a call of tool 'hang' within 0.5s; the call was abandoned"
    )
    assert echoed == "still here"  # it still answers pings: the same server goes on
    assert manager.servers[0].starts == 1


async def test_grants_pick_tools_by_name_shorthand_and_tag(tmp_path: Path) -> None:
    servers = {"demo": demo(tmp_path / "starts")}
    manager = McpManager()
    try:
        assert await manager.tools_for(make_spec(tools=("file_read",)), servers) == {}
        assert manager.servers == []  # nothing granted: nothing made, nothing started
        one = await manager.tools_for(make_spec(tools=("mcp__demo__echo",)), servers)
        assert sorted(one) == ["mcp__demo__echo"]
        every = await manager.tools_for(make_spec(tools=("tag!ALL_MCP",)), servers)
        assert sorted(every) == [
            "mcp__demo__big",
            "mcp__demo__die",
            "mcp__demo__echo",
            "mcp__demo__fail",
            "mcp__demo__hang",
            "mcp__demo__odd_name",  # the server's "odd.name", made a valid tool name
            "mcp_list_resources",
            "mcp_read_resource",
        ]
        assert every["mcp__demo__echo"].parallel_safe  # the server says it only reads
        assert not every["mcp__demo__die"].parallel_safe
        spec = make_spec(tools=("mcp__ghost__x", "mcp__demo__nosuch", "mcp_read_resource"))
        odd = await manager.tools_for(spec, servers)
        assert sorted(odd) == ["mcp__ghost__x", "mcp_read_resource"]
        answers = await run_clone(
            every | odd,
            ("mcp__demo__odd_name", {}),
            ("mcp__demo__fail", {"why": "on purpose"}),
            ("mcp__demo__big", {"n": MAX_OUTPUT + 10}),
            ("mcp__ghost__x", {}),
            ("mcp_list_resources", {}),
            ("mcp_read_resource", {"server": "demo", "uri": "memo://greeting"}),
        )
    finally:
        await manager.aclose()
    assert answers[0] == "odd"
    assert answers[1].startswith("ERROR ") and "on purpose" in answers[1]
    assert answers[2].endswith("[output truncated: 10 more characters]")
    assert answers[3] == "ERROR MCP server 'ghost': no MCP server of that name is configured"
    assert json.loads(answers[4])[0]["uri"] == "memo://greeting"
    assert answers[5] == "hello from demo"
    assert [s.starts for s in manager.servers] == [1]


async def test_a_definitions_own_server_and_a_reference_to_a_missing_one() -> None:
    manager = McpManager()
    try:
        spec = make_spec(
            tools=("mcp__time__get_current_time", "mcp__gone__x"),
            mcp_servers=(("time", TIME.model_dump(mode="json")), ("gone", {})),
        )
        tools = await manager.tools_for(spec, {})
        (now, gone) = await run_clone(
            tools, ("mcp__time__get_current_time", {"timezone": "UTC"}), ("mcp__gone__x", {})
        )
    finally:
        await manager.aclose()
    assert json.loads(now)["timezone"] == "UTC"
    assert "'gone'" in gone and "the config has no such server" in gone


async def test_restarts_back_off_and_stop_at_max_restarts() -> None:
    clock = FakeClock()
    manager = McpManager(clock=clock, backoff_s=2.0)
    servers = {"bad": McpServerConfig(command="/nonexistent/mcp", max_restarts=2)}
    tools = await manager.tools_for(make_spec(tools=("mcp__bad__x",)), servers)
    tool = tools["mcp__bad__x"]
    (server,) = manager.servers
    messages = []
    for advance in (0.0, 0.0, 2.0, 0.0):
        clock.advance(advance)
        with pytest.raises(Exception) as info:
            await tool.run({}, CTX)
        messages.append(str(info.value))
    await manager.aclose()
    assert "The next call after 2.0s restarts it" in messages[0]  # 2nd start: at once, failed
    assert "The next call after 2.0s restarts it" in messages[1]  # inside the backoff: no start
    assert "past its max_restarts (2); it is not started again" in messages[2]  # 3rd start
    assert "not started again" in messages[3] and server.starts == 3
