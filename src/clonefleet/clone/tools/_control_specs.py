"""The tool specs of the control tools every clone has: what the model sees of them.

``exit_tool`` is not here: its parameters are the definition's exit schema (see ``_loop``).
"""

from __future__ import annotations

from clonefleet.providers import ToolSpec

__all__ = ["CONTROL_SPECS"]

CONTROL_SPECS: dict[str, ToolSpec] = {
    "progress_update": ToolSpec(
        name="progress_update",
        description="Record a brief status snapshot for the caller (not a result channel).",
        parameters={
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
        },
    ),
    "tool_search": ToolSpec(
        name="tool_search",
        description="Look up deferred tools by name or keyword; found tools become callable.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    ),
    "skill": ToolSpec(
        name="skill",
        description="Load one of your available skills by name; its instructions stay with you for the run.",
        parameters={
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    ),
    "switch_facet": ToolSpec(
        name="switch_facet",
        description="Not available to subagents.",
        parameters={"type": "object"},
    ),
}
