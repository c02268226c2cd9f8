"""The shared vocabulary is written once: no other module keeps its own list of those words."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import clonefleet
from clonefleet import vocab
from clonefleet.clone import WORK_TOOL_TABLE

pytestmark = pytest.mark.readme_smoke

ROOT = Path(clonefleet.__file__).resolve().parent

GROUPS: dict[str, frozenset[str]] = {
    "tool names": frozenset(vocab.KNOWN_TOOLS | set(vocab.CLAUDE_TOOL_ALIASES)),
    "status words": frozenset().union(*vocab.STATUS_FAMILIES.values()),
    "event types": frozenset(str(e) for e in vocab.EventType),
    "stop reasons": frozenset(str(r) for r in vocab.StopReason),
    "job states": frozenset(str(s) for s in vocab.JobState),
    "run-record fields": frozenset(vocab.RUN_RECORD_FIELDS),
}
"""Three or more words of one group in one literal tuple, list or set elsewhere is a copy. For
run-record fields it takes eight, in a sequence or as a dict literal's keys (the record's shape
built by hand): a few fields picked for a display are a selection, not a copy.
Tables keyed by tool name (a tool's spec or implementation) are not copies: they say what each
tool is, not which tools there are."""


def _sources() -> list[Path]:
    skip = {"tests", "benchmarks", "build", ".venv"}
    return [
        p
        for p in sorted(ROOT.rglob("*.py"))
        if not skip & set(p.relative_to(ROOT).parts) and p.name != "vocab.py"
    ]


def _strings(items: list[ast.expr | None]) -> set[str]:
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_keeps_its_own_copy_of_the_vocabulary(path: Path):
    copies = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            keys = _strings(list(node.keys)) & GROUPS["run-record fields"]
            if len(keys) >= 8:
                copies.append(f"line {node.lineno}: run-record shape {sorted(keys)}")
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            words = _strings(list(node.elts))
            for group, vocabulary in GROUPS.items():
                if len(words & vocabulary) >= (8 if group == "run-record fields" else 3):
                    copies.append(f"line {node.lineno}: {group} {sorted(words & vocabulary)}")
    assert not copies, copies


def test_every_work_tool_has_an_implementation_and_nothing_else_does():
    assert tuple(WORK_TOOL_TABLE) == vocab.WORK_TOOLS


def test_claude_aliases_name_real_tools():
    assert set(vocab.CLAUDE_TOOL_ALIASES.values()) <= vocab.KNOWN_TOOLS
    assert vocab.canonical_tool("MultiEdit") == "file_edit"
    assert vocab.canonical_tool("Task") == vocab.canonical_tool("Agent") == "subagent"
    assert vocab.canonical_tool("file_read") == "file_read"


@pytest.mark.parametrize(
    ("word", "outcome"),
    [("OK", vocab.Outcome.SUCCESS), ("Failed", vocab.Outcome.FAILURE), ("canceled", "cancelled")],
)
def test_status_family_is_case_insensitive(word: str, outcome: str):
    assert vocab.status_family(word) == outcome


def test_unrecognised_status_has_no_family():
    assert vocab.status_family("weird") is None


def test_every_stop_reason_but_completed_has_caller_facing_error_text():
    for reason in vocab.StopReason:
        text = vocab.stop_error(reason, "why")
        if reason is vocab.StopReason.COMPLETED:
            assert text is None
        else:
            assert text is not None and text.startswith("Error: subagent")
    assert vocab.stop_error(vocab.StopReason.ABNORMAL, "host died") == (
        "Error: subagent run ended abnormally (host died)"
    )


def test_run_record_has_exactly_the_record_fields_as_plain_strings():
    class Source:
        job_id, batch_id, agent, clone_index, key = "sa_00000001", "b_1", "a", 0, None
        status, stop_reason, outcome = vocab.JobState.FAILED, vocab.StopReason.MAX_TURNS, None
        result, salvaged, nonconforming = None, False, False
        concerns, warnings, error, model, turns = (), ("w",), "e", None, 4
        usage = {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}
        cause = None

    record = vocab.run_record(Source(), turns=5)
    assert tuple(record) == vocab.RUN_RECORD_FIELDS
    assert type(record["status"]) is str and type(record["stop_reason"]) is str
    assert (record["status"], record["stop_reason"], record["turns"]) == ("failed", "max_turns", 5)
    assert record["warnings"] == ["w"] and record["outcome"] is None


def test_events_at_a_lower_level_are_shown_at_every_higher_one():
    levels = vocab.EVENT_LEVELS
    assert levels["lifecycle"] < levels["tools"] < levels["all"]
    assert str(vocab.EventType.FINAL) not in levels["all"]
