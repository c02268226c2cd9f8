"""The config's `permissions` section (docs/permissions.md): schema and errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from clonefleet.config import Config, load_config
from clonefleet.errors import ConfigError


def test_the_section_becomes_the_config_layer() -> None:
    config = Config(
        permissions={"allow": ["Read(./src/**)"], "deny": ["Bash(rm:*)"], "default": "deny"}
    )
    rules = config.permissions.rule_set()
    assert rules.source == "config" and rules.default == "deny"
    assert [(r.text, r.key) for r in rules.deny] == [("Bash(rm:*)", "permissions.deny")]
    assert Config().permissions.rule_set().is_empty


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ("permissions:\n  deny: ['Bash(']\n", "permissions.deny", "entry 1"),
        ("permissions:\n  allow: [Read, 'Read(/etc/**)']\n", "permissions.allow", "entry 2"),
        ("permissions:\n  deny: [progress_update]\n", "permissions.deny", "cannot be denied"),
        ("permissions:\n  default: ask\n", "permissions.default", "allow"),
        ("permissions:\n  alow: [Read]\n", "permissions.alow", "Extra inputs"),
    ],
)
def test_a_bad_rule_is_a_config_error_naming_the_key(
    tmp_path: Path, text: str, key: str, needle: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == key and needle in info.value.message


def test_a_projects_config_narrows_the_users_own_rules_and_cannot_drop_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clonefleet.definitions import AgentDefinition
    from clonefleet.errors import ToolRetry
    from clonefleet.planning import clone_tools

    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("CLONEFLEET_CONFIG", raising=False)
    own = tmp_path / "XDG_CONFIG_HOME" / "clonefleet"
    own.mkdir()
    (own / "config.yaml").write_text("permissions:\n  deny: ['Bash(rm:*)']\n")
    project = tmp_path / "project"
    (project / ".clonefleet").mkdir(parents=True)
    # The project's config allows everything and denies something else of its own.
    (project / ".clonefleet" / "config.yaml").write_text(
        "permissions:\n  allow: [Bash]\n  deny: ['Bash(curl:*)']\n"
    )
    config = load_config(cwd=project)
    assert config.source.kind == "project"
    policy = clone_tools(AgentDefinition("a", "d"), config, project).policy
    with pytest.raises(ToolRetry, match=r"Bash\(rm:\*\) \(your config permissions.deny\)"):
        policy.check("shell", {"command": "rm -rf data"})
    with pytest.raises(ToolRetry, match=r"Bash\(curl:\*\) \(config permissions.deny\)"):
        policy.check("shell", {"command": "curl example.com"})
    policy.check("shell", {"command": "ls"})
    # Without a project's config the user's own rules are the one config layer.
    assert [layer.source for layer in load_config(cwd=tmp_path).permission_layers()] == ["config"]
