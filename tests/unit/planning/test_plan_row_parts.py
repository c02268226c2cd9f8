"""Planning rows one slice at a time: a part's clones are numbered in the whole batch (index,
number, count, failover cursor), and with :func:`plan_rows` a row that cannot be rendered fails
alone while whole-batch problems still raise at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.config import Config
from clonefleet.errors import DefinitionError, TemplateError, UsageError
from clonefleet.planning import PlanOptions, RowFailure, plan_batch, plan_rows

pytestmark = pytest.mark.timeout(60)

NUMBERED = """---
name: numbered
clonefleet:
  tools: [file_read]
description: Says which clone it is.
---
Clone {{ clone.number }} of {{ clone.count }} (index {{ clone.index }}) on {{ model_name }}.

{{ prompt }}
"""
STRICT = """---
name: strict
clonefleet:
  tools: [file_read]
description: Needs a path in every row.
---
Review {{ input.path.upper() }}.
"""
BROKEN = """---
name: broken
clonefleet:
  tools: [file_read]
description: Does not compile.
---
Review {{ input.path
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "numbered.md").write_text(NUMBERED)
    (agents / "strict.md").write_text(STRICT)
    (agents / "broken.md").write_text(BROKEN)
    return tmp_path


def rows(keys: range) -> list[tuple[str, dict[str, str]]]:
    return [(f"k{i}", {"path": f"src/{i}.py"}) for i in keys]


def test_two_parts_number_their_clones_in_the_whole_batch(project):
    config = Config()
    first = plan_batch(
        "numbered", "go", config=config, caller_cwd=project, rows=rows(range(3)), total=5
    )
    second = plan_batch(
        "numbered",
        "go",
        config=config,
        caller_cwd=project,
        rows=rows(range(3, 5)),
        batch_id=first.submission.batch_id,
        first_index=3,
        total=5,
    )
    specs = [*first.submission.specs, *second.submission.specs]
    assert [s.clone_index for s in specs] == [0, 1, 2, 3, 4]
    assert {s.clone_count for s in specs} == {5}
    assert [s.key for s in specs] == [f"k{i}" for i in range(5)]
    models = config.model_groups["default"]
    assert [body(s) for s in specs] == [
        f"Clone {i + 1} of 5 (index {i}) on {models[i % len(models)]}.\n\ngo" for i in range(5)
    ]
    assert {s.batch_id for s in second.submission.specs} == {first.submission.batch_id}


def test_a_part_without_a_total_counts_its_own_clones(project):
    plan = plan_batch(
        "numbered", "go", config=Config(), caller_cwd=project, rows=rows(range(7, 9)), first_index=7
    )
    assert [(s.clone_index, s.clone_count) for s in plan.submission.specs] == [(7, 2), (8, 2)]
    assert [s.task for s in plan.submission.specs] == ["go", "go"]
    assert body(plan.submission.specs[0]).startswith("Clone 8 of 2 (index 7) on ")


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(first=st.integers(0, 50), n=st.integers(1, 4))
def test_the_failover_cursor_starts_at_the_whole_batch_index(project, first, n):
    plan = plan_batch(
        "numbered",
        "go",
        config=Config(),
        caller_cwd=project,
        rows=rows(range(first, first + n)),
        first_index=first,
        total=first + n + 1,
    )
    size = len(plan.submission.specs[0].candidates)
    assert size == 2
    assert [s.start for s in plan.submission.specs] == [(first + i) % size for i in range(n)]


def test_the_counted_path_is_unchanged(project):
    plan = plan_batch("numbered", "go", 3, config=Config(), caller_cwd=project)
    specs = plan.submission.specs
    assert [(s.clone_index, s.clone_count, s.start, s.key) for s in specs] == [
        (0, 3, 0, None),
        (1, 3, 1, None),
        (2, 3, 0, None),
    ]
    assert plan.redraw().submission.specs[2].clone_index == 2


@pytest.mark.parametrize(
    ("first_index", "total", "words"),
    [(-1, None, "first_index"), (0, 2, "total"), (4, 6, "total"), (True, None, "first_index")],
)
def test_a_bad_first_index_or_total_is_a_usage_error(project, first_index, total, words):
    with pytest.raises(UsageError, match=words):
        plan_batch(
            "numbered",
            "go",
            config=Config(),
            caller_cwd=project,
            rows=rows(range(3)),
            first_index=first_index,
            total=total,
        )


def test_a_row_that_cannot_render_fails_alone(project):
    data = [
        ("a", {"path": "src/a.py"}),
        ("b", {"name": "no path"}),
        ("c", {"path": "src/c.py"}),
        ("deep", {"path": "x", "n": _nested(5000)}),
        ("e", {"path": "src/e.py"}),
    ]
    out = plan_rows("strict", "go", data, config=Config(), caller_cwd=project, first_index=10)
    assert out.plan is not None
    specs = out.plan.submission.specs
    assert [(s.key, s.clone_index) for s in specs] == [("a", 10), ("c", 12), ("e", 14)]
    assert [body(s) for s in specs] == ["Review SRC/A.PY.", "Review SRC/C.PY.", "Review SRC/E.PY."]
    assert [(f.key, f.index) for f in out.failures] == [("b", 11), ("deep", 13)]
    assert all(isinstance(f, RowFailure) for f in out.failures)
    assert "clone 11" in out.failures[0].reason and "path" in out.failures[0].reason
    assert "clone 13" in out.failures[1].reason and "nested too deeply" in out.failures[1].reason
    assert len(set(out.plan.job_ids)) == 3
    again = out.plan.redraw()
    assert [s.key for s in again.submission.specs] == ["a", "c", "e"]
    assert set(again.job_ids).isdisjoint(out.plan.job_ids)


def test_the_same_rows_raise_on_the_failing_row_without_plan_rows(project):
    data = [("a", {"path": "src/a.py"}), ("b", {"name": "no path"})]
    with pytest.raises(TemplateError, match="clone 1"):
        plan_batch("strict", "go", config=Config(), caller_cwd=project, rows=data)


def test_no_row_rendered_gives_no_plan(project):
    data = [("a", {"x": 1}), ("b", "a text row")]
    out = plan_rows("strict", "go", data, config=Config(), caller_cwd=project, total=9)
    assert out.plan is None
    assert [(f.key, f.index) for f in out.failures] == [("a", 0), ("b", 1)]
    assert all("body of 'strict'" in f.reason for f in out.failures)


def test_every_row_rendered_gives_no_failures(project):
    out = plan_rows("numbered", "go", rows(range(4)), config=Config(), caller_cwd=project)
    assert out.failures == () and out.plan is not None
    assert len(out.plan.submission.specs) == 4


@pytest.mark.parametrize(
    ("kw", "error", "words"),
    [
        ({"agent": "nobody"}, DefinitionError, "nobody"),
        ({"model": "no-such-model"}, UsageError, "no-such-model"),
        ({"cwd": "missing-dir"}, UsageError, "missing-dir"),
        ({"agent": "broken"}, TemplateError, "syntax"),
        ({"prompt": "{% if %}"}, TemplateError, "task prompt: template syntax"),
        ({"rows": [("a", {"path": "p"}), ("a", {"path": "q"})]}, UsageError, "same key"),
        ({"rows": []}, UsageError, "at least one input row"),
        ({"clones_per_actor": 0}, UsageError, "clones-per-actor"),
    ],
)
def test_whole_batch_problems_still_raise(project, kw, error, words):
    args = {"agent": "strict", "prompt": "go", "rows": rows(range(2)), **kw}
    with pytest.raises(error, match=words):
        plan_rows(
            args.pop("agent"),
            args.pop("prompt"),
            args.pop("rows"),
            config=Config(),
            caller_cwd=project,
            **args,
        )


def body(spec) -> str:
    """A spec's whole rendered body (its shared paragraphs, then its own)."""
    return "\n\n".join(p for p in (spec.instructions, spec.instructions_own) if p).strip()


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_plan_batch_and_plan_rows_take_the_same_options(project: Path) -> None:
    """One set of options (PlanOptions) for both: each plans the same clones with them."""
    options: PlanOptions = {"model": "sim-small", "max_concurrency": 3, "first_index": 4}
    counted = plan_batch(
        "numbered", "go", config=Config(), caller_cwd=project, rows=rows(range(2)), **options
    )
    part = plan_rows(
        "numbered", "go", rows(range(2)), config=Config(), caller_cwd=project, **options
    )
    assert part.plan is not None
    for plan in (counted, part.plan):
        assert plan.submission.max_concurrency == 3
        assert [s.clone_index for s in plan.submission.specs] == [4, 5]
        assert plan.request.model == "sim-small"


@pytest.mark.parametrize("plan", [plan_batch, plan_rows])
def test_an_unknown_option_is_a_type_error(project: Path, plan: Any) -> None:
    """A misspelt option is refused, as a keyword Python does not know would be."""
    with pytest.raises(TypeError, match="'max_concurency'"):
        plan(
            "numbered", "go", rows(range(1)), config=Config(), caller_cwd=project, max_concurency=2
        )
