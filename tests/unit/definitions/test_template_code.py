"""The template code limit (docs/definitions.md, "Templating"): a template whose tags hold more
code than Jinja can compile quickly is refused by size before Jinja reads it; text, comments and
raw blocks are not code, and large legal templates still render."""

from __future__ import annotations

import tracemalloc

import pytest

from clonefleet.definitions import render_template
from clonefleet.definitions.template._code_size import code_exceeds
from clonefleet.definitions.template._render import MAX_TEMPLATE_CODE_CHARS, MAX_TEMPLATE_TAGS
from clonefleet.errors import TemplateError

pytestmark = pytest.mark.timeout(20)

CAP = MAX_TEMPLATE_CODE_CHARS
CODE_LIMIT = f"template code limit of {CAP:,} characters"


def ones(chars: int) -> str:
    """A list literal's items, ``1,1,...,1``, about ``chars`` characters long."""
    return ",".join(["1"] * (chars // 2))


def refuse(source: str) -> TemplateError:
    with pytest.raises(TemplateError) as info:
        render_template(source, {"x": 1})
    return info.value


def test_a_600_kb_list_literal_is_refused_by_size_before_jinja_reads_it():
    source = "{{ [" + ones(600_000) + "] }}"
    tracemalloc.start()
    try:
        error = refuse(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.reason == "template-limit"
    assert CODE_LIMIT in str(error)
    assert f"{len(source):,} characters" in str(error)  # how big it was
    # Jinja's lexer and parser would hold a node per item: over 100 MB for this source.
    assert peak < 4 * len(source), f"refusing took {peak:,} bytes"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ['}}', \"%}\", {'a': {'b': 1}}] + [" + ones(CAP) + "] }}",
        "{% set a = ['%}', ('}}')] %}{% set b = [" + ones(CAP) + "] %}",
        "{{ x }}" * 100 + "{{ [" + ones(CAP),  # left open: runs to the end
        "{{ [" + ones(CAP // 2) + "] }} text {% set a = [" + ones(CAP // 2 + 100) + "] %}",
    ],
    ids=["closers-in-strings-and-dicts", "block", "unclosed", "two-tags-together"],
)
def test_code_cannot_hide_behind_strings_brackets_or_other_tags(source):
    assert CODE_LIMIT in str(refuse(source))


def test_the_limit_counts_exactly_the_code_inside_the_delimiters():
    inside = " " + "x" * (CAP - 2) + " "
    assert not code_exceeds("text {{" + inside + "}} text", CAP)
    assert code_exceeds("text {{" + inside + " }} text", CAP)
    assert not code_exceeds("{%" + inside[:-10] + "%}{{ 12345 }}", CAP)


def test_text_comments_and_raw_blocks_are_not_code():
    big_code_text = "{{ [" + ones(2 * CAP) + "] }}"
    source = (
        "a" * 500_000
        + "{# "
        + ones(2 * CAP)
        + " #}"
        + "{% raw %}"
        + big_code_text
        + "{% endraw %}{{ x }}"
    )
    assert render_template(source, {"x": 1}) == "a" * 500_000 + big_code_text + "1"


def test_a_large_legal_template_still_renders():
    table = ", ".join(f"'file_{i}.py'" for i in range(1_000))  # about 15 KB of code
    source = (
        "Review these files:\n"
        + "prose line\n" * 85_000
        + "{% for f in ["
        + table
        + "] %}{% if loop.index0 % 250 == 0 %}{{ f }} {% endif %}{% endfor %}"
    )
    assert len(source) > 900_000
    out = render_template(source, {})
    assert out.endswith("file_0.py file_250.py file_500.py file_750.py ")


def test_comments_count_towards_the_tag_limit():
    assert "template tags" in str(refuse("{# c #}" * (MAX_TEMPLATE_TAGS + 1)))
    assert render_template("{# c #}" * (MAX_TEMPLATE_TAGS - 1) + "{{ x }}", {"x": 1}) == "1"
