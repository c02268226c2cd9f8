"""The three dialects: native (clonefleet:/polytoken:), claude-style files, python/config."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from clonefleet.config import Config
from clonefleet.definitions import (
    DEFAULT_EXIT_SCHEMA,
    AgentDefinition,
    Definition,
    Dialect,
    load_catalog,
    load_file,
    register,
)
from clonefleet.errors import DefinitionError


def _load(write_md: Any, tmp_path: Path, filename: str, text: str) -> Definition:
    return load_file(write_md(tmp_path / "defs", filename, text))


def test_native_file_with_every_key(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "full.md",
        """
        ---
        name: full
        description: Every native key.
        clonefleet:
          model: "@mg:fast"
          fallback_models: [sim-large]
          tools: [file_read, grep, tag!ALL_MCP]
          tools_deny: [shell]
          skills_allow: [style]
          skills_deny: [secrets]
          undeferred_tools: [file_read]
          autonomous_hint: read only
          inherit_tools: true
          allow_subagent_spawn: true
          exit_tool_schema: {type: object, properties: {success: {type: boolean}}, required: [success]}
          max_turns: 7
          max_tokens: 1000
        ---
        Body {{ prompt }}
        """,
    )
    assert defn.dialect is Dialect.NATIVE and defn.templated
    assert defn.model == "@mg:fast"
    assert defn.fallback_models == ("sim-large",)
    assert defn.tools == ("file_read", "grep", "tag!ALL_MCP")
    assert defn.tools_deny == ("shell",)
    assert (defn.skills_allow, defn.skills_deny) == (("style",), ("secrets",))
    assert defn.undeferred_tools == ("file_read",)
    assert defn.autonomous_hint == "read only"
    assert defn.inherit_tools and defn.allow_subagent_spawn
    assert defn.exit_tool_schema == {
        "type": "object",
        "properties": {"success": {"type": "boolean"}},
        "required": ["success"],
    }
    assert (defn.max_turns, defn.max_tokens) == (7, 1000)
    assert defn.body == "Body {{ prompt }}\n"
    assert defn.warnings == ()


def test_polytoken_namespace_is_an_alias(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "triage.md",
        """
        ---
        name: triage
        description: Classifies issues.
        polytoken:
          tools: [file_read, glob, grep]
          skills_allow: []
        ---
        body
        """,
    )
    assert defn.dialect is Dialect.NATIVE
    assert defn.tools == ("file_read", "glob", "grep")
    assert defn.skills_allow == ()


def test_native_defaults_when_the_namespace_is_empty(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md, tmp_path, "bare.md", "---\nname: bare\ndescription: d\nclonefleet:\n---\nb\n"
    )
    assert defn.tools is None and defn.model is None and defn.exit_tool_schema is None
    assert defn.effective_exit_schema == DEFAULT_EXIT_SCHEMA
    assert not defn.declares_exit_schema


def test_autonomous_hint_wins_over_the_old_spelling(write_md: Any, tmp_path: Path) -> None:
    both = _load(
        write_md,
        tmp_path,
        "h.md",
        "---\nname: h\ndescription: d\nclonefleet:\n  auto_facet_hint: old\n  autonomous_hint: new\n---\n",
    )
    old = _load(
        write_md,
        tmp_path,
        "o.md",
        "---\nname: o\ndescription: d\nclonefleet:\n  auto_facet_hint: old\n---\n",
    )
    assert both.autonomous_hint == "new"
    assert old.autonomous_hint == "old"


def test_native_name_must_equal_the_file_name(write_md: Any, tmp_path: Path) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(
            write_md, tmp_path, "file.md", "---\nname: other\ndescription: d\nclonefleet: {}\n---\n"
        )
    assert info.value.reason == "name-mismatch"


def test_native_top_level_extras_warn(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md, tmp_path, "t.md", "---\nname: t\ndescription: d\nmodel: x\nclonefleet: {}\n---\n"
    )
    assert defn.model is None
    assert any("`model` is ignored in a native definition" in w for w in defn.warnings)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("max_turns", "0", "max_turns"),
        ("max_turns", "'5'", "max_turns"),
        ("inherit_tools", "'yes'", "inherit_tools"),
        ("tools", "file_read", "tools"),
        ("exit_tool_schema", "true", "exit_tool_schema"),
    ],
)
def test_native_key_types_are_strict(
    write_md: Any, tmp_path: Path, key: str, value: str, fragment: str
) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(
            write_md,
            tmp_path,
            "k.md",
            f"---\nname: k\ndescription: d\nclonefleet:\n  {key}: {value}\n---\n",
        )
    assert info.value.reason == "invalid-definition"
    assert f"clonefleet.{fragment}" in info.value.message
    assert "rule key-type" in info.value.message


def test_native_unknown_key_suggests_the_right_one(write_md: Any, tmp_path: Path) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(
            write_md,
            tmp_path,
            "k.md",
            "---\nname: k\ndescription: d\npolytoken:\n  max_turn: 3\n---\n",
        )
    assert "rule unknown-key" in info.value.message
    assert "polytoken.max_turns" in info.value.message
    assert info.value.field == "polytoken.max_turn"


def test_both_namespaces_at_once_are_rejected(write_md: Any, tmp_path: Path) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(
            write_md,
            tmp_path,
            "k.md",
            "---\nname: k\ndescription: d\nclonefleet: {}\npolytoken: {}\n---\n",
        )
    assert "rule one-namespace" in info.value.message


def test_native_needs_a_description(write_md: Any, tmp_path: Path) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(write_md, tmp_path, "k.md", "---\nname: k\nclonefleet: {}\n---\n")
    assert "rule description-required" in info.value.message


# ---- claude ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools_line", "expected"),
    [
        ("tools: [Read, Grep, Glob]", ("file_read", "grep", "glob")),
        ("tools: Read, Grep, Glob", ("file_read", "grep", "glob")),
        ("tools: Bash", ("shell",)),
        ("tools: Read Grep", ("file_read", "grep")),
        ("tools: [Write, Edit, LS, MultiEdit]", ("file_write", "file_edit", "list_dir")),
        ("tools: []", ()),
        ("tools:", None),
        ("", None),
        ('tools: "*"', None),
    ],
)
def test_claude_tools_shapes(write_md: Any, tmp_path: Path, tools_line: str, expected: Any) -> None:
    defn = _load(
        write_md, tmp_path, "c.md", f"---\nname: c\ndescription: d\n{tools_line}\n---\nbody\n"
    )
    assert defn.dialect is Dialect.CLAUDE
    assert defn.tools == expected


def test_claude_body_is_verbatim_and_not_templated(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "c.md",
        "---\nname: c\ndescription: d\n---\nUse {{REPO_PATH}} {% if %}\n",
    )
    assert not defn.templated
    assert defn.body == "Use {{REPO_PATH}} {% if %}\n"


def test_claude_name_may_differ_from_the_file_name(write_md: Any, tmp_path: Path) -> None:
    defn = _load(write_md, tmp_path, "file-name.md", "---\nname: other-name\ndescription: d\n---\n")
    assert defn.name == "other-name"


def test_claude_missing_name_uses_the_file_name_with_a_warning(
    write_md: Any, tmp_path: Path
) -> None:
    defn = _load(write_md, tmp_path, "stem.md", "---\ndescription: d\n---\n")
    assert defn.name == "stem"
    assert any("no `name`" in w for w in defn.warnings)


def test_claude_known_keys_map_onto_the_definition(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "c.md",
        "---\nname: c\ndescription: d\nmodel: inherit\nmaxTurns: 4\n"
        "disallowedTools: Bash, Write\nskills: [a, b]\n---\n",
    )
    assert defn.model is None
    assert defn.max_turns == 4
    assert defn.tools_deny == ("shell", "file_write")
    assert defn.skills_allow == ("a", "b")


def test_claude_model_alias_and_id_are_kept(write_md: Any, tmp_path: Path) -> None:
    assert (
        _load(
            write_md, tmp_path, "a.md", "---\nname: a\ndescription: d\nmodel: sonnet\n---\n"
        ).model
        == "sonnet"
    )
    assert (
        _load(
            write_md, tmp_path, "b.md", "---\nname: b\ndescription: d\nmodel: vendor/x-9\n---\n"
        ).model
        == "vendor/x-9"
    )


def test_claude_unknown_keys_and_tools_are_warnings(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "c.md",
        "---\nname: c\ndescription: d\ncolor: red\nhooks: {}\nx-custom: 1\n"
        "tools: [Read, WebSearch, mcp__x__y, NoSuchTool]\n---\n",
    )
    assert defn.tools == ("file_read", "web_search", "mcp__x__y", "NoSuchTool")
    assert defn.extra_keys == ("color", "hooks", "x-custom")
    text = "\n".join(defn.warnings)
    for needle in ("mcp__x__y", "NoSuchTool", "`hooks`", "`x-custom`"):
        assert needle in text
    assert "color" not in text and "web_search" not in text


def test_claude_patterned_tools_grant_and_deny_only_matching_calls(
    write_md: Any, tmp_path: Path
) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "c.md",
        "---\nname: c\ndescription: d\ntools: Read, Bash(git diff:*)\ndisallowedTools: [Bash(rm:*)]\n---\n",
    )
    assert defn.tools == ("file_read", "shell")
    assert defn.tools_deny == ()  # only `rm` commands are denied, not the tool
    assert [r.text for r in defn.permissions.allow] == ["Read", "Bash(git diff:*)"]
    assert [r.text for r in defn.permissions.deny] == ["Bash(rm:*)"]
    assert defn.permissions.source == "definition c"
    assert not [w for w in defn.warnings if "pattern" in w]


def test_claude_bad_max_turns_is_invalid(write_md: Any, tmp_path: Path) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(write_md, tmp_path, "c.md", "---\nname: c\ndescription: d\nmaxTurns: many\n---\n")
    assert "maxTurns" in info.value.message


def test_claude_name_with_spaces_is_invalid(write_md: Any, tmp_path: Path) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(write_md, tmp_path, "c.md", "---\nname: Code Reviewer\ndescription: d\n---\n")
    assert "rule name-format" in info.value.message


# ---- python ----------------------------------------------------------------------------------


def test_agent_definition_makes_a_python_definition() -> None:
    defn = AgentDefinition(
        "joke-critic",
        "Scores a joke.",
        prompt="Score it.",
        tools=["Read"],
        model="haiku",
        max_turns=1,
        exit_tool_schema={"type": "object", "properties": {"score": {"type": "integer"}}},
    )
    assert defn.dialect is Dialect.PYTHON and not defn.templated
    assert defn.body == "Score it."
    assert defn.tools == ("file_read",)
    assert defn.path is None
    assert defn.declares_exit_schema


def test_agent_definition_applies_the_rules() -> None:
    with pytest.raises(DefinitionError) as info:
        AgentDefinition("x", "d", tools=["exit_tool"])
    assert "rule exit-tool-in-tools" in info.value.message


def test_agent_definition_rejects_body_and_prompt_together() -> None:
    with pytest.raises(DefinitionError, match="one-body"):
        AgentDefinition("x", "d", "body", prompt="prompt")


def test_registered_definitions_join_the_catalog(tmp_path: Path) -> None:
    register(AgentDefinition("coded", "Made in code.", "b"))
    catalog = load_catalog(tmp_path)
    assert catalog.get("coded").dialect is Dialect.PYTHON


def test_register_refuses_the_reserved_name() -> None:
    with pytest.raises(DefinitionError, match="reserved-name"):
        register(Definition(name="_default", description="d", body=""))


def test_config_definitions_load_as_python(tmp_path: Path) -> None:
    config = Config(
        subagents={"inline": {"description": "From config.", "body": "Hi", "tools": ["file_read"]}}
    )
    defn = load_catalog(tmp_path, config=config).get("inline")
    assert defn.dialect is Dialect.PYTHON
    assert defn.path == "config:subagents.inline"
    assert defn.tools == ("file_read",)


def test_config_definition_name_must_match_its_key(tmp_path: Path) -> None:
    config = Config(subagents={"inline": {"name": "other", "description": "d"}})
    catalog = load_catalog(tmp_path, config=config)
    assert "inline" not in catalog.definitions
    assert [(e.path, e.reason) for e in catalog.errors] == [
        ("config:subagents.inline", "name-mismatch")
    ]


def test_config_definition_with_unknown_key_is_reported(tmp_path: Path) -> None:
    config = Config(subagents={"inline": {"description": "d", "toolz": []}})
    catalog = load_catalog(tmp_path, config=config)
    assert catalog.errors[0].reason == "invalid-definition"
    assert "toolz" in catalog.errors[0].message


def test_definitions_pickle_and_stay_equal(fixtures_dir: Path) -> None:
    defn = load_file(fixtures_dir / "good" / "reviewer.md")
    assert pickle.loads(pickle.dumps(defn)) == defn


def test_effective_exit_schema_is_a_copy() -> None:
    defn = Definition(name="x", description="d", body="")
    defn.effective_exit_schema["properties"]["success"]["type"] = "string"
    assert defn.effective_exit_schema == DEFAULT_EXIT_SCHEMA
    assert DEFAULT_EXIT_SCHEMA["properties"]["success"] == {"type": "boolean"}


def test_value_objects_and_errors_pickle(fixtures_dir: Path) -> None:
    from clonefleet.definitions import InjectedSkill, LoadFailure, LoadWarning, RenderedClone
    from clonefleet.errors import TemplateError

    objects: list[Any] = [
        RenderedClone(
            index=1,
            task="t",
            instructions="i",
            skills=(InjectedSkill(name="s", body="b"),),
            job_id="sa_1",
        ),
        LoadFailure(path="p", reason="io-error", message="m"),
        LoadWarning(path=None, name="n", message="m"),
        TemplateError("boom", "template-limit", "p.md", "body"),
    ]
    for obj in objects:
        back = pickle.loads(pickle.dumps(obj))
        assert type(back) is type(obj) and repr(back) == repr(obj)
    assert str(pickle.loads(pickle.dumps(objects[-1]))) == "p.md: template-limit: boom"
