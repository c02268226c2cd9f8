"""`clonefleet validate` and `clonefleet agents` from the command line (no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BAD = "---\nname: bad\ndescription: x\nclonefleet:\n  tools: [exit_tool]\n---\nbody\n"
GOOD = "---\nname: good\ndescription: fine\ntools: Read, Grep\nunknownkey: 1\n---\nbody {{X}}\n"
SHADOW = "---\nname: researcher\ndescription: my researcher\ntools: Read\n---\nbody\n"


def cli(*args, cwd):
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg")}
    return subprocess.run(
        [sys.executable, "-m", "clonefleet", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def project(tmp_path):
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "bad.md").write_text(BAD)
    (agents / "good.md").write_text(GOOD)
    (agents / "researcher.md").write_text(SHADOW)
    return agents


def test_validate_json_reports_definitions_errors_and_warnings_and_exits_1(tmp_path):
    agents = project(tmp_path)
    out = cli("validate", "--json", cwd=tmp_path)
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert set(report) == {"definitions", "errors", "warnings", "providers", "trust"}
    names = {d["name"]: d for d in report["definitions"]}
    good = {"name": "good", "path": str(agents / "good.md"), "dialect": "claude"}
    assert names["good"].items() >= good.items()
    assert names["good"]["tools"][:2] == ["file_read", "grep"]
    assert names["good"]["rules"] == [
        {"source": "definition good", "default": "allow", "allow": ["Read", "Grep"], "deny": []}
    ]
    assert [(e["path"], e["reason"]) for e in report["errors"]] == [
        (str(agents / "bad.md"), "invalid-definition")
    ]
    assert "exit-tool-in-tools" in report["errors"][0]["message"]
    assert any(w["name"] == "good" and "unknownkey" in w["message"] for w in report["warnings"])


def test_validate_of_one_clean_file_exits_0(tmp_path):
    agents = project(tmp_path)
    out = cli("validate", str(agents / "good.md"), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    assert [d["name"] for d in json.loads(out.stdout)["definitions"]] == ["good"]


def test_agents_json_shows_path_dialect_and_what_a_definition_shadows(tmp_path):
    agents = project(tmp_path)
    out = cli("agents", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    by_name = {a["name"]: a for a in json.loads(out.stdout)["agents"]}
    assert "bad" not in by_name
    mine = by_name["researcher"]
    assert mine["path"] == str(agents / "researcher.md") and mine["dialect"] == "claude"
    assert len(mine["shadows"]) == 1 and mine["shadows"][0].endswith("shipped/researcher.md")
    human = cli("agents", cwd=tmp_path)
    assert "shadows" in human.stdout and "researcher" in human.stdout
