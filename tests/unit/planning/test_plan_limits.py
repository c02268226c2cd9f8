"""Plan-time limits: clones per actor, concurrency, prompt size and the serve port.

Each bad value is refused before anything starts (no Ray): a UsageError from the Python API,
argparse's own error (exit 2) from the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clonefleet import fleet as _fleet
from clonefleet.cli import program as cli
from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.errors import UsageError
from clonefleet.fleet import Fleet
from clonefleet.planning import BatchRequest, BatchSubmission, plan_specs
from clonefleet.providers import SimScript
from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import LocalHost

pytestmark = pytest.mark.timeout(30)


class NoRay:
    """Stands in for what would start Ray; planning must fail before it is reached."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("Ray must not start for a bad request")


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_fleet, "Fleet", NoRay)
    monkeypatch.setattr(_fleet, "ClusterSession", NoRay)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)


def plan(tmp_path: Path, prompt: str = "go", config: Config | None = None, **kw: Any) -> Any:
    return _fleet.plan_batch(
        "general-purpose", prompt, 2, config=config or Config(), caller_cwd=tmp_path, **kw
    )


@pytest.mark.parametrize("option", ["clones_per_actor", "max_concurrency"])
@pytest.mark.parametrize("value", [0, -1, -5, True, 1.5, "2"])
def test_the_api_refuses_slots_below_one(tmp_path: Path, option: str, value: Any):
    with pytest.raises(UsageError, match="1 or more"):
        plan(tmp_path, **{option: value})


def test_the_api_accepts_one_and_defaults(tmp_path: Path):
    sub = plan(tmp_path, clones_per_actor=1, max_concurrency=1).submission
    assert (sub.clones_per_actor, sub.max_concurrency) == (1, 1)
    sub = plan(tmp_path, config=Config(limits={"clones_per_actor": 3})).submission
    assert (sub.clones_per_actor, sub.max_concurrency) == (3, None)


def test_a_prompt_over_the_limit_is_refused(tmp_path: Path):
    limit = Config().limits.max_prompt_chars
    assert limit == 1_000_000
    assert plan(tmp_path, "x" * limit).job_ids
    with pytest.raises(UsageError, match=r"limits\.max_prompt_chars \(1,000,000\)"):
        plan(tmp_path, "x" * (limit + 1))


def test_the_prompt_limit_comes_from_the_config(tmp_path: Path):
    config = Config(limits={"max_prompt_chars": 10})
    assert plan(tmp_path, "x" * 10, config=config).job_ids
    with pytest.raises(UsageError, match="11 characters"):
        plan(tmp_path, "x" * 11, config=config)


def test_a_prompt_that_is_not_text_is_refused(tmp_path: Path):
    with pytest.raises(UsageError, match="must be text"):
        plan(tmp_path, b"bytes")  # type: ignore[arg-type]


def test_fleet_refuses_a_cap_below_one_before_ray(tmp_path: Path):
    with pytest.raises(UsageError, match="1 or more"):
        Fleet(max_concurrency=0, cwd=tmp_path)
    with pytest.raises(UsageError, match="1 or more"):
        Fleet(max_concurrency=-3, cwd=tmp_path)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--clones-per-actor", "0"], "--clones-per-actor"),
        (["--clones-per-actor", "-1"], "--clones-per-actor"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--max-concurrency", "-2"], "--max-concurrency"),
        (["--max-concurrency", "many"], "--max-concurrency"),
    ],
)
def test_run_refuses_slots_below_one_with_status_2(
    capsys: pytest.CaptureFixture[str], args: list[str], flag: str
):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "general-purpose", "--prompt", "p", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a whole number 1 or more" in err


@pytest.mark.parametrize("port", ["70000", "-1", "65536", "http"])
def test_serve_refuses_a_port_out_of_range_with_status_2(
    capsys: pytest.CaptureFixture[str], port: str
):
    with pytest.raises(SystemExit) as info:
        cli.main(["provider", "serve", "--port", port])
    assert info.value.code == 2
    assert "argument --port: must be a whole number from 0 to 65535" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["0", "1", "65535"])
def test_serve_accepts_the_port_range(port: str):
    args = cli.build_parser().parse_args(["provider", "serve", "--port", port])
    assert args.port == int(port)


SPAWNER = """---
name: root
description: Delegates.
clonefleet:
  allow_subagent_spawn: true
  tools: [file_read]
---
Coordinate: {{ prompt }}
"""


@pytest.mark.parametrize(("length", "children"), [(50, 1), (51, 0)])
async def test_a_nested_spawn_with_a_prompt_over_the_limit_starts_nothing(
    tmp_path: Path, length: int, children: int
):
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "root.md").write_text(SPAWNER)
    config = Config(limits={"max_prompt_chars": 50})
    spawn = {"tool": "subagent", "args": {"description": "d", "prompt": "y" * length}}
    done = {"tool": "exit_tool", "args": {"success": True, "summary": "gave up"}}
    core = SchedulerCore(LocalHost)
    batch_id, ids = core.reserve_ids(1)
    specs = plan_specs(
        BatchRequest(agent="root", prompt="top"),
        load_catalog(tmp_path, (), config),
        config,
        batch_id=batch_id,
        job_ids=ids,
        caller_cwd=tmp_path,
    )
    sub = BatchSubmission(
        batch_id=batch_id,
        specs=specs,
        config=config,
        sim_script=SimScript.from_data({"agents": {"root": {"default": [spawn, done]}}}),
        project_path=str(tmp_path),
    )
    root = (await core.submit(sub))["job_ids"][0]
    try:
        assert (await core.job_block([root], timeout_seconds=20))["done"]
        assert len(core.jobs) == 1 + children  # over the limit, no child was even recorded
        events = (await core.events(target=root, level="tools"))["events"]
        ends = [
            e["event"]
            for e in events
            if e["subagent_run_id"] == root
            and e["event"]["type"] == "tool_call_end"
            and e["event"]["tool"] == "subagent"
        ]
        assert [e["is_error"] for e in ends] == [children == 0]
    finally:
        await core.aclose()
