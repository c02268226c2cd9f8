"""What each definition's tool mentions resolve to: the data of ``validate --tools`` (docs/json.md).

For every entry of a definition's ``tools`` (as written), the report says which tool it names,
whether that is a real tool (MCP tools count when their server is configured), whether a clone
of the definition gets it and, when not, why. What a clone gets is not computed here: the caller
passes it in (:data:`Effective`, from the planner of ``clonefleet.scheduler``), so this report and
a real launch cannot disagree.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clonefleet.config import Config
from clonefleet.definitions._definition import Definition, Dialect
from clonefleet.definitions._rules import base_tool
from clonefleet.permissions import Policy
from clonefleet.vocab import (
    CLAUDE_TOOL_ALIASES,
    CONTROL_TOOLS,
    KNOWN_TOOLS,
    MCP_RESOURCE_TOOLS,
    SPAWN_TOOLS,
    canonical_tool,
)

__all__ = ["Effective", "definition_tools", "tool_resolution"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Effective:
    """What a clone of a definition, started by a user, gets (the planner's answer)."""

    tools: tuple[str, ...]
    """Its work tools and MCP grants, after the policy took out what it never allows."""
    policy: Policy
    spawn: bool
    """Whether it gets ``subagent`` and the job-control tools."""


EffectiveOf = Callable[[Definition], Effective]
"""How the caller tells what a clone of a definition gets."""


def definition_tools(defn: Definition, effective: Effective) -> dict[str, Any]:
    """The ``tools`` and ``rules`` of a definition's ``validate --json`` row: every tool a clone
    of it may call, and each layer of its policy (config first)."""
    spawn = SPAWN_TOOLS if effective.spawn else ()
    return {
        "tools": list(dict.fromkeys((*effective.tools, *CONTROL_TOOLS, *spawn))),
        "rules": effective.policy.describe(),
    }


def _servers(defn: Definition, config: Config | None) -> set[str]:
    configured = set(getattr(config, "mcp_servers", None) or {})
    own = {name for name, entry in defn.mcp_servers if entry}
    return configured | own


def _unknown(entry: str) -> dict[str, str]:
    words = [*CLAUDE_TOOL_ALIASES, *KNOWN_TOOLS]
    guess = difflib.get_close_matches(entry, words, n=1, cutoff=0.75)
    hint = f"; did you mean {guess[0]}?" if guess else ""
    return {"reason": "unknown-tool", "detail": f"clonefleet has no tool of this name{hint}"}


def _why_missing(
    tool: str, defn: Definition, effective: Effective, servers: set[str]
) -> dict[str, str] | None:
    """Why a clone of ``defn`` does not get ``tool`` (``None``: it does)."""
    denial = effective.policy.tool_denial(tool)
    if denial is not None:
        return {"reason": "denied-by-policy", "detail": denial.message}
    if tool in defn.tools_deny:
        return {"reason": "denied-by-definition", "detail": "the definition's tools_deny names it"}
    if tool in SPAWN_TOOLS and not effective.spawn:
        how = (
            "list Task or Agent in tools"
            if defn.dialect is Dialect.CLAUDE
            else "set allow_subagent_spawn: true"
        )
        if defn.allow_subagent_spawn:
            how = "the policy denies the subagent tool"
        return {
            "reason": "needs-subagent-spawn",
            "detail": f"only a spawning subagent gets it ({how})",
        }
    if tool in MCP_RESOURCE_TOOLS and not servers:
        return {"reason": "mcp-server-not-configured", "detail": "no MCP server is configured"}
    if tool.startswith("mcp__"):
        server = tool[5:].split("__", 1)[0]
        if server not in servers:
            return {
                "reason": "mcp-server-not-configured",
                "detail": f"MCP server {server!r} is not in the config's mcp_servers nor the"
                " definition's own",
            }
    return None


def _mention(
    entry: str, defn: Definition, effective: Effective, servers: set[str]
) -> tuple[str, bool, dict[str, str] | None]:
    """``(tool, names a real tool, why it is missing)`` of one ``tools`` entry."""
    tool = canonical_tool(base_tool(entry)[0])
    if tool in servers and tool not in KNOWN_TOOLS:
        tool = f"mcp__{tool}"  # a bare server name, as older Claude Code files list them
    if tool in ("tag!ALL", "tag!ALL_MCP"):
        return tool, True, None
    real = tool in KNOWN_TOOLS or (tool.startswith("mcp__") and len(tool) > 5)
    if not real:
        return tool, False, _unknown(entry)
    why = _why_missing(tool, defn, effective, servers)
    if why is not None and why["reason"] == "mcp-server-not-configured":
        real = False  # an MCP tool is real only where its server is
    return tool, real, why


def _row(defn: Definition, effective: Effective, config: Config | None) -> dict[str, Any]:
    servers = _servers(defn, config)
    asked = list(defn.tools_requested) if defn.tools_requested is not None else None
    missing, resolved, granted = [], 0, 0
    for entry in asked or ():
        tool, real, why = _mention(entry, defn, effective, servers)
        resolved += real
        if why is None:
            granted += 1
        else:
            missing.append({"tool": entry, "canonical": tool, **why})
    # An MCP grant passes through the planner; without its server the host finds no tool for it.
    unserved = {m["canonical"] for m in missing if m["reason"] == "mcp-server-not-configured"}
    return {
        "name": defn.name,
        "path": defn.path,
        "asked": asked,
        "gets": [t for t in definition_tools(defn, effective)["tools"] if t not in unserved],
        "missing": missing,
        "mentions": len(asked or ()),
        "resolved": resolved,
        "granted": granted,
    }


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 100.0


def tool_resolution(
    definitions: Iterable[Definition], config: Config | None, effective_of: EffectiveOf
) -> dict[str, Any]:
    """The ``tool_resolution`` object of ``validate --tools --json`` (docs/json.md).

    Args:
        definitions: the definitions to report, in order.
        config: the config in use (its MCP servers).
        effective_of: what a clone of a definition gets (``clonefleet.planning.clone_tools``).

    Returns:
        ``{"definitions": [{name, path, asked, gets, missing, mentions, resolved, granted}],
        "totals": {...}}``. A *mention* is one entry of a ``tools`` list; it is *resolved* when
        it names a real tool (an MCP tool whose server is configured), *granted* when a clone
        gets it.
    """
    rows = [_row(d, effective_of(d), config) for d in definitions]
    return {"definitions": rows, "totals": _totals(rows)}


def _totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    mentions = sum(r["mentions"] for r in rows)
    resolved = sum(r["resolved"] for r in rows)
    granted = sum(r["granted"] for r in rows)
    missing = [m for r in rows for m in r["missing"]]
    return {
        "definitions": len(rows),
        "definitions_listing_tools": sum(r["asked"] is not None for r in rows),
        "mentions": mentions,
        "resolved": resolved,
        "resolved_pct": _pct(resolved, mentions),
        "granted": granted,
        "granted_pct": _pct(granted, mentions),
        "missing_by_reason": dict(Counter(m["reason"] for m in missing).most_common()),
        "missing_by_tool": dict(Counter(m["canonical"] for m in missing).most_common(20)),
    }
