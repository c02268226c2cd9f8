"""Subagent definitions: loading the three dialects, discovery, validation, templating and skills.

Pure and Ray-free. The pipeline is ``parse`` (file → frontmatter + body), ``build`` (validated
:class:`Definition`), ``load_catalog`` (discovery and precedence), then ``render_batch`` (the
launch metadata of every clone, rendered in a guarded Jinja2 sandbox before anything starts).
"""

from __future__ import annotations

from ._catalog import SHIPPED_DIR as SHIPPED_DIR
from ._catalog import Catalog as Catalog
from ._catalog import discover as discover
from ._catalog import load_catalog as load_catalog
from ._catalog import load_directory as load_directory
from ._catalog import load_file as load_file
from ._catalog import subagent_search_path as subagent_search_path
from ._exit_schema import check_exit_schema as check_exit_schema
from ._exit_schema import exit_schema_enum_warnings as exit_schema_enum_warnings
from ._limits import MAX_OUTPUT_CHARS as MAX_OUTPUT_CHARS
from ._model import DEFAULT_EXIT_SCHEMA as DEFAULT_EXIT_SCHEMA
from ._model import RESERVED_NAME as RESERVED_NAME
from ._model import CloneInfo as CloneInfo
from ._model import Definition as Definition
from ._model import Dialect as Dialect
from ._model import InjectedSkill as InjectedSkill
from ._model import LoadFailure as LoadFailure
from ._model import LoadReason as LoadReason
from ._model import LoadWarning as LoadWarning
from ._model import RenderedClone as RenderedClone
from ._parse import parse_text as parse_text
from ._python import AgentDefinition as AgentDefinition
from ._python import register as register
from ._python import registered as registered
from ._python import unregister as unregister
from ._render import render_batch as render_batch
from ._render import render_template as render_template
from ._report import agents_report as agents_report
from ._report import validate_lines as validate_lines
from ._report import validate_report as validate_report
from ._skills import Skill as Skill
from ._skills import SkillCatalog as SkillCatalog
from ._skills import find_skill_refs as find_skill_refs
from ._skills import load_skills as load_skills
from ._skills import resolve_skill_refs as resolve_skill_refs
from ._skills import skill_allowed as skill_allowed
from ._tool_report import Effective as Effective
from ._tool_report import definition_tools as definition_tools
from ._tool_report import tool_resolution as tool_resolution
from ._trust import trust_lines as trust_lines
from ._trust import trust_report as trust_report

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
