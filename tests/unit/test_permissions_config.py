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
