"""The launch directory of a batch: the caller's directory, or a given `cwd` that must exist and,
outside the caller's directory, needs explicit approval (docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.errors import UsageError
from clonefleet.planning import BatchRequest, plan_specs

pytestmark = pytest.mark.timeout(20)


def plan(caller: Path, cwd: str | None, approve: bool = False) -> str:
    config = Config()
    req = BatchRequest(agent="general-purpose", prompt="x", count=1, cwd=cwd, approve_chdir=approve)
    specs = plan_specs(
        req,
        load_catalog(caller, [], config),
        config,
        batch_id="b",
        job_ids=["sa_00000001"],
        caller_cwd=caller,
    )
    return specs[0].cwd


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    caller, other = tmp_path / "proj", tmp_path / "proj_evil"
    (caller / "sub").mkdir(parents=True)
    other.mkdir()
    return caller, other


def test_default_is_the_callers_directory_and_a_subdirectory_needs_no_approval(dirs):
    caller, _ = dirs
    assert plan(caller, None) == str(caller)
    assert plan(caller, "sub") == str((caller / "sub").resolve())


@pytest.mark.parametrize("target", ["../proj_evil", "ABS_OTHER", "sub/../../proj_evil"])
def test_a_cwd_outside_needs_approval(dirs, target):
    caller, other = dirs
    given = str(other) if target == "ABS_OTHER" else target
    with pytest.raises(UsageError, match="allow-chdir"):
        plan(caller, given)
    assert plan(caller, given, approve=True) == str(other.resolve())


def test_a_symlink_inside_that_leads_outside_needs_approval(dirs):
    caller, other = dirs
    (caller / "link").symlink_to(other, target_is_directory=True)
    with pytest.raises(UsageError, match="outside"):
        plan(caller, "link")


def test_a_missing_cwd_is_refused_even_with_approval(dirs):
    caller, _ = dirs
    with pytest.raises(UsageError, match="not an existing directory"):
        plan(caller, "nope", approve=True)
