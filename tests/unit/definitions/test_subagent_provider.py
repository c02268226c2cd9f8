"""The ``subagent_provider`` key (``spawn`` or ``fork``) in every dialect, and where a clone's
provider comes from: the definition's key, else the config's top-level key, else ``spawn``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clonefleet.config import Config
from clonefleet.definitions import AgentDefinition, load_catalog, load_file
from clonefleet.errors import DefinitionError
from clonefleet.planning import BatchRequest, plan_specs

NATIVE = """
---
name: {name}
description: A reviewer.
clonefleet:
  allow_subagent_spawn: {spawn}
{extra}
---
Review.
"""

CLAUDE = """
---
name: {name}
description: A reviewer.
tools: Read, Task
{extra}
---
Review.
"""


def native(write_md: Any, tmp_path: Path, extra: str, spawn: str = "true") -> Any:
    text = NATIVE.format(name="rev", spawn=spawn, extra=extra)
    return load_file(write_md(tmp_path / "defs", "rev.md", text))


def test_a_native_definition_names_its_provider(write_md: Any, tmp_path: Path) -> None:
    assert native(write_md, tmp_path, "  subagent_provider: fork").subagent_provider == "fork"
    assert native(write_md, tmp_path, "  subagent_provider: spawn").subagent_provider == "spawn"
    defn = native(write_md, tmp_path, "")
    assert defn.subagent_provider is None and not defn.warnings


def test_a_native_provider_other_than_spawn_or_fork_is_refused(write_md: Any, tmp_path: Path):
    with pytest.raises(DefinitionError) as err:
        native(write_md, tmp_path, "  subagent_provider: clone")
    assert "subagent_provider" in str(err.value)


def test_a_provider_without_spawning_is_a_warning(write_md: Any, tmp_path: Path) -> None:
    defn = native(write_md, tmp_path, "  subagent_provider: fork", spawn="false")
    assert any("`clonefleet.subagent_provider` has no effect" in w for w in defn.warnings)


def test_a_claude_file_takes_the_key_and_checks_it(write_md: Any, tmp_path: Path) -> None:
    text = CLAUDE.format(name="rev", extra="subagent_provider: fork")
    defn = load_file(write_md(tmp_path / "defs", "rev.md", text))
    assert defn.allow_subagent_spawn and defn.subagent_provider == "fork"
    assert not any("subagent_provider" in w for w in defn.warnings)  # a known key, not extra
    bad = CLAUDE.format(name="bad", extra="subagent_provider: maybe")
    with pytest.raises(DefinitionError, match="`subagent_provider` must be `spawn` or `fork`"):
        load_file(write_md(tmp_path / "defs", "bad.md", bad))


def test_code_and_config_definitions_take_the_key() -> None:
    made = AgentDefinition(
        "rev", "A reviewer.", allow_subagent_spawn=True, subagent_provider="fork"
    )
    assert made.subagent_provider == "fork"
    with pytest.raises(DefinitionError):
        AgentDefinition("rev", "A reviewer.", subagent_provider="sometimes")


@pytest.mark.parametrize(
    ("key", "config", "expected"),
    [
        ("", {}, "spawn"),
        ("", {"subagent_provider": "fork"}, "fork"),
        ("  subagent_provider: spawn", {"subagent_provider": "fork"}, "spawn"),
        ("  subagent_provider: fork", {}, "fork"),
    ],
)
def test_the_definition_wins_over_the_config_and_spawn_is_the_default(
    write_md: Any, tmp_path: Path, key: str, config: dict[str, Any], expected: str
) -> None:
    native(write_md, tmp_path / ".clonefleet", key)  # writes .clonefleet/defs/rev.md
    folder = tmp_path / ".clonefleet" / "subagents"
    folder.mkdir(parents=True)
    (tmp_path / ".clonefleet" / "defs" / "rev.md").rename(folder / "rev.md")
    cfg = Config(**config)
    (spec,) = plan_specs(
        BatchRequest(agent="rev", prompt="look"),
        load_catalog(tmp_path, (), cfg),
        cfg,
        batch_id="b_00000001",
        job_ids=["sa_00000001"],
        caller_cwd=tmp_path,
    )
    assert spec.subagent_provider == expected


def test_the_config_key_takes_only_spawn_or_fork() -> None:
    assert Config().subagent_provider == "spawn"
    with pytest.raises(Exception, match="subagent_provider"):
        Config(subagent_provider="both")
