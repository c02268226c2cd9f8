"""The config's ``permissions`` section: the top layer of every clone's permission policy.

Only the schema lives here; what a rule means and how a call is matched is
``clonefleet.permissions`` (docs/permissions.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from clonefleet.permissions import Default, RuleSet, parse_rules

__all__ = ["PermissionsConfig"]


class PermissionsConfig(BaseModel):
    """Allow and deny rules for every clone and every subagent it spawns."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    allow: tuple[str, ...] = ()
    """Rules such as ``Bash(git diff:*)``, ``Read(./src/**)``: a tool they name may run only as
    one of them says."""
    deny: tuple[str, ...] = ()
    """Rules that deny a call whatever else allows it."""
    default: Literal["allow", "deny"] = "allow"
    """For a tool no ``allow`` rule names: ``allow`` it, or ``deny`` it."""

    @field_validator("allow", "deny")
    @classmethod
    def _rules_parse(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        name = info.field_name or "allow"
        parse_rules(value, f"permissions.{name}", deny=name == "deny")  # ValueError names the entry
        return value

    def rule_set(self, source: str = "config") -> RuleSet:
        """The rules as a config layer of a policy; ``source`` names it in messages."""
        return RuleSet(
            source=source,
            allow=parse_rules(self.allow, "permissions.allow"),
            deny=parse_rules(self.deny, "permissions.deny", deny=True),
            default=Default(self.default),
        )
