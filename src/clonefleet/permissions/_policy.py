"""The :class:`Policy`: layers of rule sets, each bound to a launch directory, and the decision.

A call is allowed only when every layer allows it; deny rules of every layer are looked at
first, so a denial names the deny rule when there is one.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clonefleet.errors import ToolRetry
from clonefleet.permissions._match import Call, allowed, denies, describe_call
from clonefleet.permissions._rules import EXEMPT_TOOLS, Default, Form, Rule, RuleSet


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    """A rule set bound to the launch directory its relative path patterns start from."""

    rules: RuleSet
    root: str = "/"


@dataclass(frozen=True, slots=True, kw_only=True)
class Denial:
    """Why a call is denied: the rule (or default) and where it came from."""

    message: str
    rule: str | None = None
    """The rule's text; ``None`` when the layer's default or unmatched allow rules deny."""
    source: str = ""


def _denied_by(layer: Layer, rule: Rule, write: Call | None = None) -> Denial:
    where = f"{layer.rules.source} {rule.key}".strip()
    message = f"denied by rule {rule.text} ({where})"
    if write is not None:
        message += f": the command writes to {write.text}"
    return Denial(message=message, rule=rule.text, source=where)


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """Layers of allow and deny rules; picklable (it travels in every clone spec).

    A call is allowed when no layer denies it: a layer denies a call that one of its deny rules
    matches, a call of a tool its allow rules name that none of them matches, and (with
    ``default: deny``) a call of a tool no allow rule names. Deny rules of every layer are looked
    at first, so a denial names the deny rule when there is one.
    """

    layers: tuple[Layer, ...] = ()
    cwd: str = "/"
    """The calling clone's launch directory: relative path arguments start there."""

    def child(self, rules: RuleSet, root: str, cwd: str | None = None) -> Policy:
        """This policy with one more layer below it (a definition's, bound to ``root``)."""
        root = posixpath.normpath(os.path.abspath(root))
        layers = self.layers if rules.is_empty else (*self.layers, Layer(rules=rules, root=root))
        return Policy(layers=layers, cwd=posixpath.normpath(os.path.abspath(cwd or root)))

    def extends(self, parent: Policy) -> bool:
        """Whether this policy keeps every layer of ``parent``, in order (it can only narrow)."""
        return self.layers[: len(parent.layers)] == parent.layers

    def decide(self, tool: str, arguments: Mapping[str, Any]) -> Denial | None:
        """``None`` when ``tool`` may run with ``arguments``, else why not."""
        if tool in EXEMPT_TOOLS or not self._reads_arguments(tool):
            return None
        call = describe_call(tool, arguments, self.cwd)
        for layer in self.layers:
            for rule in layer.rules.deny:
                if denies(rule, call, layer.root):
                    return _denied_by(layer, rule)
                for write in call.writes:
                    if denies(rule, write, layer.root):
                        return _denied_by(layer, rule, write)
        for layer in self.layers:
            denial = self._layer_allows(layer, call) or self._layer_allows_writes(layer, call)
            if denial is not None:
                return denial
        return None

    def _reads_arguments(self, tool: str) -> bool:
        """Whether deciding on a call of ``tool`` needs its arguments: some rule could deny it.

        Most calls are of tools every layer allows outright (a bare allow rule, as each entry of
        a definition's ``tools`` is, or no rule and ``default: allow``); those are decided
        without reading the command or resolving the path.
        """
        for layer in self.layers:
            rules = layer.rules
            if any(r.applies_to(tool) for r in rules.deny):
                return True
            if tool == "shell" and any(r.applies_to("file_write") for r in rules.deny):
                return True  # what a command writes is checked as a write
            allow = [r for r in rules.allow if r.applies_to(tool)]
            if allow and not any(r.form is Form.ANY for r in allow):
                return True
            if not allow and rules.default is not Default.ALLOW:
                return True
        return False

    @staticmethod
    def _layer_allows(layer: Layer, call: Call) -> Denial | None:
        rules = [r for r in layer.rules.allow if r.applies_to(call.tool)]
        source = layer.rules.source
        if not rules:
            if layer.rules.default is Default.ALLOW:
                return None
            return Denial(
                message=f"{call.tool} is not allowed: no allow rule of {source} permissions"
                " names it (default: deny)",
                source=source,
            )
        if allowed(rules, call, layer.root):
            return None
        names = ", ".join(r.text for r in rules[:5]) + (", ..." if len(rules) > 5 else "")
        return Denial(
            message=f"not allowed by {source} permissions: this {call.tool} call matches none of"
            f" {names}",
            source=source,
        )

    def _layer_allows_writes(self, layer: Layer, call: Call) -> Denial | None:
        """A layer that grants ``shell`` only for some commands grants no writes with them: each
        file a command writes needs one of the layer's ``Write``/``Edit`` allow rules, and a bare
        one covers the launch directory only (docs/permissions.md#what-a-command-writes)."""
        if not call.writes:
            return None
        allow = layer.rules.allow
        commands = [r for r in allow if r.applies_to("shell")]
        if not commands or any(r.form is Form.ANY for r in commands):
            return None  # shell granted whole (or left to the default): its writes with it
        rules = [r for r in allow if r.applies_to("file_write")]
        for write in call.writes:
            if not self._write_allowed(rules, write, layer.root):
                return Denial(
                    message=f"not allowed by {layer.rules.source} permissions: this shell"
                    f" command writes to {write.text}, and a command rule grants no writes; a"
                    " Write or Edit allow rule must cover that path (docs/permissions.md)",
                    source=layer.rules.source,
                )
        return None

    def _write_allowed(self, rules: list[Rule], write: Call, root: str) -> bool:
        if write.subjects is None or not rules:
            return False
        patterned = [r for r in rules if r.form is not Form.ANY]
        bare = len(patterned) < len(rules)
        for subject in write.subjects:
            parts, real = subject
            inside = bare and _within(parts, self.cwd, real)
            if not inside and not allowed(patterned, Call(write.tool, (subject,)), root):
                return False
        return True

    def check(self, tool: str, arguments: Mapping[str, Any]) -> None:
        """Return when ``tool`` may run with ``arguments``.

        Raises:
            ToolRetry: the call is denied; the message names the rule that denied it.
        """
        denial = self.decide(tool, arguments)
        if denial is not None:
            raise ToolRetry(denial.message)

    def address_denial(self, tool: str, address: str) -> Denial | None:
        """Why ``tool`` may not connect to ``address``, an IP address a host name resolved to:
        a deny rule that names that address (``WebFetch(domain:10.0.0.5)`` denies every name
        resolving to it as well as the URL ``http://10.0.0.5/``); ``None`` when none does."""
        call = Call(tool, (address,))
        for layer in self.layers:
            for rule in layer.rules.deny:
                if rule.form is Form.DOMAIN and _is_address(rule.value) and rule.applies_to(tool):
                    if denies(rule, call, layer.root):
                        return _denied_by(layer, rule)
        return None

    def tool_denial(self, tool: str) -> Denial | None:
        """Why ``tool`` is denied whatever its arguments (a bare deny rule, or a ``default:
        deny`` layer none of whose allow rules names it); ``None`` when some call may run."""
        if tool in EXEMPT_TOOLS:
            return None
        for layer in self.layers:
            for rule in layer.rules.deny:
                if rule.form is Form.ANY and rule.applies_to(tool):
                    return _denied_by(layer, rule)
        call = Call(tool, None)
        for layer in self.layers:
            if layer.rules.default is Default.DENY and not any(
                r.applies_to(tool) for r in layer.rules.allow
            ):
                return self._layer_allows(layer, call)
        return None

    def describe(self) -> list[dict[str, Any]]:
        """The layers for people and ``validate --json``: source, default, allow and deny rules."""
        return [
            {
                "source": layer.rules.source,
                "default": str(layer.rules.default),
                "allow": [r.text for r in layer.rules.allow],
                "deny": [r.text for r in layer.rules.deny],
            }
            for layer in self.layers
        ]


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _within(parts: tuple[str, ...], folder: str, real: bool) -> bool:
    """Whether a path's components lie in ``folder`` (its real path for a real path)."""
    base = tuple(p for p in (os.path.realpath(folder) if real else folder).split("/") if p)
    return parts[: len(base)] == base


ALLOW_ALL = Policy()
"""The policy with no rules: every call allowed."""
