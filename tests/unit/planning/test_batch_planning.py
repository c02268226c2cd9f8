"""Planning a batch: tools, skills the `skill` tool may load, inherit_tools, cwd approval."""

from __future__ import annotations

from pathlib import Path

import pytest

from clonefleet.config import Config
from clonefleet.definitions import load_catalog, load_skills
from clonefleet.errors import UsageError
from clonefleet.planning import BatchRequest, plan_specs

AGENT = """---
name: writer
description: Writes.
clonefleet:
  tools: [file_read, Write]
  skills_deny: [secret]
---
Write: {{ prompt }}
"""
INHERITOR = """---
name: inheritor
description: Inherits the caller's tools.
clonefleet:
  tools: [grep]
  inherit_tools: true
  tools_deny: [shell]
---
x
"""


def skill(root: Path, name: str, body: str, disabled: bool = False) -> None:
    folder = root / ".clonefleet" / "skills" / name
    folder.mkdir(parents=True)
    extra = "disable_model_invocation: true\n" if disabled else ""
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {name} skill\n{extra}---\n{body}\n"
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "writer.md").write_text(AGENT)
    (agents / "inheritor.md").write_text(INHERITOR)
    skill(tmp_path, "style", "STYLE-BODY")
    skill(tmp_path, "secret", "SECRET-BODY")
    skill(tmp_path, "manual", "MANUAL-BODY", disabled=True)
    return tmp_path


def plan(project: Path, agent: str, **kw):
    config = Config()
    catalog = load_catalog(project, (), config)
    skills = load_skills(project, (), config)
    req = BatchRequest(agent=agent, prompt="go", **kw)
    return plan_specs(
        req,
        catalog,
        config,
        batch_id="b_1",
        job_ids=["sa_00000001"],
        caller_cwd=project,
        skills=skills,
    )


def test_skill_tool_gets_only_skills_the_definitions_policy_allows(project):
    (spec,) = plan(project, "writer")
    assert [name for name, _, _ in spec.available_skills] == ["style"]
    assert spec.tools == ("file_read", "file_write")  # the claude alias Write is mapped


def test_skill_reference_in_the_prompt_is_injected_and_a_denied_one_refused(project):
    from clonefleet.errors import DefinitionError

    config = Config()
    catalog, skills = load_catalog(project, (), config), load_skills(project, (), config)
    (spec,) = plan_specs(
        BatchRequest(agent="writer", prompt="use @skill:style"),
        catalog,
        config,
        batch_id="b",
        job_ids=["sa_1"],
        caller_cwd=project,
        skills=skills,
    )
    assert [(n, b.strip()) for n, b in spec.skills] == [("style", "STYLE-BODY")]
    with pytest.raises(DefinitionError):
        plan_specs(
            BatchRequest(agent="writer", prompt="use @skill:secret"),
            catalog,
            config,
            batch_id="b",
            job_ids=["sa_2"],
            caller_cwd=project,
            skills=skills,
        )


def test_inherit_tools_unions_the_callers_tools_minus_denied_and_switch_facet(project):
    config = Config()
    catalog = load_catalog(project, (), config)
    req = BatchRequest(agent="inheritor", prompt="x")
    (spec,) = plan_specs(
        req,
        catalog,
        config,
        batch_id="b",
        job_ids=["sa_3"],
        caller_cwd=project,
        caller_tools=("file_read", "shell", "switch_facet"),
    )
    assert spec.tools == ("grep", "file_read")


def test_cwd_outside_the_callers_directory_needs_approval(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(UsageError, match="--allow-chdir"):
        plan(project, "writer", cwd=str(outside))
    (spec,) = plan(project, "writer", cwd=str(outside), approve_chdir=True)
    assert spec.cwd == str(outside.resolve())
    with pytest.raises(UsageError, match="not an existing directory"):
        plan(project, "writer", cwd="missing")
