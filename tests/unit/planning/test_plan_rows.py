"""Planning a batch mapped over dataset rows: one clone per row, each spec with its row's key and
its templates rendered with its row; a counted batch has no keys; bad rows are usage errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.definitions import load_catalog
from clonefleet.errors import UsageError
from clonefleet.planning import BatchRequest, check_rows, plan_batch, plan_specs

pytestmark = pytest.mark.timeout(60)

REVIEWER = """---
name: reviewer
description: Reviews one file.
clonefleet:
  tools: [file_read]
---
You review {{ input.path }} for the {{ input.team }} team.

{{ prompt }}
"""
PLAIN = """---
name: plain
description: Does a counted task.
---
Do it.
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "reviewer.md").write_text(REVIEWER)
    (agents / "plain.md").write_text(PLAIN)
    return tmp_path


ROWS = (
    ("src/a.py", {"path": "src/a.py", "team": "core"}),
    ("src/b.py", {"path": "src/b.py", "team": "web"}),
    ("3", {"path": "docs/{{ x }}.md", "team": "docs"}),
)


def specs(project: Path, rows=ROWS, **kw):
    config = Config()
    req = BatchRequest(agent="reviewer", prompt="Report on {{ input.path }}.", rows=rows, **kw)
    n = len(rows) if rows else req.count
    return plan_specs(
        req,
        load_catalog(project, (), config),
        config,
        batch_id="b_1",
        job_ids=[f"sa_{i:08x}" for i in range(n)],
        caller_cwd=project,
    )


def test_each_row_is_a_clone_with_its_key_and_its_rendered_templates(project):
    out = specs(project)
    assert [s.key for s in out] == ["src/a.py", "src/b.py", "3"]
    assert [s.clone_index for s in out] == [0, 1, 2] and {s.clone_count for s in out} == {3}
    assert [s.task for s in out] == [
        f"Report on {p}." for p in ("src/a.py", "src/b.py", "docs/{{ x }}.md")
    ]
    bodies = [(s.instructions + "\n\n" + s.instructions_own).strip() for s in out]
    assert bodies[1] == "You review src/b.py for the web team.\n\nReport on src/b.py."
    assert "docs/{{ x }}.md for the docs team" in bodies[2]


def test_rows_decide_the_count_and_a_counted_batch_has_no_keys(project):
    assert len(specs(project, count=7)) == 3  # count is not used with rows
    counted = BatchRequest(agent="plain", prompt="go", count=2)
    config = Config()
    out = plan_specs(
        counted,
        load_catalog(project, (), config),
        config,
        batch_id="b_2",
        job_ids=["sa_00000001", "sa_00000002"],
        caller_cwd=project,
    )
    assert [s.key for s in out] == [None, None]


def test_a_spec_with_a_key_pickles_and_one_from_before_keys_loads_with_none(project):
    spec = specs(project)[0]
    assert pickle.loads(pickle.dumps(spec)).key == "src/a.py"
    state = spec.__getstate__()  # slots: the field values in order, key last
    old = object.__new__(type(spec))
    old.__setstate__(list(state)[:-1])
    assert old.key is None and old.job_id == spec.job_id


def test_the_rows_are_capped_by_max_count(project):
    config = Config.model_validate({"limits": {"max_count": 2}})
    req = BatchRequest(agent="reviewer", prompt="x", rows=ROWS)
    with pytest.raises(UsageError, match="limits.max_count"):
        plan_specs(
            req,
            load_catalog(project, (), config),
            config,
            batch_id="b_1",
            job_ids=["sa_1", "sa_2", "sa_3"],
            caller_cwd=project,
        )


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ((("a", {}), ("b", {}), ("a", "x")), "input rows 1 and 3 have the same key 'a'"),
        (((1, {}),), "input row 1: its key must be text"),
        ((("a", {}), ("b", 5)), "input row 2 (key 'b'): its data must be an object or text"),
        ((("a",),), "input row 1: expected a (key, data) pair"),
    ],
)
def test_bad_rows_are_usage_errors_naming_the_row(rows, words):
    with pytest.raises(UsageError) as err:
        check_rows(rows)
    assert words in str(err.value)


def test_plan_batch_takes_rows_and_keeps_its_counted_call_shape(project):
    config = Config()
    plan = plan_batch(
        "reviewer", "on {{ input.path }}", config=config, caller_cwd=project, rows=ROWS[:2]
    )
    assert [s.key for s in plan.submission.specs] == ["src/a.py", "src/b.py"]
    assert [s.task for s in plan.submission.specs] == ["on src/a.py", "on src/b.py"]
    again = plan.redraw()
    assert [s.key for s in again.submission.specs] == ["src/a.py", "src/b.py"]
    assert set(again.job_ids).isdisjoint(plan.job_ids)
    counted = plan_batch("plain", "go", 2, config=config, caller_cwd=project)
    assert [s.key for s in counted.submission.specs] == [None, None]
