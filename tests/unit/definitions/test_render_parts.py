"""Rendering one part of a larger batch: clones numbered from ``first_index`` out of ``total``,
and with ``failures`` a clone that cannot be rendered left out and reported, alone."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clonefleet.definitions import Definition, Dialect, RenderedClone, render_batch
from clonefleet.errors import DefinitionError, TemplateError, UsageError

pytestmark = pytest.mark.timeout(60)


def _native(body: str) -> Definition:
    return Definition(
        name="agent", description="d", dialect=Dialect.NATIVE, templated=True, body=body,
        path="agent.md",
    )  # fmt: skip


def _batch(defn: Definition, prompt: str, inputs: list[Any], **kw: Any) -> list[RenderedClone]:
    n = len(inputs)
    return render_batch(
        defn,
        prompt=prompt,
        count=n,
        batch_id="b_1",
        job_ids=[f"sa_{i:08x}" for i in range(n)],
        cwd="/work",
        project_path="/work",
        model_names=["m"] * n,
        inputs=inputs,
        **kw,
    )


NUMBERS = "{{ clone.index }} {{ clone.number }}/{{ clone.count }} {{ clone.job_id }}"


@settings(max_examples=30, deadline=None)
@given(first=st.integers(0, 10_000), n=st.integers(1, 5), extra=st.integers(0, 3))
def test_a_part_numbers_its_clones_in_the_whole_batch(first, n, extra):
    out = _batch(_native("b"), NUMBERS, ["r"] * n, first_index=first, total=first + n + extra)
    assert [c.index for c in out] == [first + i for i in range(n)]
    assert [c.task for c in out] == [
        f"{first + i} {first + i + 1}/{first + n + extra} sa_{i:08x}" for i in range(n)
    ]


def test_without_a_total_the_count_is_the_parts():
    out = _batch(_native("b"), NUMBERS, ["r", "s"], first_index=4)
    assert [c.task for c in out] == ["4 5/2 sa_00000000", "5 6/2 sa_00000001"]


@pytest.mark.parametrize(("first", "total"), [(-1, None), (2, 3), ("1", None), (0, 1.5)])
def test_a_bad_first_index_or_total_is_a_usage_error(first, total):
    with pytest.raises(UsageError, match="first_index|total"):
        _batch(_native("b"), "t", ["r", "s"], first_index=first, total=total)


def test_with_failures_a_clone_that_cannot_render_is_left_out_and_named():
    failures: list[tuple[int, DefinitionError]] = []
    rows: list[Any] = [{"p": "a"}, {"q": 1}, {"p": "c"}, "text", {"p": [[[0]] * 1]}]
    out = _batch(
        _native("Review {{ input.p.upper() }}."), "t", rows, first_index=20, failures=failures
    )
    assert [(c.index, c.instructions) for c in out] == [(20, "Review A."), (22, "Review C.")]
    assert [i for i, _ in failures] == [1, 3, 4]
    assert all(isinstance(e, TemplateError) for _, e in failures)
    assert "clone 21" in failures[0][1].message and "body of 'agent'" in failures[0][1].message


def test_without_failures_the_first_failing_clone_raises():
    with pytest.raises(TemplateError, match="clone 1"):
        _batch(_native("Review {{ input.p.upper() }}."), "t", [{"p": "a"}, {"q": 1}])


def test_a_row_nested_too_deeply_fails_alone():
    deep: Any = 0
    for _ in range(5000):
        deep = [deep]
    failures: list[tuple[int, DefinitionError]] = []
    out = _batch(_native("b"), "{{ input.k }}", [{"k": 1}, {"k": deep}], failures=failures)
    assert [c.task for c in out] == ["1"]
    assert [i for i, _ in failures] == [1]
    assert "input row of clone 1: nested too deeply" in failures[0][1].message


@pytest.mark.parametrize(
    ("body", "prompt", "words"),
    [("{{ input.p", "t", "body of 'agent': template syntax"), ("b", "{% if %}", "task prompt:")],
)
def test_with_failures_a_template_that_does_not_compile_still_raises(body, prompt, words):
    failures: list[tuple[int, DefinitionError]] = []
    with pytest.raises(TemplateError, match=words):
        _batch(_native(body), prompt, [{"p": 1}, {"p": 2}], failures=failures)
    assert failures == []
