"""Background shells: ``shell`` with ``run_in_background``, ``shell_output`` and ``shell_kill``.
Real processes; waiting is bounded polling on the process state (10 ms steps), never a sleep."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clonefleet.clone import Clone, ToolContext
from clonefleet.clone.tools._shell import shell_kill_tool, shell_output_tool, shell_tool
from clonefleet.clone.tools._shell_processes import MAX_LIVE_SHELLS
from clonefleet.clone.tools._tool import CloneToolState
from clonefleet.config import Config
from clonefleet.errors import ToolRetry
from clonefleet.host import HostCore
from clonefleet.providers import SimScript
from clonefleet.testing import FunctionModel, ScriptedModel, call, make_spec, reply, wait_until

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def ctx(tmp_path) -> AsyncIterator[ToolContext]:
    state = CloneToolState()
    try:
        yield ToolContext(root=tmp_path, state=state)
    finally:
        await state.aclose()


async def start(ctx: ToolContext, command: str) -> str:
    out = await shell_tool({"command": command, "run_in_background": True}, ctx)
    first = out.splitlines()[0]
    assert first.startswith("shell_id: ") and "status: running" in out
    return first.removeprefix("shell_id: ")


def shell(ctx: ToolContext, shell_id: str):
    assert ctx.state is not None
    return ctx.state.shells.get(shell_id)


def gone(pgid: int) -> bool:
    """Whether the process group ``pgid`` has no live process left (a killed child that waits
    for init to reap it is a zombie, and counts as gone)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            return False
    return True


async def test_output_is_read_in_pieces_with_the_status_and_exit_code(ctx, tmp_path):
    (tmp_path / "marker").write_text("here")
    sid = await start(ctx, "cat marker; echo; echo second; exit 3")
    await wait_until(lambda: shell(ctx, sid).is_done)
    out = await shell_output_tool({"shell_id": sid}, ctx)
    assert out == f"shell {sid}: exited with status 3\nhere\nsecond\n"
    again = await shell_output_tool({"shell_id": sid}, ctx)
    assert again == f"shell {sid}: exited with status 3\n(no new output)"


async def test_a_running_shell_reports_new_output_since_the_last_read(ctx, tmp_path):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    sid = await start(ctx, 'echo first; read line < go; echo "got $line"')
    await wait_until(lambda: shell(ctx, sid).waiting > 0)
    assert await shell_output_tool({"shell_id": sid}, ctx) == f"shell {sid}: running\nfirst\n"
    fd = await asyncio.to_thread(os.open, fifo, os.O_WRONLY)
    os.write(fd, b"go\n")
    os.close(fd)
    await wait_until(lambda: shell(ctx, sid).is_done)
    out = await shell_output_tool({"shell_id": sid}, ctx)
    assert out == f"shell {sid}: exited with status 0\ngot go\n"


async def test_filter_keeps_matching_lines_and_consumes_the_rest(ctx):
    sid = await start(ctx, "printf 'ok 1\\nfail 2\\nok 3\\n'")
    await wait_until(lambda: shell(ctx, sid).is_done)
    out = await shell_output_tool({"shell_id": sid, "filter": "^ok"}, ctx)
    assert out.splitlines()[1:] == ["ok 1", "ok 3"]
    assert (await shell_output_tool({"shell_id": sid}, ctx)).endswith("(no new output)")
    with pytest.raises(ToolRetry, match="not a valid regular expression"):
        await shell_output_tool({"shell_id": sid, "filter": "("}, ctx)


async def test_kept_output_is_capped_and_the_drop_is_reported(ctx):
    sid = await start(ctx, "head -c 3145728 /dev/zero | tr '\\0' a")
    await wait_until(lambda: shell(ctx, sid).is_done)
    out = await shell_output_tool({"shell_id": sid}, ctx)
    lines = out.splitlines()
    assert lines[1] == (
        "[2097152 bytes of output were dropped unread: a background shell keeps the newest "
        "1024 KiB]"
    )
    assert lines[2] == f"[{1024 * 1024 - 64 * 1024} more bytes waiting: call shell_output again]"
    assert lines[3] == "a" * 64 * 1024
    second = await shell_output_tool({"shell_id": sid}, ctx)
    assert "dropped" not in second and "more bytes waiting" in second


async def test_kill_stops_the_whole_process_group(ctx):
    sid = await start(ctx, "sleep 30 & sleep 30; echo never")
    pid = shell(ctx, sid).proc.pid
    assert not gone(pid)
    out = await shell_kill_tool({"shell_id": sid}, ctx)
    assert out == f"shell {sid}: killed"
    await wait_until(lambda: gone(pid))
    assert (await shell_output_tool({"shell_id": sid}, ctx)).startswith(f"shell {sid}: killed")
    with pytest.raises(ToolRetry, match=r"no background shell 'shell_99'; known: shell_1"):
        await shell_output_tool({"shell_id": "shell_99"}, ctx)


async def test_at_most_eight_shells_run_at_once(ctx):
    ids = [await start(ctx, "sleep 30") for _ in range(MAX_LIVE_SHELLS)]
    with pytest.raises(ToolRetry, match="8 background shells are running already"):
        await start(ctx, "sleep 30")
    await shell_kill_tool({"shell_id": ids[0]}, ctx)
    await start(ctx, "true")
    pids = [shell(ctx, i).proc.pid for i in ids]
    assert ctx.state is not None
    await ctx.state.aclose()
    await wait_until(lambda: all(gone(p) for p in pids))
    with pytest.raises(ToolRetry, match="run has ended"):
        await start(ctx, "true")


async def test_background_needs_a_clone(tmp_path):
    with pytest.raises(ToolRetry, match="keeps state per clone"):
        await shell_tool({"command": "true", "run_in_background": True}, ToolContext(root=tmp_path))


async def test_every_shell_is_killed_when_the_clone_ends(tmp_path):
    model = ScriptedModel(
        [
            reply("", call("shell", "c1", command="sleep 30", run_in_background=True)),
            reply("", call("shell_output", "c2", shell_id="shell_1")),
            reply("", call("exit_tool", "cx", success=True, summary="ok")),
        ]
    )
    clone = Clone(make_spec(tools=("Bash", "BashOutput"), cwd=str(tmp_path)), model)
    result = await clone.run()
    assert result.status == "completed"
    assert model.calls[2].messages[-1].content == "shell shell_1: running\n(no new output)"
    assert clone.tool_state is not None and clone.tool_state.live_shells == 0


async def test_every_shell_is_killed_when_the_clone_is_cancelled(tmp_path):
    started = asyncio.Event()

    async def answer(req):
        if len(model.calls) == 1:
            return reply("", call("shell", "c1", command="sleep 30", run_in_background=True))
        started.set()
        await asyncio.Event().wait()  # hangs until cancelled

    model = FunctionModel(answer)
    clone = Clone(make_spec(tools=("shell",), cwd=str(tmp_path)), model)
    task = asyncio.ensure_future(clone.run())
    await asyncio.wait_for(started.wait(), 10)
    assert clone.tool_state is not None
    pid = clone.tool_state.shells.get("shell_1").proc.pid
    clone.request_cancel()
    task.cancel()
    assert (await task).status == "cancelled"
    await wait_until(lambda: gone(pid))


async def test_every_shell_is_killed_when_its_host_closes(tmp_path):
    script = SimScript.from_data(
        {
            "default": [
                {"tool": "shell", "args": {"command": "sleep 30", "run_in_background": True}},
                {"hang": True},
            ]
        }
    )
    host = HostCore()
    spec = make_spec(job_id="sa_1", tools=("shell",), cwd=str(tmp_path))
    host.start([spec], Config(), script)
    events: list[dict] = []
    for _ in range(200):  # bounded: drain waits at most 50 ms for the next event
        events += await host.drain(wait_s=0.05)
        if any(e["event"]["type"] == "tool_call_end" for e in events):
            break
    clone = host.running_clone("sa_1")
    assert clone is not None and clone.tool_state is not None
    assert clone.tool_state.live_shells == 1
    pid = clone.tool_state.shells.get("shell_1").proc.pid
    await host.aclose()
    await wait_until(lambda: gone(pid))
