"""The permission policy: one engine for a clone and every subagent it spawns.

A :class:`Policy` is a stack of layers: the config's ``permissions``, then the layer of each
definition down the spawn chain. A tool call is allowed only when every layer allows it, and deny
wins. Rules are written as in Claude Code settings (``Bash(git diff:*)``, ``Read(./src/**)``).
Matching never runs a user's regular expression and every input it reads is capped. This package
imports only the standard library and the shared vocabulary and errors, so every layer may use
it. See docs/permissions.md.
"""

from __future__ import annotations

from clonefleet.permissions._policy import ALLOW_ALL as ALLOW_ALL
from clonefleet.permissions._policy import Denial as Denial
from clonefleet.permissions._policy import Layer as Layer
from clonefleet.permissions._policy import Policy as Policy
from clonefleet.permissions._rules import EXEMPT_TOOLS as EXEMPT_TOOLS
from clonefleet.permissions._rules import MAX_RULE_CHARS as MAX_RULE_CHARS
from clonefleet.permissions._rules import MAX_RULES as MAX_RULES
from clonefleet.permissions._rules import Default as Default
from clonefleet.permissions._rules import Rule as Rule
from clonefleet.permissions._rules import RuleSet as RuleSet
from clonefleet.permissions._rules import parse_rule as parse_rule
from clonefleet.permissions._rules import parse_rules as parse_rules

__all__ = [
    "ALLOW_ALL",
    "EXEMPT_TOOLS",
    "MAX_RULES",
    "MAX_RULE_CHARS",
    "Default",
    "Denial",
    "Layer",
    "Policy",
    "Rule",
    "RuleSet",
    "parse_rule",
    "parse_rules",
]
