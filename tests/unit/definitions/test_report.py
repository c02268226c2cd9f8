"""`validate_report` and `agents_report`: the JSON shapes of docs/json.md, and the fixture tree counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clonefleet.config import Config
from clonefleet.definitions import SHIPPED_DIR, agents_report, load_catalog, validate_report

# What each fixture folder must yield: (definitions that load, files that fail, warnings).
EXPECTED_COUNTS = {"good": (4, 0, 0), "broken": (0, 10, 0), "messy": (9, 0, 7)}


def test_fixture_folders_load_fail_and_warn_as_expected(fixtures_dir: Path) -> None:
    for folder, expected in EXPECTED_COUNTS.items():
        report = validate_report([fixtures_dir / folder])
        counts = (len(report["definitions"]), len(report["errors"]), len(report["warnings"]))
        assert counts == expected, (folder, report)


def test_broken_fixtures_each_have_their_reason(fixtures_dir: Path) -> None:
    report = validate_report([fixtures_dir / "broken"])
    assert {Path(e["path"]).name: e["reason"] for e in report["errors"]} == {
        "no-frontmatter.md": "missing-frontmatter",
        "unclosed.md": "invalid-frontmatter",
        "native-bad-yaml.md": "invalid-frontmatter",
        "anchors.md": "invalid-frontmatter",
        "mismatch.md": "name-mismatch",
        "exit-in-tools.md": "invalid-definition",
        "typo-key.md": "invalid-definition",
        "bad-schema.md": "invalid-definition",
        "dup-a.md": "name-collision",
        "dup-b.md": "name-collision",
    }


def test_validate_shape_is_exactly_spec_7(fixtures_dir: Path) -> None:
    report = validate_report(
        [fixtures_dir / "messy" / "enum-warning.md", fixtures_dir / "broken" / "typo-key.md"]
    )
    assert set(report) == {"definitions", "errors", "warnings"}
    assert report["definitions"] == [
        {
            "name": "enum-warning",
            "path": str(fixtures_dir / "messy" / "enum-warning.md"),
            "dialect": "native",
        }
    ]
    assert [set(e) for e in report["errors"]] == [{"path", "reason", "message"}]
    assert [set(w) for w in report["warnings"]] == [{"path", "name", "message"}]
    assert report["warnings"][0]["name"] == "enum-warning"
    assert "'shipped'" in report["warnings"][0]["message"]
    assert json.loads(json.dumps(report)) == report  # plain JSON values only


def test_validate_of_a_missing_path_is_an_error(tmp_path: Path) -> None:
    report = validate_report([tmp_path / "nope.md"])
    assert report["errors"] == [
        {
            "path": str(tmp_path / "nope.md"),
            "reason": "io-error",
            "message": "no such file or folder",
        }
    ]


def test_validate_paths_include_subagents_dirs(fixtures_dir: Path) -> None:
    report = validate_report([fixtures_dir / "good" / "triage.md"], [fixtures_dir / "messy"])
    assert len(report["definitions"]) == 1 + EXPECTED_COUNTS["messy"][0]


def test_validate_without_paths_checks_the_whole_catalog(write_md: Any, tmp_path: Path) -> None:
    write_md(
        tmp_path / ".clonefleet" / "subagents",
        "researcher.md",
        "---\nname: researcher\ndescription: mine\n---\n",
    )
    write_md(tmp_path / "cli", "bad.md", "no frontmatter")
    config = Config(
        subagents={
            "inline": {"description": "d"},
            "broken": {"description": "d", "tools": ["exit_tool"]},
        }
    )
    report = validate_report([], [tmp_path / "cli"], tmp_path, config)
    names = [(d["name"], d["dialect"]) for d in report["definitions"]]
    assert names == [
        ("_default", "native"),
        ("general-purpose", "native"),
        ("researcher", "native"),
        ("researcher", "claude"),
        ("inline", "python"),
    ]
    assert [(Path(e["path"]).name, e["reason"]) for e in report["errors"]] == [
        ("bad.md", "missing-frontmatter"),
        ("config:subagents.broken", "invalid-definition"),
    ]


def test_validating_the_shipped_folder_allows_default() -> None:
    report = validate_report([SHIPPED_DIR])
    assert report["errors"] == [] and len(report["definitions"]) == 3


def test_agents_report_shows_source_dialect_and_shadows(write_md: Any, tmp_path: Path) -> None:
    path = write_md(
        tmp_path / ".clonefleet" / "subagents",
        "researcher.md",
        "---\nname: researcher\ndescription: mine\ntools: [Read, NoSuchTool]\nmodel: haiku\n---\n",
    )
    report = agents_report(load_catalog(tmp_path))
    rows = {row["name"]: row for row in report["agents"]}
    assert list(rows) == ["_default", "general-purpose", "researcher"]
    assert rows["researcher"] == {
        "name": "researcher",
        "description": "mine",
        "dialect": "claude",
        "path": str(path),
        "shadows": [str(SHIPPED_DIR / "researcher.md")],
        "model": "haiku",
        "tools": ["file_read", "NoSuchTool"],
        "warnings": [
            "`tools` names tool 'NoSuchTool', which is not available in clonefleet; the definition"
            " loads and the tool is left out unless a host provides it"
        ],
    }
    assert rows["_default"]["tools"] is None
    assert rows["_default"]["shadows"] == [] and rows["_default"]["warnings"] == []
    assert json.loads(json.dumps(report)) == report  # plain JSON values only
