"""The permission policy: one engine for a clone and every subagent it spawns (docs/permissions.md).

A :class:`Policy` is a stack of layers (config, then each definition down the spawn chain). A tool
call is allowed only when every layer allows it, so a child can never get more than its parent.
This module imports only the standard library and the shared vocabulary and errors, so every layer
may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ALLOW_ALL", "Policy"]


@dataclass(frozen=True, slots=True)
class Policy:
    """Allow and deny rules, layered; picklable (it travels in every clone spec)."""

    def check(self, tool: str, arguments: Mapping[str, Any]) -> None:
        """Return when ``tool`` may run with ``arguments``.

        Raises:
            ToolRetry: the call is denied; the message names the rule that denied it.
        """


ALLOW_ALL = Policy()
"""The policy with no rules: every call allowed."""
