"""Properties of the permission engine over random layers and calls (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from clonefleet.permissions import ALLOW_ALL, Default, Policy, RuleSet, parse_rules

ROOT = "/w/proj"

RULES = [
    "Bash",
    "Bash(git diff:*)",
    "Bash(git:*)",
    "Bash(rm:*)",
    "Bash(ls)",
    "Bash(npm run *)",
    "Read",
    "Read(./src/**)",
    "Read(*.env)",
    "Read(//etc/**)",
    "Edit(./src/**)",
    "Write",
    "Grep(./docs)",
    "WebFetch",
    "WebFetch(domain:example.com)",
    "WebFetch(domain:*.example.com)",
    "Task",
    "Task(reviewer)",
    "mcp__github",
    "mcp__github__create_issue",
    "mcp__*",
]
CALLS: list[tuple[str, dict[str, Any]]] = (
    [
        ("shell", {"command": c})
        for c in (
            "git diff",
            "git diff && rm -rf /",
            "git log",
            "rm x",
            "ls",
            "npm run build",
            "sudo rm -rf /",
            "ls | git diff",
        )
    ]
    + [
        (tool, {"path": p})
        for tool in ("file_read", "file_write", "file_edit", "grep", "glob")
        for p in ("src/a.py", "src/../.env", "docs", ".", "/etc/passwd", "app.env")
    ]
    + [
        ("web_fetch", {"url": u})
        for u in ("https://example.com/", "https://a.example.com/", "https://evil.com/", "nope")
    ]
    + [
        ("subagent", {"subagent_type": "reviewer"}),
        ("subagent", {}),
        ("mcp__github__create_issue", {}),
        ("mcp__github__list", {}),
        ("mcp__context7__docs", {}),
        ("todo_write", {}),
    ]
)

rule_lists = st.lists(st.sampled_from(RULES), max_size=4)
rule_sets = st.builds(
    lambda allow, deny, default: RuleSet(
        source="layer",
        allow=parse_rules(allow, "allow"),
        deny=parse_rules(deny, "deny", deny=True),
        default=default,
    ),
    rule_lists,
    rule_lists,
    st.sampled_from(list(Default)),
)
calls = st.sampled_from(CALLS)


def stack(layers: list[RuleSet]) -> Policy:
    out = ALLOW_ALL
    for layer in layers:
        out = out.child(layer, ROOT)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(rule_sets, max_size=3), rule_sets, calls)
def test_a_child_never_gets_more_than_its_parent(
    parents: list[RuleSet], child: RuleSet, call: tuple[str, dict[str, Any]]
) -> None:
    parent = stack(parents)
    kid = parent.child(child, ROOT)
    assert kid.extends(parent)
    if kid.decide(*call) is None:
        assert parent.decide(*call) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(rule_sets, min_size=1, max_size=3), st.data(), calls)
def test_a_bare_deny_in_any_layer_wins(
    layers: list[RuleSet], data: st.DataObject, call: tuple[str, dict[str, Any]]
) -> None:
    tool, arguments = call
    where = data.draw(st.integers(0, len(layers) - 1))
    bare = {"shell": "Bash", "file_read": "Read", "web_fetch": "WebFetch", "subagent": "Task"}
    name = bare.get(tool, tool if tool.startswith("mcp__") else None)
    if name is None:
        return
    target = layers[where]
    layers[where] = RuleSet(
        source=target.source,
        allow=target.allow + parse_rules([name], "allow"),
        deny=target.deny + parse_rules([name], "deny", deny=True),
        default=target.default,
    )
    p = stack(layers)
    assert p.decide(tool, arguments) is not None
    assert p.tool_denial(tool) is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(rule_sets, max_size=3), calls)
def test_tool_denial_implies_every_call_is_denied(
    layers: list[RuleSet], call: tuple[str, dict[str, Any]]
) -> None:
    p = stack(layers)
    if p.tool_denial(call[0]) is not None:
        assert p.decide(*call) is not None
