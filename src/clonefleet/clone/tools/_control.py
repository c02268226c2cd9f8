"""The control tools every clone has, as the loop runs them: ``tool_search`` and ``skill``, and
the model-facing specs of ``skill`` and ``exit_tool``.

Plain functions over the clone's tool table and skill catalog; ``progress_update`` and the exit
judge stay in the loop (``_loop``), which owns the state they change. :data:`CONTROL_SPECS` holds
what the model sees of the control tools but ``exit_tool``, whose parameters are the definition's
exit schema (:func:`exit_spec`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from clonefleet.clone.tools._tool import Tool
from clonefleet.errors import ToolRetry
from clonefleet.providers import IdentityCache, ToolSpec

__all__ = ["CONTROL_SPECS", "exit_spec", "load_skill", "skill_spec", "tool_search"]

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
"""The tool specs of the control tools every clone has, by name."""


def tool_search(query: str, tools: Mapping[str, Tool], visible: set[str]) -> str:
    """Find deferred tools: ``select:a,b`` names them exactly, else any word of the query
    matching a tool's name or description. Found tools join ``visible`` (callable from the next
    turn)."""
    deferred = {n: t for n, t in tools.items() if n not in visible}
    q = query.strip()
    if q.lower().startswith("select:"):
        wanted = {w.strip() for w in q[7:].split(",")}
        found = [t for n, t in deferred.items() if n in wanted]
    else:
        words = [w for w in q.lower().split() if w]
        found = [
            t
            for n, t in deferred.items()
            if any(w in n.lower() or w in t.spec.description.lower() for w in words)
        ]
    visible.update(t.name for t in found)
    if not found:
        names = ", ".join(sorted(deferred)) or "none"
        return f"no deferred tool matches {query!r}; deferred tools: {names}"
    return json.dumps(
        [
            {"name": t.name, "description": t.spec.description, "parameters": t.spec.parameters}
            for t in found
        ]
    )


def load_skill(name: str, catalog: Mapping[str, tuple[str, str]], loaded: dict[str, str]) -> str:
    """The skill's body as the tool's answer; it joins ``loaded`` (kept through compaction).

    Raises:
        ToolRetry: no skill of that name is available.
    """
    if name not in catalog:
        raise ToolRetry(f"unknown skill {name!r}; available: {', '.join(sorted(catalog))}")
    body = catalog[name][1]
    loaded[name] = body
    return f"[skill {name}]\n{body}"


def skill_spec(catalog: Mapping[str, tuple[str, str]]) -> ToolSpec:
    """The ``skill`` tool's spec, listing the skills the clone may load."""
    listing = "; ".join(f"{n}: {d}" for n, (d, _) in sorted(catalog.items()))
    base = CONTROL_SPECS["skill"]
    return ToolSpec(
        name="skill",
        description=f"{base.description} Available: {listing}",
        parameters=base.parameters,
    )


def _make_exit_spec(schema: dict[str, Any]) -> ToolSpec:
    return ToolSpec(
        name="exit_tool",
        description="Finish the task and return your result.",
        parameters=schema,
    )


_EXIT_SPECS = IdentityCache(_make_exit_spec, 256)
"""``exit_tool`` specs by their schema: the clones of a batch share one schema object, and a
clone sends its exit spec with every request."""


def exit_spec(schema: dict[str, Any]) -> ToolSpec:
    """The ``exit_tool`` spec: its parameters are the definition's exit schema."""
    return _EXIT_SPECS(schema)
