"""Discovery order, replacement by name, config precedence, symlinks, `_default`, per-file failures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from clonefleet.config import Config, DiscoveryConfig
from clonefleet.definitions import SHIPPED_DIR, AgentDefinition, Dialect, load_catalog, register
from clonefleet.errors import DefinitionError


def _claude(description: str, name: str = "agent") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\nbody of {description}\n"


def _native(name: str, description: str = "native one") -> str:
    return f"---\nname: {name}\ndescription: {description}\nclonefleet: {{}}\n---\nbody\n"


def test_shipped_definitions_always_load(tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path)
    assert set(catalog.definitions) == {"_default", "general-purpose", "researcher"}
    assert catalog.errors == [] and catalog.warnings == []
    assert all(d.dialect is Dialect.NATIVE for d in catalog.definitions.values())
    assert catalog.definitions["_default"].tools is None
    assert catalog.definitions["_default"].inherit_tools


def test_listed_hides_default_and_sorts(tmp_path: Path) -> None:
    assert [d.name for d in load_catalog(tmp_path).listed()] == ["general-purpose", "researcher"]


def test_search_order_later_replaces_earlier(write_md: Any, tmp_path: Path, xdg_home: Path) -> None:
    extra1, extra2 = tmp_path / "extra1", tmp_path / "extra2"
    cli1, cli2 = tmp_path / "cli1", tmp_path / "cli2"
    project = tmp_path / "proj"
    layers = [
        xdg_home / "clonefleet" / "subagents",
        extra1,
        extra2,
        cli1,
        cli2,
        project / ".clonefleet" / "subagents",
    ]
    for i, folder in enumerate(layers):
        write_md(folder, "agent.md", _claude(f"layer{i}"))
        write_md(folder, f"only{i}.md", _claude(f"only{i}", name=f"only{i}"))
    config = Config(discovery=DiscoveryConfig(extra_subagents_dirs=(str(extra1), str(extra2))))
    catalog = load_catalog(project, [cli1, cli2], config)
    agent = catalog.get("agent")
    assert agent.description == "layer5"
    assert agent.shadows == tuple(str(folder / "agent.md") for folder in layers[:5])
    assert {f"only{i}" for i in range(6)} <= set(catalog.definitions)


@pytest.mark.parametrize("upto", range(1, 6))
def test_each_layer_beats_the_ones_before_it(
    write_md: Any, tmp_path: Path, xdg_home: Path, upto: int
) -> None:
    extra, cli, project = tmp_path / "extra", tmp_path / "cli", tmp_path / "proj"
    layers = [
        SHIPPED_DIR,
        xdg_home / "clonefleet" / "subagents",
        extra,
        cli,
        project / ".clonefleet" / "subagents",
    ]
    for i, folder in enumerate(layers[1:upto], start=1):
        write_md(folder, "researcher.md", _claude(f"layer{i}", name="researcher"))
    config = Config(discovery=DiscoveryConfig(extra_subagents_dirs=(str(extra),)))
    defn = load_catalog(project, [cli], config).get("researcher")
    expected = "Read-only research" if upto == 1 else f"layer{upto - 1}"
    assert defn.description.startswith(expected)


def test_config_entry_beats_every_file(write_md: Any, tmp_path: Path) -> None:
    write_md(tmp_path / ".clonefleet" / "subagents", "agent.md", _claude("from file"))
    register(AgentDefinition("agent", "from code"))
    config = Config(subagents={"agent": {"description": "from config"}})
    defn = load_catalog(tmp_path, config=config).get("agent")
    assert defn.description == "from config"
    assert defn.shadows[0].endswith("agent.md")
    assert "python definition 'agent'" in defn.shadows[1]


def test_registered_code_definition_beats_files(write_md: Any, tmp_path: Path) -> None:
    write_md(tmp_path / ".clonefleet" / "subagents", "agent.md", _claude("from file"))
    register(AgentDefinition("agent", "from code"))
    assert load_catalog(tmp_path).get("agent").description == "from code"


def test_relative_extra_dirs_resolve_against_the_config_file(write_md: Any, tmp_path: Path) -> None:
    write_md(tmp_path / "cfg" / "agents", "rel.md", _claude("relative", name="rel"))
    config = Config(
        discovery=DiscoveryConfig(extra_subagents_dirs=("agents",)),
        path=str(tmp_path / "cfg" / "c.yaml"),
    )
    assert load_catalog(tmp_path / "elsewhere", config=config).get("rel").description == "relative"


def test_missing_folders_are_skipped(tmp_path: Path) -> None:
    config = Config(discovery=DiscoveryConfig(extra_subagents_dirs=(str(tmp_path / "nope"),)))
    catalog = load_catalog(tmp_path / "no-project", [tmp_path / "missing"], config)
    assert catalog.errors == []
    assert set(catalog.definitions) == {"_default", "general-purpose", "researcher"}
    assert {w.message for w in catalog.warnings} == {"folder does not exist; skipped"}


def test_a_file_given_as_folder_is_an_io_error(write_md: Any, tmp_path: Path) -> None:
    path = write_md(tmp_path, "x.md", _claude("x"))
    catalog = load_catalog(tmp_path / "proj", [path])
    assert [(e.path, e.reason) for e in catalog.errors] == [(str(path), "io-error")]


def test_reading_is_non_recursive_and_md_is_case_insensitive(write_md: Any, tmp_path: Path) -> None:
    folder = tmp_path / ".clonefleet" / "subagents"
    write_md(folder, "upper.MD", _claude("upper", name="upper"))
    write_md(folder, "mixed.Md", _claude("mixed", name="mixed"))
    write_md(folder, "notes.txt", _claude("txt", name="txt"))
    write_md(folder / "nested", "deep.md", _claude("deep", name="deep"))
    catalog = load_catalog(tmp_path)
    assert {"upper", "mixed"} <= set(catalog.definitions)
    assert not {"txt", "deep"} & set(catalog.definitions)


def test_native_file_name_with_uppercase_md_extension(write_md: Any, tmp_path: Path) -> None:
    write_md(tmp_path / ".clonefleet" / "subagents", "shout.MD", _native("shout"))
    assert load_catalog(tmp_path).get("shout").dialect is Dialect.NATIVE


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_symlinks_are_skipped_unless_followed(write_md: Any, tmp_path: Path) -> None:
    target = write_md(tmp_path / "elsewhere", "linked.md", _claude("linked", name="linked"))
    folder = tmp_path / ".clonefleet" / "subagents"
    folder.mkdir(parents=True)
    (folder / "linked.md").symlink_to(target)
    skipped = load_catalog(tmp_path)
    assert "linked" not in skipped.definitions
    assert any("symbolic link skipped" in w.message for w in skipped.warnings)
    follow = Config(discovery=DiscoveryConfig(follow_symlinks_for_configs=True))
    assert load_catalog(tmp_path, config=follow).get("linked").description == "linked"


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_dangling_symlink_is_an_io_error_when_followed(tmp_path: Path) -> None:
    folder = tmp_path / ".clonefleet" / "subagents"
    folder.mkdir(parents=True)
    (folder / "gone.md").symlink_to(tmp_path / "missing.md")
    follow = Config(discovery=DiscoveryConfig(follow_symlinks_for_configs=True))
    catalog = load_catalog(tmp_path, config=follow)
    assert [e.reason for e in catalog.errors] == ["io-error"]


@pytest.mark.parametrize("text", [_native("_default"), _claude("sneaky", name="_default")])
def test_default_cannot_be_overridden_from_disk(write_md: Any, tmp_path: Path, text: str) -> None:
    write_md(tmp_path / ".clonefleet" / "subagents", "_default.md", text)
    catalog = load_catalog(tmp_path)
    assert catalog.get("_default").path == str(SHIPPED_DIR / "_default.md")
    assert catalog.get("_default").shadows == ()
    assert [e.reason for e in catalog.errors] == ["invalid-definition"]
    assert "rule reserved-name" in catalog.errors[0].message


def test_default_cannot_be_overridden_from_config(tmp_path: Path) -> None:
    catalog = load_catalog(tmp_path, config=Config(subagents={"_default": {"description": "x"}}))
    assert catalog.get("_default").path == str(SHIPPED_DIR / "_default.md")
    assert "reserved-name" in catalog.errors[0].message


def test_name_collision_within_one_folder(write_md: Any, tmp_path: Path, xdg_home: Path) -> None:
    write_md(xdg_home / "clonefleet" / "subagents", "twin.md", _claude("global twin", name="twin"))
    folder = tmp_path / ".clonefleet" / "subagents"
    a = write_md(folder, "a.md", _claude("a", name="twin"))
    b = write_md(folder, "b.md", _claude("b", name="twin"))
    catalog = load_catalog(tmp_path)
    assert sorted((e.path, e.reason) for e in catalog.errors) == [
        (str(a), "name-collision"),
        (str(b), "name-collision"),
    ]
    assert catalog.get("twin").description == "global twin"


def test_same_name_in_different_folders_is_not_a_collision(write_md: Any, tmp_path: Path) -> None:
    write_md(tmp_path / "one", "x.md", _claude("one", name="x"))
    write_md(tmp_path / "two", "x.md", _claude("two", name="x"))
    catalog = load_catalog(tmp_path, [tmp_path / "one", tmp_path / "two"])
    assert catalog.errors == []
    assert catalog.get("x").description == "two"


def test_every_broken_file_is_reported_and_the_rest_loads(write_md: Any, tmp_path: Path) -> None:
    folder = tmp_path / ".clonefleet" / "subagents"
    write_md(folder, "good.md", _claude("good", name="good"))
    write_md(folder, "readme.md", "# not a definition\n")
    write_md(folder, "unclosed.md", "---\nname: x\n")
    write_md(folder, "mismatch.md", _native("other"))
    write_md(
        folder,
        "invalid.md",
        "---\nname: invalid\ndescription: d\nclonefleet:\n  tools: [exit_tool]\n---\n",
    )
    (folder / "binary.md").write_bytes(b"\xff\xfe\x00")
    catalog = load_catalog(tmp_path)
    reasons = {Path(e.path).name: e.reason for e in catalog.errors}
    assert reasons == {
        "readme.md": "missing-frontmatter",
        "unclosed.md": "invalid-frontmatter",
        "mismatch.md": "name-mismatch",
        "invalid.md": "invalid-definition",
        "binary.md": "io-error",
    }
    assert catalog.get("good").description == "good"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads everything")
def test_unreadable_file_is_an_io_error(write_md: Any, tmp_path: Path) -> None:
    path = write_md(
        tmp_path / ".clonefleet" / "subagents", "locked.md", _claude("locked", name="locked")
    )
    path.chmod(0)
    try:
        assert [e.reason for e in load_catalog(tmp_path).errors] == ["io-error"]
    finally:
        path.chmod(0o644)


def test_edits_take_effect_only_on_reload(write_md: Any, tmp_path: Path) -> None:
    folder = tmp_path / ".clonefleet" / "subagents"
    path = write_md(folder, "agent.md", _claude("before"))
    catalog = load_catalog(tmp_path)
    path.write_text(_claude("after"), encoding="utf-8")
    write_md(folder, "new.md", _claude("new", name="new"))
    assert catalog.get("agent").description == "before"
    assert "new" not in catalog.definitions
    fresh = catalog.reload()
    assert fresh.get("agent").description == "after"
    assert fresh.get("new").description == "new"
    assert catalog.get("agent").description == "before"


def test_unknown_agent_lists_the_available_ones(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError) as info:
        load_catalog(tmp_path).get("reseacher")
    assert info.value.reason == "unknown-agent"
    assert "available agents: general-purpose, researcher" in info.value.message
    assert "did you mean 'researcher'" in info.value.message
    assert "_default" not in info.value.message


def test_get_of_a_file_that_failed_names_the_failure(write_md: Any, tmp_path: Path) -> None:
    write_md(tmp_path / ".clonefleet" / "subagents", "broken.md", "---\nname: broken\n")
    with pytest.raises(DefinitionError) as info:
        load_catalog(tmp_path).get("broken")
    assert info.value.reason == "invalid-frontmatter"
    assert "did not load" in info.value.message and "available agents" in info.value.message


def test_a_folder_given_twice_counts_once_at_its_last_position(
    write_md: Any, tmp_path: Path
) -> None:
    project = tmp_path / ".clonefleet" / "subagents"
    write_md(project, "agent.md", _claude("project"))
    write_md(tmp_path / "cli", "agent.md", _claude("cli"))
    catalog = load_catalog(tmp_path, [project, tmp_path / "cli"])
    assert catalog.get("agent").description == "project"
    assert catalog.get("agent").shadows == (str(tmp_path / "cli" / "agent.md"),)
