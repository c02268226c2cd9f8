"""Every validation rule of docs/definitions.md: rejected at load with `invalid-definition` naming the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clonefleet.definitions import Definition, load_catalog, load_file
from clonefleet.errors import DefinitionError


def _native(
    write_md: Any, tmp_path: Path, body: str, name: str = "agent", folder: Path | None = None
) -> Path:
    text = f"---\nname: {name}\ndescription: A test agent.\nclonefleet:\n{body}---\nTask: {{{{ prompt }}}}\n"
    return write_md(folder or tmp_path / "defs", f"{name}.md", text, dedent=False)


def _rejected(write_md: Any, tmp_path: Path, body: str) -> DefinitionError:
    path = _native(write_md, tmp_path, body)
    with pytest.raises(DefinitionError) as info:
        load_file(path)
    assert info.value.reason == "invalid-definition"
    return info.value


def _loads(write_md: Any, tmp_path: Path, body: str) -> Definition:
    defn = load_file(_native(write_md, tmp_path, body))
    assert defn.name == "agent" and defn.dialect == "native"
    return defn


def test_exit_tool_in_tools(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  tools: [file_read, exit_tool]\n")
    assert "[rule exit-tool-in-tools, key `clonefleet.tools`]" in err.message


def test_switch_facet_in_tools(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  tools: [switch_facet]\n")
    assert "[rule switch-facet-listed, key `clonefleet.tools`]" in err.message


def test_switch_facet_in_undeferred_tools(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(
        write_md, tmp_path, "  inherit_tools: true\n  undeferred_tools: [switch_facet]\n"
    )
    assert "[rule switch-facet-listed, key `clonefleet.undeferred_tools`]" in err.message


@pytest.mark.parametrize("ref", ["tag!ALL", "tag!read_only"])
def test_tools_deny_with_tag_reference(write_md: Any, tmp_path: Path, ref: str) -> None:
    err = _rejected(write_md, tmp_path, f"  tools_deny: ['{ref}']\n")
    assert "rule tools-deny-tag" in err.message
    assert err.field == "clonefleet.tools_deny"


def test_tools_deny_with_mcp_server_shorthand(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  tools_deny: [mcp__github]\n")
    assert "rule tools-deny-mcp-shorthand" in err.message


def test_tools_deny_with_full_mcp_name_is_fine(write_md: Any, tmp_path: Path) -> None:
    defn = _loads(write_md, tmp_path, "  tools_deny: [mcp__github__delete_repo]\n")
    assert defn.tools_deny == ("mcp__github__delete_repo",)
    assert defn.tools is None and defn.warnings == ()


@pytest.mark.parametrize(
    "tool",
    [
        "exit_tool",
        "progress_update",
        "job_status",
        "job_result",
        "job_cancel",
        "job_block",
        "list_jobs",
        "tool_search",
        "subagent",
        "skill",
    ],
)
def test_tools_deny_with_protected_tool(write_md: Any, tmp_path: Path, tool: str) -> None:
    err = _rejected(write_md, tmp_path, f"  tools_deny: [{tool}]\n")
    assert "rule tools-deny-protected" in err.message
    assert repr(tool) in err.message


def test_tool_both_denied_and_undeferred(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(
        write_md,
        tmp_path,
        "  tools: [file_read, grep]\n  tools_deny: [grep]\n  undeferred_tools: [grep]\n",
    )
    assert "[rule deny-and-undeferred, key `clonefleet.undeferred_tools`]" in err.message


def test_undeferred_tools_with_tag_reference(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  inherit_tools: true\n  undeferred_tools: ['tag!ALL']\n")
    assert "rule undeferred-tag" in err.message


def test_undeferred_tool_not_in_tools(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  tools: [file_read]\n  undeferred_tools: [grep]\n")
    assert "[rule undeferred-not-granted, key `clonefleet.undeferred_tools`]" in err.message
    assert "'grep'" in err.message


@pytest.mark.parametrize(
    ("body", "tools", "undeferred", "warns"),
    [
        (
            "  inherit_tools: true\n  tools: [file_read]\n  undeferred_tools: [grep]\n",
            ("file_read",),
            ("grep",),
            False,
        ),
        ("  tools: ['tag!ALL']\n  undeferred_tools: [grep]\n", ("tag!ALL",), ("grep",), False),
        (
            "  tools: ['tag!ALL_MCP', file_read]\n  undeferred_tools: [grep]\n",
            ("tag!ALL_MCP", "file_read"),
            ("grep",),
            False,
        ),
        # A bare MCP server name is not a tool clonefleet knows: it loads, with a warning.
        ("  tools: [mcp__github]\n  undeferred_tools: [grep]\n", ("mcp__github",), ("grep",), True),
        (
            "  tools: [file_read]\n  undeferred_tools: [progress_update, tool_search]\n",
            ("file_read",),
            ("progress_update", "tool_search"),
            False,
        ),
        ("  undeferred_tools: [grep]\n", None, ("grep",), False),
    ],
    ids=["inherit", "tag-all", "tag-all-mcp", "mcp-server", "control-tools", "tools-absent"],
)
def test_undeferred_subset_rule_does_not_apply(
    write_md: Any, tmp_path: Path, body: str, tools: Any, undeferred: Any, warns: bool
) -> None:
    defn = _loads(write_md, tmp_path, body)
    assert (defn.tools, defn.undeferred_tools) == (tools, undeferred)
    assert defn.inherit_tools is body.startswith("  inherit_tools: true")
    assert [("'mcp__github'" in w) for w in defn.warnings] == ([True] if warns else [])


def test_spawn_tools_may_be_undeferred_when_spawning_is_allowed(
    write_md: Any, tmp_path: Path
) -> None:
    defn = _loads(
        write_md,
        tmp_path,
        "  tools: [file_read]\n  allow_subagent_spawn: true\n  undeferred_tools: [subagent]\n",
    )
    assert defn.allow_subagent_spawn is True
    assert (defn.tools, defn.undeferred_tools, defn.warnings) == (("file_read",), ("subagent",), ())
    err = _rejected(write_md, tmp_path, "  tools: [file_read]\n  undeferred_tools: [subagent]\n")
    assert "rule undeferred-not-granted" in err.message


def test_exit_schema_that_is_not_json_schema(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  exit_tool_schema: {type: objekt}\n")
    assert "rule exit-schema-invalid" in err.message
    assert "Draft 2020-12" in err.message
    assert err.field == "clonefleet.exit_tool_schema"


def test_exit_schema_with_wrong_keyword_type(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  exit_tool_schema: {type: object, required: yes}\n")
    assert "rule exit-schema-invalid" in err.message


@pytest.mark.parametrize(
    "ref",
    ["https://example.com/schema.json", "other.json#/defs/x", "file:///etc/passwd", "/abs/path"],
)
def test_exit_schema_with_ref_outside_the_document(write_md: Any, tmp_path: Path, ref: str) -> None:
    err = _rejected(
        write_md,
        tmp_path,
        f"  exit_tool_schema:\n    type: object\n    properties:\n      x: {{$ref: '{ref}'}}\n",
    )
    assert "rule exit-schema-ref" in err.message
    assert "outside the schema document" in err.message


def test_exit_schema_with_dangling_internal_ref(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(
        write_md,
        tmp_path,
        "  exit_tool_schema:\n    properties:\n      x: {$ref: '#/$defs/missing'}\n",
    )
    assert "rule exit-schema-ref" in err.message


def test_exit_schema_with_internal_refs_and_anchors_loads(write_md: Any, tmp_path: Path) -> None:
    defn = _loads(
        write_md,
        tmp_path,
        "  exit_tool_schema:\n    type: object\n    properties:\n      a: {$ref: '#/$defs/a'}\n"
        "      b: {$ref: '#thing'}\n      c: {$ref: '#'}\n"
        "    $defs:\n      a: {type: string}\n      b: {$anchor: thing, type: integer}\n",
    )
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/a"}, "b": {"$ref": "#thing"}, "c": {"$ref": "#"}},
        "$defs": {"a": {"type": "string"}, "b": {"$anchor": "thing", "type": "integer"}},
    }
    assert defn.exit_tool_schema == schema and defn.effective_exit_schema == schema
    assert defn.warnings == ()


def test_model_group_needs_a_name(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  model: '@mg:'\n")
    assert "rule model-format" in err.message


def test_several_broken_rules_are_all_named(write_md: Any, tmp_path: Path) -> None:
    err = _rejected(write_md, tmp_path, "  tools: [exit_tool]\n  tools_deny: [skill]\n")
    assert "exit-tool-in-tools" in err.message and "tools-deny-protected" in err.message


def test_rules_apply_to_claude_files_with_their_key_names(write_md: Any, tmp_path: Path) -> None:
    path = write_md(
        tmp_path / "defs", "c.md", "---\nname: c\ndescription: d\ndisallowedTools: [skill]\n---\n"
    )
    with pytest.raises(DefinitionError) as info:
        load_file(path)
    assert "[rule tools-deny-protected, key `disallowedTools`]" in info.value.message


# ---- the enum warning ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["status", "kind", "outcome"])
def test_status_enum_outside_the_families_warns(write_md: Any, tmp_path: Path, field: str) -> None:
    path = _native(
        write_md,
        tmp_path,
        "  exit_tool_schema:\n    type: object\n    properties:\n"
        f"      {field}: {{type: string, enum: [Done, shipped]}}\n",
    )
    defn = load_file(path)
    assert len(defn.warnings) == 1
    assert f"property `{field}`" in defn.warnings[0]
    assert "'shipped'" in defn.warnings[0] and "'Done'" not in defn.warnings[0]


def test_recognised_enum_values_do_not_warn(write_md: Any, tmp_path: Path) -> None:
    path = _native(
        write_md,
        tmp_path,
        "  exit_tool_schema:\n    type: object\n    properties:\n"
        "      status: {enum: [OK, failed, Canceled, cancel, completed]}\n      other: {enum: [weird]}\n",
    )
    assert load_file(path).warnings == ()


def test_enum_behind_a_local_ref_and_const_are_checked(write_md: Any, tmp_path: Path) -> None:
    path = _native(
        write_md,
        tmp_path,
        "  exit_tool_schema:\n    type: object\n    properties:\n      status: {$ref: '#/$defs/s'}\n"
        "      kind: {const: approved}\n    $defs:\n      s: {enum: [pending]}\n",
    )
    text = " ".join(load_file(path).warnings)
    assert "'pending'" in text and "'approved'" in text


def test_enum_warning_reaches_catalog_and_reload(write_md: Any, tmp_path: Path) -> None:
    body = "  exit_tool_schema:\n    properties:\n      status: {enum: [weird]}\n"
    _native(write_md, tmp_path, body, name="odd", folder=tmp_path / ".clonefleet" / "subagents")
    catalog = load_catalog(tmp_path)
    assert [(w.name, "'weird'" in w.message) for w in catalog.warnings] == [("odd", True)]
    assert [(w.name, "'weird'" in w.message) for w in catalog.reload().warnings] == [("odd", True)]


def test_claude_names_of_undeniable_tools_in_disallowed_tools_warn(
    write_md: Any, tmp_path: Path
) -> None:
    # Claude Code names that map onto tools every subagent keeps are ignored with a warning,
    # so a file written for Claude Code still loads.
    text = (
        "---\nname: c\ndescription: d\n"
        "disallowedTools: [Skill, SlashCommand, TaskList, TaskGet, TaskOutput, TaskUpdate, Bash]\n"
        "---\n"
    )
    path = write_md(tmp_path / "defs", "c.md", text)
    defn = load_file(path)
    assert defn.tools_deny == ("shell",)
    ignored = [w for w in defn.warnings if "is ignored" in w and "cannot be denied" in w]
    assert len(ignored) == 6
