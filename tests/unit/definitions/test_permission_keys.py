"""A definition's layer of the permission policy: patterned tool entries, `permissions`, spawning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clonefleet.definitions import AgentDefinition, Definition, load_file
from clonefleet.errors import DefinitionError


def _load(write_md: Any, tmp_path: Path, name: str, text: str) -> Definition:
    return load_file(write_md(tmp_path, f"{name}.md", text, dedent=False))


def texts(rules: Any) -> list[str]:
    return [r.text for r in rules]


def test_native_permissions_and_patterned_tools_make_the_layer(
    write_md: Any, tmp_path: Path
) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "rev",
        "---\nname: rev\ndescription: d\nclonefleet:\n"
        "  tools: [file_read, 'Bash(git diff:*)']\n"
        "  tools_deny: [file_write, 'Bash(git push:*)']\n"
        "  permissions:\n    allow: ['WebFetch(domain:docs.python.org)']\n"
        "    deny: ['Read(./secrets/**)']\n    default: deny\n---\nbody\n",
    )
    assert defn.tools == ("file_read", "shell")
    assert defn.tools_deny == ("file_write",)  # `git push` only: the tool stays
    rules = defn.permissions
    assert rules.source == "definition rev" and rules.default == "deny"
    assert texts(rules.allow) == [
        "file_read",
        "Bash(git diff:*)",
        "WebFetch(domain:docs.python.org)",
    ]
    assert texts(rules.deny) == ["file_write", "Bash(git push:*)", "Read(./secrets/**)"]
    assert [r.key for r in rules.allow] == [
        "clonefleet.tools",
        "clonefleet.tools",
        "clonefleet.permissions.allow",
    ]
    assert defn.tools_requested == ("file_read", "Bash(git diff:*)")


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        (
            "  permissions:\n    deny: ['Bash(']\n",
            "[rule permission-rule, key `clonefleet.permissions.deny`]",
        ),
        ("  tools: ['Read(/etc/**)']\n", "ambiguous"),
        ("  tools_deny: ['exit_tool(x)']\n", "rule permission-rule"),
        ("  permissions:\n    denny: [Bash]\n", "did you mean `clonefleet.permissions.deny`?"),
        ("  permissions:\n    default: maybe\n", "rule key-type"),
        ("  permissions: [Bash]\n", "rule key-type"),
        ("  permissions:\n    deny: [tool_search]\n", "tool_search cannot be denied"),
    ],
)
def test_a_native_definition_with_a_bad_rule_is_invalid(
    write_md: Any, tmp_path: Path, table: str, needle: str
) -> None:
    with pytest.raises(DefinitionError) as info:
        _load(write_md, tmp_path, "n", f"---\nname: n\ndescription: d\nclonefleet:\n{table}---\n")
    assert info.value.reason == "invalid-definition" and needle in info.value.message


def test_a_claude_file_with_a_bad_pattern_loads_without_granting_more(
    write_md: Any, tmp_path: Path
) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "c",
        "---\nname: c\ndescription: d\ntools: Read, Bash(/bin/ls)x, Glob(/etc/**)\n"
        "disallowedTools: [Read(/etc/**)]\n---\n",
    )
    assert defn.tools == ("file_read", "Bash(/bin/ls)x")  # not a pattern: an unknown tool
    assert texts(defn.permissions.deny) == ["Read"]  # an unreadable deny denies the whole tool
    assert defn.tools_deny == ("file_read",)
    text = "\n".join(defn.warnings)
    assert "the tool is not granted" in text and "all of file_read is denied" in text


def test_claude_permissions_read_allow_deny_and_deny_ask(write_md: Any, tmp_path: Path) -> None:
    defn = _load(
        write_md,
        tmp_path,
        "c",
        "---\nname: c\ndescription: d\npermissionMode: acceptEdits\npermissions:\n"
        "  allow: [Bash(npm test:*)]\n  deny: Bash(curl:*)\n  ask: [Bash(git push:*)]\n"
        "  defaultMode: plan\n---\n",
    )
    assert texts(defn.permissions.allow) == ["Bash(npm test:*)"]
    assert texts(defn.permissions.deny) == ["Bash(curl:*)", "Bash(git push:*)"]
    text = "\n".join(defn.warnings)
    assert "`permissionMode` is not supported" in text
    assert "`permissions.ask` rules deny" in text and "`permissions.defaultMode`" in text


def test_claude_permissions_of_the_wrong_shape_are_invalid(write_md: Any, tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="permissions.deny"):
        _load(
            write_md, tmp_path, "c", "---\nname: c\ndescription: d\npermissions:\n  deny: 3\n---\n"
        )


@pytest.mark.parametrize(
    ("keys", "spawns"),
    [
        ("tools: Read, Task\n", True),
        ("tools: [Agent]\n", True),
        ("tools: Read, Task(reviewer)\n", True),
        ("tools: Read, TaskList\n", False),
        ("tools: Read, Task\ndisallowedTools: Task\n", False),
        ("", False),
    ],
)
def test_a_claude_file_listing_its_subagent_tool_may_spawn(
    write_md: Any, tmp_path: Path, keys: str, spawns: bool
) -> None:
    defn = _load(write_md, tmp_path, "c", f"---\nname: c\ndescription: d\n{keys}---\n")
    assert defn.allow_subagent_spawn is spawns
    assert "subagent" not in defn.tools_deny


def test_agent_definition_takes_permissions() -> None:
    defn = AgentDefinition("a", "d", tools=["Bash(git:*)"], permissions={"deny": ["Bash(rm:*)"]})
    assert defn.tools == ("shell",)
    assert texts(defn.permissions.allow) == ["Bash(git:*)"]
    assert texts(defn.permissions.deny) == ["Bash(rm:*)"]
    with pytest.raises(DefinitionError, match="permission-rule"):
        AgentDefinition("a", "d", permissions={"allow": ["Read(../x)"]})
