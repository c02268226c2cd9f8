"""A dataset row in templates (``--inputs``): ``input`` in the task and a native body, a data row
printing as compact JSON, its values never rendered, ``input`` reserved, and the caps per clone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clonefleet.definitions import Definition, Dialect, RenderedClone, render_batch
from clonefleet.errors import TemplateError, UsageError

pytestmark = pytest.mark.timeout(60)


def _native(body: str) -> Definition:
    return Definition(
        name="agent", description="d", dialect=Dialect.NATIVE, templated=True, body=body,
        path="agent.md",
    )  # fmt: skip


def _batch(
    defn: Definition, prompt: str, inputs: list[Any] | None, count: int | None = None, **kw: Any
) -> list[RenderedClone]:
    n = count if count is not None else len(inputs or [None])
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


def test_each_clone_sees_its_own_row_in_the_task_and_the_body():
    rows = [{"path": "a.py", "size": 3}, {"path": "b.py", "size": 40}]
    out = _batch(
        _native("Review {{ input.path }} ({{ input['size'] }} lines). {{ prompt }}"),
        "task {{ clone.index }}: {{ input.path }}",
        rows,
    )
    assert [c.task for c in out] == ["task 0: a.py", "task 1: b.py"]
    assert [c.instructions for c in out] == [
        "Review a.py (3 lines). task 0: a.py",
        "Review b.py (40 lines). task 1: b.py",
    ]


def test_a_whole_data_row_prints_as_compact_json_nested_values_too():
    row = {"id": 7, "tags": ["x", "é"], "meta": {"ok": True, "none": None}, "f": 1.5}
    [clone] = _batch(
        _native(""),
        "{{ input }}|{{ input.meta }}|{{ input.tags }}|{{ input.meta.ok }}|{{ input.tags[1] }}",
        [row],
    )
    whole, meta, tags, ok, second = clone.task.split("|")
    assert json.loads(whole) == row and whole == json.dumps(
        row, separators=(",", ":"), ensure_ascii=False
    )
    assert meta == '{"ok":true,"none":null}' and tags == '["x","é"]'
    assert (ok, second) == ("True", "é")


def test_a_text_row_is_the_text_itself():
    out = _batch(_native("{{ input|upper }}"), "say {{ input }}", ["hello", "two words"])
    assert [c.task for c in out] == ["say hello", "say two words"]
    assert [c.instructions for c in out] == ["HELLO", "TWO WORDS"]


def test_row_values_are_data_never_templates():
    row = {"text": "{{ clone.index }} {% for x in range(9) %}x{% endfor %} {# c #}"}
    [clone] = _batch(_native(""), "<{{ input.text }}> {{ input }}", [row])
    assert clone.task == f"<{row['text']}> {json.dumps(row, separators=(',', ':'))}"
    [clone] = _batch(_native(""), "{{ input }}", ["{{ batch_id }}"])
    assert clone.task == "{{ batch_id }}"


def test_a_field_named_like_a_dict_method_reads_the_field():
    [clone] = _batch(_native(""), "{{ input.items }} {{ input.keys }} {{ input.get }}", [
        {"items": 3, "keys": "k", "get": "g"}
    ])  # fmt: skip
    assert clone.task == "3 k g"
    [clone] = _batch(_native(""), "{% for k, v in input.items() %}{{ k }}={{ v }};{% endfor %}", [
        {"a": 1, "b": {"c": 2}}
    ])  # fmt: skip
    assert clone.task == 'a=1;b={"c":2};'


def test_a_missing_field_fails_naming_the_clone_like_any_undefined_name():
    with pytest.raises(TemplateError) as err:
        _batch(_native(""), "{{ input.path }}", [{"path": "a"}, {"other": 1}])
    assert err.value.reason == "undefined-variable"
    assert "clone 1" in err.value.message
    assert "the input row has no field 'path'" in err.value.message
    with pytest.raises(TemplateError, match="the input row has no field 'b'"):
        _batch(_native(""), "{{ input['b'] }}", [{"a": 1}])
    [clone] = _batch(
        _native(""),
        "{{ input.b is defined }} {{ input.b|default('none') }} {{ input.get('b', 'dflt') }}",
        [{"a": 1}],
    )
    assert clone.task == "False none dflt"


def test_without_rows_input_is_undefined_as_before():
    with pytest.raises(TemplateError) as err:
        _batch(_native(""), "{{ input }}", None, count=2)
    assert err.value.reason == "undefined-variable"


def test_input_is_a_reserved_name():
    with pytest.raises(TemplateError) as err:
        _batch(_native(""), "x", ["a"], variables={"input": "mine"})
    assert "built in" in err.value.message and "input" in err.value.message


def test_one_row_per_clone_is_needed():
    with pytest.raises(UsageError, match="one input row per clone"):
        _batch(_native(""), "x", ["a", "b"], count=3)


def test_the_template_caps_hold_per_clone():
    big = "x" * 700_000
    # One row's value fits the output cap; printing it twice does not, for that clone alone.
    with pytest.raises(TemplateError) as err:
        _batch(_native(""), "{{ input.v }}{{ input.v }}", [{"v": "s"}, {"v": big}])
    assert err.value.reason == "template-limit" and "clone 1" in err.value.message
    [ok] = _batch(_native(""), "{{ input.v|length }}", [{"v": big}])
    assert ok.task == "700000"
    with pytest.raises(TemplateError) as err:  # the whole row as text is sized before it is made
        _batch(_native(""), "{{ input }}", [{"a": big, "b": big}])
    assert err.value.reason == "template-limit"


def test_a_row_nested_too_deeply_is_refused_naming_the_clone():
    deep: Any = "leaf"
    for _ in range(5_000):
        deep = {"d": deep}
    with pytest.raises(TemplateError) as err:
        _batch(_native(""), "{{ input }}", ["ok", deep])
    assert "clone 1" in err.value.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_any_json_row_prints_back_as_the_same_json(row):
    [clone] = _batch(_native(""), "{{ input }}", [row])
    assert json.loads(clone.task) == row
