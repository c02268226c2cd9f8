"""Frontmatter splitting, the safe YAML loader and the lenient Claude fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from clonefleet.definitions import Dialect, load_file, parse_text
from clonefleet.errors import DefinitionError


def _reason(text: str) -> str:
    with pytest.raises(DefinitionError) as info:
        parse_text(text, "x.md")
    return info.value.reason


def test_body_is_split_at_the_first_closing_fence_only() -> None:
    raw = parse_text("---\nname: a\ndescription: d\n---\none\n---\ntwo\n---\n")
    assert raw.body == "one\n---\ntwo\n---\n"
    assert raw.frontmatter == {"name": "a", "description": "d"}


def test_crlf_and_missing_final_newline_are_normalised() -> None:
    raw = parse_text("---\r\nname: a\r\ndescription: d\r\n---\r\nline1\r\nline2")
    assert raw.frontmatter["name"] == "a"
    assert raw.body == "line1\nline2"


def test_utf8_bom_is_ignored() -> None:
    assert parse_text("\ufeff---\nname: a\ndescription: d\n---\nb").frontmatter["name"] == "a"


def test_text_without_frontmatter_is_missing_frontmatter() -> None:
    assert _reason("# just markdown\n") == "missing-frontmatter"


def test_unclosed_frontmatter_is_invalid() -> None:
    assert _reason("---\nname: a\n") == "invalid-frontmatter"


def test_frontmatter_over_64_kib_is_rejected() -> None:
    big = "---\nname: a\ndescription: " + "x" * (64 * 1024) + "\n---\nbody"
    with pytest.raises(DefinitionError) as info:
        parse_text(big)
    assert info.value.reason == "invalid-frontmatter"
    assert "64 KiB" in info.value.message


def test_frontmatter_just_under_64_kib_loads() -> None:
    text = "---\nname: a\ndescription: " + "x" * (60 * 1024) + "\n---\nbody"
    assert len(parse_text(text).frontmatter["description"]) == 60 * 1024


@pytest.mark.parametrize(
    "front",
    [
        "name: &n a\ndescription: d",
        "name: a\ndescription: d\nmodel: *x",
        "base: &b {x: 1}\nname: a\ndescription: d\nother: *b",
    ],
)
def test_anchors_and_aliases_are_rejected(front: str) -> None:
    with pytest.raises(DefinitionError) as info:
        parse_text(f"---\n{front}\n---\nbody")
    assert info.value.reason == "invalid-frontmatter"
    assert "anchors and aliases" in info.value.message


def test_billion_laughs_is_rejected_quickly() -> None:
    lol = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)
    )
    assert _reason(f"---\n{lol}---\nbody") == "invalid-frontmatter"


def test_python_tags_are_not_constructed() -> None:
    with pytest.raises(DefinitionError) as info:
        parse_text("---\nname: !!python/object/apply:os.system ['true']\ndescription: d\n---\n")
    assert info.value.reason == "invalid-frontmatter"


def test_duplicate_keys_are_rejected() -> None:
    with pytest.raises(DefinitionError) as info:
        parse_text("---\nname: a\nname: b\ndescription: d\n---\n")
    assert "duplicate key 'name'" in info.value.message


def test_dates_stay_strings() -> None:
    assert (
        parse_text("---\nname: a\ndescription: 2024-01-01\n---\n").frontmatter["description"]
        == "2024-01-01"
    )


@pytest.mark.parametrize("front", ["- a\n- b", "just text", ""])
def test_non_mapping_frontmatter_is_invalid(front: str) -> None:
    assert _reason(f"---\n{front}\n---\nbody") == "invalid-frontmatter"


@pytest.mark.parametrize("nest", ["[" * 5000 + "]" * 5000, "{a: " * 3000])
def test_deeply_nested_yaml_is_invalid_not_a_crash(nest: str) -> None:
    with pytest.raises(DefinitionError) as info:
        parse_text(f"---\nname: a\nextra: {nest}\n---\n")
    assert info.value.reason == "invalid-frontmatter"
    assert "nested too deeply" in info.value.message


def test_unquoted_colon_description_is_recovered_with_a_warning() -> None:
    raw = parse_text(
        '---\nname: helper\ndescription: Use when: the user asks. Example: user: "hi"\n'
        "tools: Read, Grep\nmodel: sonnet\ncolor: red\n---\nbody"
    )
    assert raw.frontmatter == {
        "name": "helper",
        "description": 'Use when: the user asks. Example: user: "hi"',
        "tools": ["Read", "Grep"],
        "model": "sonnet",
        "color": "red",
    }
    assert any("lenient" in w for w in raw.warnings)


def test_fallback_keeps_unknown_column0_lines_inside_the_description() -> None:
    raw = parse_text(
        "---\nname: helper\ndescription: Use this agent: examples follow\n\n<example>\n"
        'Context: the user wrote code\nuser: "review"\n</example>\ntools: [Read, Glob]\n---\nbody'
    )
    assert "Context: the user wrote code" in raw.frontmatter["description"]
    assert raw.frontmatter["tools"] == ["Read", "Glob"]


def test_fallback_reads_block_list_tools_and_drops_other_known_keys() -> None:
    raw = parse_text(
        "---\nname: h\ndescription: a: b\ntools:\n  - Read\n  - Bash\nmaxTurns: 3\n---\n"
    )
    assert raw.frontmatter["tools"] == ["Read", "Bash"]
    assert "maxTurns" not in raw.frontmatter
    assert any("maxTurns" in w for w in raw.warnings)


def test_fallback_gives_up_on_unknown_leading_text() -> None:
    assert _reason("---\ngarbage: here: too\nname: a\n---\n") == "invalid-frontmatter"


@pytest.mark.parametrize("key", ["clonefleet", "polytoken"])
def test_native_files_never_use_the_fallback(key: str) -> None:
    text = f"---\nname: a\ndescription: broken: colon\n{key}:\n  tools: [file_read]\n---\nbody"
    with pytest.raises(DefinitionError) as info:
        parse_text(text)
    assert info.value.reason == "invalid-frontmatter"


def test_unreadable_bytes_are_an_io_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.md"
    path.write_bytes(b"---\nname: \xff\xfe\n---\n")
    with pytest.raises(DefinitionError) as info:
        load_file(path)
    assert info.value.reason == "io-error"


def test_a_folder_is_an_io_error(tmp_path: Path) -> None:
    (tmp_path / "dir.md").mkdir()
    with pytest.raises(DefinitionError) as info:
        load_file(tmp_path / "dir.md")
    assert info.value.reason == "io-error"


def test_messy_fixture_with_crlf_really_has_crlf(fixtures_dir: Path) -> None:
    path = fixtures_dir / "messy" / "crlf.md"
    assert b"\r\n" in path.read_bytes()
    defn = load_file(path)
    assert defn.dialect is Dialect.CLAUDE
    assert defn.body == "Line one.\nLine two.\n"
    assert defn.tools == ("file_read",)
