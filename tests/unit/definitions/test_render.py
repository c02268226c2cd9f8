"""Templating (docs/definitions.md): variables, order, strict undefined, batches, and the hostile corpus."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from clonefleet.definitions import (
    AgentDefinition,
    Definition,
    Dialect,
    RenderedClone,
    load_catalog,
    load_file,
    render_batch,
    render_template,
)
from clonefleet.errors import TemplateError, UsageError

NATIVE = Definition(name="native", description="d", dialect=Dialect.NATIVE, templated=True, body="")


def _native(body: str) -> Definition:
    return Definition(
        name="agent",
        description="d",
        dialect=Dialect.NATIVE,
        templated=True,
        body=body,
        path="agent.md",
    )


def _batch(defn: Definition, prompt: str, count: int = 1, **kwargs: Any) -> list[RenderedClone]:
    return render_batch(
        defn,
        prompt=prompt,
        count=count,
        batch_id=kwargs.pop("batch_id", "bt_1"),
        job_ids=kwargs.pop("job_ids", [f"sa_{i:08x}" for i in range(count)]),
        cwd=kwargs.pop("cwd", "/work/launch"),
        project_path=kwargs.pop("project_path", "/work"),
        model_names=kwargs.pop("model_names", [f"m{i}" for i in range(count)]),
        **kwargs,
    )


def test_every_variable_is_available() -> None:
    body = (
        "{{ subagent_name }}|{{ cwd }}|{{ project_path }}|{{ current_date }}|{{ model_name }}|"
        "{{ available_tools }}|{{ available_subagents|join('+') }}|{{ available_skills|length }}|"
        "{{ max_tool_batch_size }}|{{ clone.index }}/{{ clone.number }}/{{ clone.count }}/{{ clone.job_id }}|"
        "{{ batch_id }}|{{ team }}|{{ prompt }}"
    )
    [clone] = _batch(
        _native(body),
        "task for {{ team }}",
        available_tools=["file_read", "grep"],
        available_subagents=["a", "b"],
        available_skills=["s"],
        max_tool_batch_size=4,
        variables={"team": "core"},
        current_date="2025-01-02",
    )
    assert clone.instructions == (
        "agent|/work/launch|/work|2025-01-02|m0|file_read, grep|a+b|1|4|0/1/1/sa_00000000|bt_1|core|task for core"
    )
    assert clone.task == "task for core"


def test_current_date_defaults_to_today() -> None:
    [clone] = _batch(_native("{{ current_date }}"), "x")
    assert clone.instructions == time.strftime("%Y-%m-%d")


def test_each_clone_gets_its_own_variables() -> None:
    clones = _batch(
        _native("{{ clone.index }}:{{ clone.job_id }}:{{ model_name }}:{{ prompt }}"),
        "p{{ clone.index }}",
        3,
    )
    assert [c.instructions for c in clones] == [
        "0:sa_00000000:m0:p0",
        "1:sa_00000001:m1:p1",
        "2:sa_00000002:m2:p2",
    ]
    assert [(c.index, c.job_id) for c in clones] == [
        (0, "sa_00000000"),
        (1, "sa_00000001"),
        (2, "sa_00000002"),
    ]


def test_task_is_rendered_before_the_body_and_has_no_prompt_itself() -> None:
    [clone] = _batch(_native("[{{ prompt|upper }}]"), "{{ subagent_name }} go")
    assert clone.instructions == "[AGENT GO]"
    with pytest.raises(TemplateError) as info:
        _batch(_native("x"), "{{ prompt }}")
    assert info.value.reason == "undefined-variable"


def test_missing_variable_is_an_error_not_empty_text() -> None:
    with pytest.raises(TemplateError) as info:
        _batch(_native("hello {{ nobody }}"), "x")
    assert info.value.reason == "undefined-variable"
    assert "'nobody' is undefined" in info.value.message
    assert info.value.path == "agent.md" and info.value.field == "body"


def test_missing_attribute_is_an_error() -> None:
    with pytest.raises(TemplateError, match="has no attribute 'nope'"):
        _batch(_native("{{ clone.nope }}"), "x")


def test_raw_keeps_literal_braces() -> None:
    [clone] = _batch(
        _native("{% raw %}{{ body }}{% endraw %}"), "{% raw %}{{ literal }} {% if %}{% endraw %}"
    )
    assert clone.task == "{{ literal }} {% if %}"
    assert clone.instructions == "{{ body }}"


def test_plain_text_prompts_pass_through_unchanged() -> None:
    text = "no braces here: 100% plain\n"
    assert _batch(_native("{{ prompt }}"), text)[0].task == text


def test_transclude_includes_a_shipped_fragment() -> None:
    fragment = (
        Path(__file__).resolve().parents[3]
        / "src"
        / "clonefleet"
        / "definitions"
        / "fragments"
        / "reporting.md"
    ).read_text()
    assert _batch(_native("{{ transclude('reporting') }}"), "x")[0].instructions == fragment


@pytest.mark.parametrize("name", ["../shipped/_default", "/etc/passwd", "missing"])
def test_transclude_refuses_paths_and_unknown_fragments(name: str) -> None:
    with pytest.raises(TemplateError) as info:
        _batch(_native(f"{{{{ transclude({name!r}) }}}}"), "x")
    assert "reporting" in info.value.message or "fragment name" in info.value.message


def test_claude_body_is_never_templated(fixtures_dir: Path) -> None:
    defn = load_file(fixtures_dir / "good" / "code-reviewer.md")
    [clone] = _batch(defn, "review {{ clone.index }}")
    assert "{{REPO_PATH}}" in clone.instructions
    assert clone.instructions == defn.body
    assert clone.task == "review 0"


def test_python_body_is_verbatim_but_the_task_is_rendered() -> None:
    defn = AgentDefinition("coded", "d", "Body with {{ braces }}")
    [clone] = _batch(defn, "{{ batch_id }}")
    assert (clone.task, clone.instructions) == ("bt_1", "Body with {{ braces }}")


def test_shipped_definitions_render(tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path)
    for name in ("_default", "general-purpose", "researcher"):
        clones = _batch(catalog.get(name), "Look at README", 2)
        assert "clone 2 of 2" in clones[1].instructions
    assert "Look at README" in _batch(catalog.get("researcher"), "Look at README")[0].instructions


def test_one_bad_clone_rejects_the_whole_batch() -> None:
    with pytest.raises(TemplateError) as info:
        _batch(_native("{{ prompt }}"), "{% if clone.index == 7 %}{{ boom }}{% endif %}ok", 10)
    assert "clone 7" in info.value.message


def test_user_variables_may_not_shadow_built_ins() -> None:
    with pytest.raises(TemplateError) as info:
        _batch(_native("x"), "x", variables={"prompt": "hijack"})
    assert info.value.reason == "invalid-variable"
    with pytest.raises(TemplateError):
        _batch(_native("x"), "x", variables={"not-an-identifier": "v"})


def test_batch_arguments_must_agree() -> None:
    with pytest.raises(UsageError):
        _batch(_native("x"), "x", 2, job_ids=["sa_1"])
    with pytest.raises(UsageError):
        _batch(_native("x"), "x", 0)


def test_syntax_errors_name_the_line() -> None:
    with pytest.raises(TemplateError) as info:
        _batch(_native("line one\n{% if %}"), "x")
    assert info.value.reason == "template-syntax"
    assert "line 2" in info.value.message


def test_large_batches_render_quickly() -> None:
    started = time.perf_counter()
    clones = _batch(
        _native("clone {{ clone.index }} of {{ clone.count }}: {{ prompt }}"),
        "shard {{ clone.index }}",
        2000,
    )
    assert time.perf_counter() - started < 5
    assert clones[-1].instructions == "clone 1999 of 2000: shard 1999"


def test_render_deadline_uses_the_injected_clock() -> None:
    ticks = iter(range(1000))
    with pytest.raises(TemplateError) as info:
        render_template(
            "{% for i in range(100) %}{{ i }}{% endfor %}",
            {},
            timeout_s=5,
            clock=lambda: float(next(ticks)),
        )
    assert info.value.reason == "template-limit"


# ---- hostile templates ----------------------------------------------------------------------

_DEEP = "{% set a = range(10000)|list %}"
HOSTILE: dict[str, tuple[str, str]] = {
    "class-attr": ("{{ ''.__class__ }}", "template-security"),
    "mro-walk": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "template-security"),
    "globals": ("{{ cycler.__init__.__globals__ }}", "template-security"),
    "func-globals": ("{{ transclude.__globals__['os'] }}", "template-security"),
    "attr-filter": ("{{ ''|attr('__class__') }}", "template-security"),
    "getitem-dunder": ("{{ ''['__class__'] }}", "template-security"),
    "self-globals": ("{{ self.__init__.__globals__ }}", "template-security"),
    "format-escape": ("{{ '{0.__class__}'.format('') }}", "template-security"),
    "mutate-list": ("{% set l = [1] %}{{ l.append(2) }}", "template-security"),
    "str-mul": ("{{ 'a' * 10**9 }}", "template-limit"),
    "str-mul-literal": ("{{ 'a' * 1000000000 }}", "template-limit"),
    "list-mul": ("{{ [1] * 10**9 }}", "template-limit"),
    "big-pow": ("{{ 10 ** 1000000 }}", "template-limit"),
    "int-squaring": (
        "{% set ns = namespace(x=3) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
        "template-limit",
    ),
    "huge-range": ("{{ range(10**9)|list|length }}", "template-limit"),
    "nested-loops": (
        "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
        "template-limit",
    ),
    "nested-loops-no-calls": (
        _DEEP
        + "{% for i in a %}{% for j in a %}{% for k in a %}{% endfor %}{% endfor %}{% endfor %}",
        "template-limit",
    ),
    "nested-set-loops": (
        "{% set ns = namespace(n=0) %}{% for i in range(10000) %}{% for j in range(10000) %}"
        "{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}",
        "template-limit",
    ),
    "set-block-loops": (
        "{% for j in range(10000) %}{% set x %}{% for i in range(10000) %}{{ i }}{% endfor %}{% endset %}{% endfor %}",
        "template-limit",
    ),
    "huge-output": ("{% for i in range(10000) %}{{ 'a' * 1000 }}{% endfor %}", "template-limit"),
    "doubling-concat": (
        "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "template-limit",
    ),
    "doubling-list": (
        _DEEP
        + "{% set ns = namespace(l=a) %}{% for i in range(200) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
        "template-limit",
    ),
    "recursive-macro": (
        "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "template-limit",
    ),
    "recursive-loop": (
        "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}",
        "template-limit",
    ),
    "center-filter": ("{{ 'a'|center(999999999) }}", "template-limit"),
    "ljust-method": ("{{ 'a'.ljust(999999999) }}", "template-limit"),
    "format-width": ("{{ '{:>999999999}'.format('a') }}", "template-limit"),
    "percent-width": ("{{ '%999999999d' % 1 }}", "template-limit"),
    "format-filter-width": ("{{ '%999999999s'|format('a') }}", "template-limit"),
    "join-amplify": ("{{ (['a' * 1000000] * 1)|join(',') * 2 }}", "template-limit"),
    "join-many": ("{% set s = 'a' * 1000000 %}{{ [s, s, s]|join }}", "template-limit"),
    "replace-amplify": ("{% set s = 'a' * 1000000 %}{{ s|replace('a', s) }}", "template-limit"),
    "indent-amplify": ("{{ ('\\n' * 100000)|indent(1000) }}", "template-limit"),
    "wordwrap-amplify": (
        "{{ ('a ' * 500000)|wordwrap(1, wrapstring='x' * 1000) }}",
        "template-limit",
    ),
    "batch-fill": ("{{ [1]|batch(10**9, 'x')|list }}", "template-limit"),
    "slice-many": ("{{ [1]|slice(10**9)|list }}", "template-limit"),
    "sum-lists": (_DEEP + "{{ [a] * 100|sum(start=[]) }}", "template-security"),
    "translate": ("{{ 'a'.translate({97: 'b' * 1000}) }}", "template-security"),
    "deep-shared-output": (
        _DEEP + "{% set b = [a] * 100 %}{% set c = [b] * 1000 %}{{ c }}",
        "template-limit",
    ),
    "deep-shared-literal": (
        _DEEP + "{% set b = [a,a,a,a,a,a,a,a,a,a] %}{% set c = [b,b,b,b,b,b,b,b,b,b] %}"
        "{% set d = [c,c,c,c,c,c,c,c,c,c] %}{{ d }}",
        "template-limit",
    ),
    "deep-compare": (
        "{% set a1 = range(10000)|list %}{% set a2 = range(10000)|list %}"
        "{% set b1 = [a1] * 100 %}{% set b2 = [a2] * 100 %}{{ b1 == b2 }}",
        "template-limit",
    ),
    "tojson-indent": ("{{ [1, 2]|tojson(indent=10**6) }}", "template-limit"),
    "include": ("{% include '/etc/passwd' %}", "template-security"),
    "import": ("{% import 'os' as os %}", "template-security"),
    "lipsum": ("{{ lipsum(10**6) }}", "undefined-variable"),
}


@pytest.mark.parametrize(
    ("name", "source", "reason"), [(k, *v) for k, v in HOSTILE.items()], ids=list(HOSTILE)
)
def test_hostile_template_fails_fast_and_clearly(name: str, source: str, reason: str) -> None:
    for where in ("task", "body"):
        defn = _native(source if where == "body" else "{{ prompt }}")
        prompt = source if where == "task" else "plain"
        started = time.perf_counter()
        with pytest.raises(TemplateError) as info:
            _batch(defn, prompt)
        elapsed = time.perf_counter() - started
        assert elapsed < 2.0, f"{name} in the {where} took {elapsed:.2f}s"
        assert info.value.reason == reason, info.value.message
        assert ("task prompt" if where == "task" else "body of 'agent'") in info.value.message


def test_a_hostile_task_starts_nothing_in_a_large_batch() -> None:
    started = time.perf_counter()
    with pytest.raises(TemplateError):
        _batch(_native("{{ prompt }}"), HOSTILE["nested-loops"][0], 500)
    assert time.perf_counter() - started < 2.0


def test_legitimate_loops_and_filters_still_work() -> None:
    source = (
        "{% for i in range(3) %}{{ loop.index }}{% if not loop.last %},{% endif %}{% endfor %}|"
        "{{ ['b', 'a']|sort|join('-') }}|{{ 'x' * 3 }}|{{ 2 ** 10 }}|{{ '%05d' % 42 }}|{{ '{:>4}'.format('ab') }}|"
        "{{ 'Hi'|center(6) }}|{{ {'k': [1, 2]}|tojson }}|{{ 'a-b'.split('-')|length }}|{{ [1, 2, 3]|sum }}|"
        "{% set ns = namespace(n=0) %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}|"
        "{% macro greet(n) %}hi {{ n }}{% endmacro %}{{ greet('bob') }}|{{ ('a' ~ 1 ~ 'b')|upper }}|{{ ns }}"
    )
    [clone] = _batch(_native(source), "x")
    assert clone.instructions == (
        '1,2,3|a-b|xxx|1024|00042|  ab|  Hi  |{"k": [1, 2]}|2|6|10|hi bob|A1B|<namespace>'
    )


def test_too_many_tags_or_too_much_source_is_refused_before_compiling() -> None:
    with pytest.raises(TemplateError, match="template tags"):
        render_template("{{ x }}" * 5001, {"x": 1})
    with pytest.raises(TemplateError, match="source limit"):
        render_template("{{ x }}" + "a" * (1 << 20), {"x": 1})


def test_the_largest_accepted_template_renders_in_time() -> None:
    source = ("{{ x }}" + "a" * 200) * 4999
    started = time.perf_counter()
    assert len(render_template(source, {"x": 1})) == 201 * 4999
    assert time.perf_counter() - started < 2.0


def test_deeply_nested_expressions_are_a_clear_error() -> None:
    with pytest.raises(TemplateError) as info:
        render_template("{{ " + "(" * 900 + "x" + ")" * 900 + " }}", {"x": 1})
    assert info.value.reason == "template-limit"
