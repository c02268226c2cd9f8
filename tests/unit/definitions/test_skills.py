"""Skills (docs/definitions.md): discovery, the subagent's own policy, `@skill:` resolution before start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from clonefleet.config import Config, DiscoveryConfig
from clonefleet.definitions import (
    AgentDefinition,
    Definition,
    Dialect,
    InjectedSkill,
    find_skill_refs,
    load_skills,
    render_batch,
    resolve_skill_refs,
    skill_allowed,
)
from clonefleet.errors import DefinitionError


def _skill(write_md: Any, root: Path, name: str, body: str = "", **front: Any) -> Path:
    lines = [f"name: {name}", f"description: {front.pop('description', name + ' skill')}"]
    lines += [f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in front.items()]
    return write_md(
        root / name, "SKILL.md", "---\n" + "\n".join(lines) + "\n---\n" + (body or f"{name} body\n")
    )


@pytest.fixture
def project(write_md: Any, tmp_path: Path) -> Path:
    skills = tmp_path / ".clonefleet" / "skills"
    _skill(write_md, skills, "style", "Use short sentences.\n")
    _skill(write_md, skills, "secrets")
    _skill(write_md, skills, "manual", disable_model_invocation=True)
    return tmp_path


def test_skills_are_discovered_with_their_flags(project: Path) -> None:
    catalog = load_skills(project)
    assert catalog.names() == ["manual", "secrets", "style"]
    assert catalog.get("manual").disable_model_invocation
    assert catalog.get("style").body == "Use short sentences.\n"
    assert catalog.errors == []


def test_skill_layers_replace_by_name(write_md: Any, tmp_path: Path, xdg_home: Path) -> None:
    _skill(write_md, xdg_home / "clonefleet" / "skills", "style", "global\n")
    _skill(write_md, xdg_home / "clonefleet" / "skills", "only-global", "g\n")
    _skill(write_md, tmp_path / "extra", "style", "extra\n")
    _skill(write_md, tmp_path / ".clonefleet" / "skills", "style", "project\n")
    catalog = load_skills(tmp_path, [tmp_path / "extra"])
    assert catalog.get("style").body == "project\n"
    assert catalog.get("only-global").body == "g\n"
    assert load_skills(tmp_path / "x", [tmp_path / "extra"]).get("style").body == "extra\n"


def test_skill_flag_spellings(write_md: Any, tmp_path: Path) -> None:
    root = tmp_path / ".clonefleet" / "skills"
    write_md(
        root / "a",
        "SKILL.md",
        "---\nname: a\ndescription: d\ndisable-model-invocation: true\n---\nx",
    )
    write_md(
        root / "b",
        "SKILL.md",
        "---\nname: b\ndescription: d\nclonefleet:\n  disable_model_invocation: true\n---\nx",
    )
    write_md(root / "c", "skill.md", "---\ndescription: no name, lower-case file\n---\nx")
    catalog = load_skills(tmp_path)
    assert catalog.get("a").disable_model_invocation and catalog.get("b").disable_model_invocation
    assert catalog.get("c") is not None and not catalog.get("c").disable_model_invocation


def test_broken_skills_are_reported_per_skill(write_md: Any, tmp_path: Path) -> None:
    root = tmp_path / ".clonefleet" / "skills"
    write_md(root / "wrong", "SKILL.md", "---\nname: other\ndescription: d\n---\nx")
    write_md(
        root / "flag",
        "SKILL.md",
        "---\nname: flag\ndescription: d\ndisable_model_invocation: maybe\n---\nx",
    )
    write_md(root / "plain", "SKILL.md", "no frontmatter")
    _skill(write_md, root, "fine")
    catalog = load_skills(tmp_path)
    assert sorted((Path(e.path).parent.name, e.reason) for e in catalog.errors) == [
        ("flag", "invalid-definition"),
        ("plain", "missing-frontmatter"),
        ("wrong", "name-mismatch"),
    ]
    assert catalog.names() == ["fine"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_symlinked_skill_folders_follow_the_policy(write_md: Any, tmp_path: Path) -> None:
    _skill(write_md, tmp_path / "elsewhere", "linked")
    root = tmp_path / ".clonefleet" / "skills"
    root.mkdir(parents=True)
    (root / "linked").symlink_to(tmp_path / "elsewhere" / "linked")
    assert load_skills(tmp_path).get("linked") is None
    follow = Config(discovery=DiscoveryConfig(follow_symlinks_for_configs=True))
    assert load_skills(tmp_path, config=follow).get("linked") is not None


def test_policy_is_the_subagents_own() -> None:
    open_policy = AgentDefinition("a", "d")
    allow = AgentDefinition("b", "d", skills_allow=["style"])
    deny = AgentDefinition("c", "d", skills_deny=["secrets"])
    assert skill_allowed(open_policy, "anything")
    assert skill_allowed(allow, "style") and not skill_allowed(allow, "secrets")
    assert skill_allowed(deny, "style") and not skill_allowed(deny, "secrets")


def test_refs_are_found_in_order_without_duplicates() -> None:
    text = "Use @skill:style, then @skill:a.b-c. Again @skill:style; mail me@skill:nope"
    assert find_skill_refs(text) == ["style", "a.b-c"]


def test_resolution_injects_bodies_in_order(project: Path) -> None:
    defn = AgentDefinition("a", "d")
    skills = load_skills(project)
    assert resolve_skill_refs("@skill:secrets and @skill:style", defn, skills) == (
        InjectedSkill(name="secrets", body="secrets body\n"),
        InjectedSkill(name="style", body="Use short sentences.\n"),
    )


@pytest.mark.parametrize(
    ("defn_kwargs", "ref", "reason"),
    [
        ({"skills_deny": ["secrets"]}, "secrets", "skill-denied"),
        ({"skills_allow": ["style"]}, "secrets", "skill-denied"),
        ({}, "manual", "skill-model-invocation-disabled"),
        ({}, "ghost", "skill-unresolved"),
    ],
)
def test_bad_references_are_errors(
    project: Path, defn_kwargs: dict[str, Any], ref: str, reason: str
) -> None:
    defn = AgentDefinition("a", "d", **defn_kwargs)
    with pytest.raises(DefinitionError) as info:
        resolve_skill_refs(f"please use @skill:{ref}", defn, load_skills(project))
    assert info.value.reason == reason
    assert ref in info.value.message


def test_render_batch_injects_skills_and_rejects_bad_refs_before_start(project: Path) -> None:
    defn = Definition(
        name="n",
        description="d",
        dialect=Dialect.NATIVE,
        templated=True,
        body="{{ prompt }}",
        skills_deny=("secrets",),
    )
    common = {
        "count": 2,
        "batch_id": "b",
        "job_ids": ["j0", "j1"],
        "cwd": str(project),
        "model_names": ["m", "m"],
    }
    clones = render_batch(defn, prompt="Follow @skill:style", project_path=str(project), **common)
    assert [c.skills for c in clones] == [
        (InjectedSkill(name="style", body="Use short sentences.\n"),)
    ] * 2
    with pytest.raises(DefinitionError) as info:
        render_batch(
            defn,
            prompt="{% if clone.index == 1 %}@skill:secrets{% endif %}",
            project_path=str(project),
            **common,
        )
    assert info.value.reason == "skill-denied"


def test_render_batch_uses_a_given_skill_catalog(project: Path, tmp_path: Path) -> None:
    defn = AgentDefinition("a", "d")
    skills = load_skills(project)
    [clone] = render_batch(
        defn, prompt="@skill:style", count=1, batch_id="b", job_ids=["j"], cwd="/", project_path=str(tmp_path / "none"),
        model_names=["m"], skills=skills,
    )  # fmt: skip
    assert clone.skills[0].name == "style"
