"""Subagent definitions: loading the three dialects, discovery, validation, templating and skills.

Pure and Ray-free. The pipeline is ``parse`` (file → frontmatter + body), ``build`` (validated
:class:`Definition`), ``load_catalog`` (discovery and precedence), then ``render_batch`` (the
launch metadata of every clone, rendered in a guarded Jinja2 sandbox before anything starts).
"""

from __future__ import annotations

from clonefleet.definitions._catalog import SHIPPED_DIR as SHIPPED_DIR
from clonefleet.definitions._catalog import Catalog as Catalog
from clonefleet.definitions._catalog import discover as discover
from clonefleet.definitions._catalog import load_catalog as load_catalog
from clonefleet.definitions._catalog import load_directory as load_directory
from clonefleet.definitions._catalog import load_file as load_file
from clonefleet.definitions._catalog import subagent_search_path as subagent_search_path
from clonefleet.definitions._definition import DEFAULT_EXIT_SCHEMA as DEFAULT_EXIT_SCHEMA
from clonefleet.definitions._definition import RESERVED_NAME as RESERVED_NAME
from clonefleet.definitions._definition import CloneInfo as CloneInfo
from clonefleet.definitions._definition import Definition as Definition
from clonefleet.definitions._definition import Dialect as Dialect
from clonefleet.definitions._definition import InjectedSkill as InjectedSkill
from clonefleet.definitions._definition import LoadFailure as LoadFailure
from clonefleet.definitions._definition import LoadReason as LoadReason
from clonefleet.definitions._definition import LoadWarning as LoadWarning
from clonefleet.definitions._definition import RenderedClone as RenderedClone
from clonefleet.definitions._exit_schema import check_exit_schema as check_exit_schema
from clonefleet.definitions._exit_schema import (
    exit_schema_enum_warnings as exit_schema_enum_warnings,
)
from clonefleet.definitions._parse import parse_text as parse_text
from clonefleet.definitions._python import AgentDefinition as AgentDefinition
from clonefleet.definitions._python import register as register
from clonefleet.definitions._python import registered as registered
from clonefleet.definitions._python import unregister as unregister
from clonefleet.definitions._report import agents_report as agents_report
from clonefleet.definitions._report import validate_lines as validate_lines
from clonefleet.definitions._report import validate_report as validate_report
from clonefleet.definitions._skills import Skill as Skill
from clonefleet.definitions._skills import SkillCatalog as SkillCatalog
from clonefleet.definitions._skills import find_skill_refs as find_skill_refs
from clonefleet.definitions._skills import load_skills as load_skills
from clonefleet.definitions._skills import resolve_skill_refs as resolve_skill_refs
from clonefleet.definitions._skills import skill_allowed as skill_allowed
from clonefleet.definitions._tool_report import Effective as Effective
from clonefleet.definitions._tool_report import definition_tools as definition_tools
from clonefleet.definitions._tool_report import tool_resolution as tool_resolution
from clonefleet.definitions._trust import trust_lines as trust_lines
from clonefleet.definitions._trust import trust_report as trust_report
from clonefleet.definitions.template._limits import MAX_OUTPUT_CHARS as MAX_OUTPUT_CHARS
from clonefleet.definitions.template._render import render_batch as render_batch
from clonefleet.definitions.template._render import render_template as render_template

__all__ = [
    "DEFAULT_EXIT_SCHEMA",
    "MAX_OUTPUT_CHARS",
    "RESERVED_NAME",
    "SHIPPED_DIR",
    "AgentDefinition",
    "Catalog",
    "CloneInfo",
    "Definition",
    "Dialect",
    "Effective",
    "InjectedSkill",
    "LoadFailure",
    "LoadReason",
    "LoadWarning",
    "RenderedClone",
    "Skill",
    "SkillCatalog",
    "agents_report",
    "check_exit_schema",
    "definition_tools",
    "discover",
    "exit_schema_enum_warnings",
    "find_skill_refs",
    "load_catalog",
    "load_directory",
    "load_file",
    "load_skills",
    "parse_text",
    "register",
    "registered",
    "render_batch",
    "render_template",
    "resolve_skill_refs",
    "skill_allowed",
    "subagent_search_path",
    "tool_resolution",
    "trust_lines",
    "trust_report",
    "unregister",
    "validate_lines",
    "validate_report",
]
