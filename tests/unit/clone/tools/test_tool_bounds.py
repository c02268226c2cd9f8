"""Hostile ``grep`` and ``glob`` calls: the event loop keeps running, the call ends, cancel stops it.

Every test measures loop lag with a ticker coroutine on the same loop: it must get scheduled at
least every 100 ms while the hostile work runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clonefleet.clone import WORK_TOOL_TABLE, Clone, ToolContext
from clonefleet.clone.tools._bounded import active_work
from clonefleet.errors import ToolRetry
from clonefleet.testing import ScriptedModel, call, make_spec, reply
from clonefleet.vocab import StopReason

pytestmark = pytest.mark.timeout(30)

CATASTROPHIC = r"(a+)+$"
"""Backtracks exponentially on a run of ``a`` followed by ``b``."""
SLOW = r"(a|aa)+$"
"""About 10 ms on each ``'a' * 20 + 'b'`` line: harmless per line, long over thousands."""


class Ticker:
    """Records the longest gap between two runs of a coroutine ticking every 5 ms."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self.ticks = 0


@contextlib.asynccontextmanager
async def ticking() -> AsyncIterator[Ticker]:
    ticker = Ticker()
    stop = asyncio.Event()

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = loop.time()
            ticker.max_gap, ticker.ticks, last = (
                max(ticker.max_gap, now - last),
                ticker.ticks + 1,
                now,
            )

    # What the earlier tests of the session left on the heap is frozen out of the collector: a
    # full collection of it (after the Ray tests, hundreds of milliseconds) is not a stall of
    # the code under test, which is still measured with the objects it makes itself.
    gc.collect()
    gc.freeze()
    task = asyncio.create_task(tick())
    try:
        yield ticker
    finally:
        stop.set()
        await task
        gc.unfreeze()
    assert ticker.ticks > 0
    assert ticker.max_gap < 0.1, f"the event loop stalled for {ticker.max_gap:.3f}s"


async def work_ended(within: float = 1.0) -> bool:
    """Bounded poll: whether every tool call's worker-thread work has returned."""
    for _ in range(int(within / 0.01) + 1):
        if not active_work():
            return True
        await asyncio.sleep(0.01)
    return active_work() == 0


async def work_started(within: float = 2.0) -> None:
    for _ in range(int(within / 0.005)):
        if active_work():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the tool's work never started")


async def run(tool: str, ctx: ToolContext, **args: object) -> str:
    return await WORK_TOOL_TABLE[tool].run(dict(args), ctx)


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """A launch directory with one catastrophic line and a file of many slow lines."""
    (tmp_path / "one.txt").write_text("a" * 5000 + "b\n")
    (tmp_path / "many.txt").write_text(("a" * 20 + "b\n") * 2500)
    return tmp_path


@pytest.fixture
def deep(tmp_path: Path) -> Path:
    """A chain of 800 nested directories (``d/d/d/...``) with a file at the bottom."""
    bottom = tmp_path / "/".join(["d"] * 800)
    os.makedirs(bottom)
    (bottom / "end.txt").write_text("bottom\n")
    return tmp_path


# -- grep ---------------------------------------------------------------------------------------
async def test_catastrophic_grep_pattern_ends_with_a_tool_error_and_never_stalls_the_loop(hostile):
    ctx = ToolContext(root=hostile, tool_timeout_s=5.0, match_timeout_s=0.3)
    start = time.monotonic()
    async with ticking():
        with pytest.raises(ToolRetry, match=r"more than 0.3s on one line \(one.txt:1\)"):
            await run("grep", ctx, pattern=CATASTROPHIC, include="one.txt")
    assert time.monotonic() - start < ctx.tool_timeout_s
    assert await work_ended()


async def test_grep_past_its_deadline_ends_with_a_tool_error_within_it(hostile):
    ctx = ToolContext(root=hostile, tool_timeout_s=0.4)
    start = time.monotonic()
    async with ticking():
        with pytest.raises(ToolRetry, match=r"grep timed out after 0.4s"):
            await run("grep", ctx, pattern=SLOW, include="many.txt")
    assert time.monotonic() - start < 0.4 + 0.5  # the deadline plus the caller's grace at most
    assert await work_ended()


async def test_cancelling_a_long_grep_ends_its_work_promptly(hostile):
    ctx = ToolContext(root=hostile, tool_timeout_s=25.0)
    async with ticking():
        task = asyncio.create_task(run("grep", ctx, pattern=SLOW, include="many.txt"))
        await work_started()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 0.5)
        # The worker thread saw the flag between two lines (each ~10 ms), not at the deadline.
        assert await work_ended(within=ctx.match_timeout_s + 0.5)


async def test_grep_refuses_an_overlong_or_broken_pattern(hostile):
    ctx = ToolContext(root=hostile)
    with pytest.raises(ToolRetry, match="longer than"):
        await run("grep", ctx, pattern="a" * 5000)
    with pytest.raises(ToolRetry, match="bad regular expression"):
        await run("grep", ctx, pattern="(unclosed")
    assert await run("grep", ctx, pattern=r"^a{20}b$", include="one.txt") == "no matches"


# -- glob ---------------------------------------------------------------------------------------
async def test_glob_refuses_more_than_two_double_star_segments_before_walking(deep):
    ctx = ToolContext(root=deep)
    start = time.monotonic()
    with pytest.raises(ToolRetry, match=r"has 5 `\*\*` segments; at most 2"):
        await run("glob", ctx, pattern="**/**/**/**/**/*")
    assert time.monotonic() - start < 0.5
    assert active_work() == 0


async def test_glob_over_a_deep_tree_ends_at_its_deadline_without_stalling_the_loop(deep):
    ctx = ToolContext(root=deep, tool_timeout_s=0.2)
    start = time.monotonic()
    async with ticking():
        with pytest.raises(ToolRetry, match=r"glob timed out after 0.2s"):
            await run("glob", ctx, pattern="**/**/*")
    assert time.monotonic() - start < 0.2 + 0.5
    assert await work_ended()


async def test_glob_stops_at_its_visit_cap_with_a_clear_error(deep):
    ctx = ToolContext(root=deep, max_visits=300)
    async with ticking():
        with pytest.raises(ToolRetry, match="stopped after looking at 300 directory entries"):
            await run("glob", ctx, pattern="**/end.txt")


async def test_cancelling_a_glob_over_a_deep_tree_ends_its_work_promptly(deep):
    ctx = ToolContext(root=deep, tool_timeout_s=25.0)
    async with ticking():
        task = asyncio.create_task(run("glob", ctx, pattern="**/**/*"))
        await work_started()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 0.5)
        assert await work_ended(within=0.5)


async def test_two_double_stars_match_what_one_does_once_each(tmp_path):
    for rel in ("a.txt", "x/b.txt", "x/y/c.txt", "x/y/z.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    ctx = ToolContext(root=tmp_path)
    expected = ["a.txt", "x/b.txt", "x/y/c.txt"]
    assert (await run("glob", ctx, pattern="**/*.txt")).splitlines() == expected
    assert (await run("glob", ctx, pattern="**/**/*.txt")).splitlines() == expected
    assert (await run("glob", ctx, pattern="x/**/*.txt")).splitlines() == expected[1:]
    assert (await run("glob", ctx, pattern="**/y/**")).splitlines() == ["x/y"]
    assert (await run("glob", ctx, pattern="*", path="x")).splitlines() == ["x/b.txt", "x/y"]


# -- in a clone: one clone's hostile grep does not hold the others ------------------------------
async def test_a_hostile_grep_in_one_clone_leaves_the_other_clones_running(hostile):
    grep = call("grep", "c1", pattern=CATASTROPHIC, include="one.txt")
    hostile_model = ScriptedModel(
        [reply("", grep), reply("", call("exit_tool", "cx", success=True, summary="x"))]
    )
    calm_model = ScriptedModel([reply("", call("file_read", "c1", path="one.txt")), reply("done")])
    spec = make_spec(tools=("grep", "file_read"), cwd=str(hostile))
    start = time.monotonic()
    async with ticking():
        calm = asyncio.create_task(Clone(spec, calm_model).run())
        hostile_run = asyncio.create_task(Clone(spec, hostile_model).run())
        calm_result = await calm
        assert not hostile_run.done()  # the calm clone finished while the grep still ran
        hostile_result = await hostile_run
    assert calm_result.stop_reason is StopReason.COMPLETED
    assert hostile_result.stop_reason is StopReason.COMPLETED
    answer = hostile_model.calls[1].messages[-1]
    assert answer.is_error and "backtracks too much" in answer.content
    assert time.monotonic() - start < 10.0  # the default deadline
    assert await work_ended()


async def test_cancelling_a_clone_stops_its_running_grep(hostile):
    grep = call("grep", "c1", pattern=SLOW, include="many.txt")
    model = ScriptedModel([reply("", grep), reply("never reached")])
    clone = Clone(make_spec(tools=("grep",), cwd=str(hostile)), model)
    async with ticking():
        task = asyncio.create_task(clone.run())
        await work_started()
        clone.request_cancel()
        task.cancel()
        result = await asyncio.wait_for(task, 0.5)
        assert await work_ended(within=0.5)
    assert result.stop_reason is StopReason.CANCELLED
