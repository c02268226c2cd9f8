"""Tool resolution on a corpus of Claude Code agent files (`validate --tools`, docs/json.md).

`tests/fixtures/claude_corpus/` holds agent files in the shapes public collections use; with the
MCP servers they name configured, at least 97% of their tool mentions must resolve to a real tool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from clonefleet.config import Config
from clonefleet.definitions import validate_lines, validate_report
from clonefleet.planning import clone_tools

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "claude_corpus"
SERVERS = {
    name: {"command": "npx", "args": ["-y", f"@example/{name}-mcp"]}
    for name in ("context7", "sequential-thinking", "playwright", "github")
}


def report(config: Config, tmp_path: Path) -> dict[str, Any]:
    return validate_report(
        [CORPUS],
        cwd=tmp_path,
        config=config,
        effective_of=lambda defn: clone_tools(defn, config, tmp_path),
        tools=True,
    )


def test_the_corpus_loads_and_mentions_resolve_with_its_servers_configured(
    tmp_path: Path,
) -> None:
    found = report(Config(mcp_servers=SERVERS), tmp_path)
    assert [Path(e["path"]).name for e in found["errors"]] == ["no-frontmatter.md"]
    totals = found["tool_resolution"]["totals"]
    assert totals["definitions"] == 15 and totals["definitions_listing_tools"] == 14
    assert totals["resolved_pct"] >= 97.0, totals
    rows = {r["name"]: r for r in found["tool_resolution"]["definitions"]}
    assert rows["browser-tester"]["missing"] == [
        {
            "tool": "mcp__linear__create_issue",
            "canonical": "mcp__linear__create_issue",
            "reason": "mcp-server-not-configured",
            "detail": "MCP server 'linear' is not in the config's mcp_servers nor the definition's own",
        }
    ]
    lead = rows["tech-lead-orchestrator"]
    assert {"subagent", "list_jobs", "job_status", "message_subagent"} <= set(lead["gets"])
    assert rows["general-helper"]["asked"] is None and rows["general-helper"]["mentions"] == 0


def test_without_the_servers_their_tools_are_missing_with_the_reason(tmp_path: Path) -> None:
    totals = report(Config(), tmp_path)["tool_resolution"]["totals"]
    assert totals["resolved_pct"] < 90
    assert set(totals["missing_by_reason"]) == {"mcp-server-not-configured"}


def test_the_policy_and_spawning_explain_what_is_missing(tmp_path: Path) -> None:
    config = Config(mcp_servers=SERVERS, permissions={"deny": ["WebFetch", "Task"]})
    rows = {r["name"]: r for r in report(config, tmp_path)["tool_resolution"]["definitions"]}
    missing = {m["tool"]: m for m in rows["research-analyst"]["missing"]}
    assert missing["WebFetch"]["reason"] == "denied-by-policy"
    assert missing["WebFetch"]["detail"] == "denied by rule WebFetch (config permissions.deny)"
    lead = {m["tool"]: m["reason"] for m in rows["tech-lead-orchestrator"]["missing"]}
    assert lead["Task"] == "denied-by-policy" and lead["TaskList"] == "needs-subagent-spawn"
    assert "web_fetch" not in rows["research-analyst"]["gets"]


def test_the_lines_for_people_show_tools_rules_and_totals(tmp_path: Path) -> None:
    lines = validate_lines(report(Config(mcp_servers=SERVERS), tmp_path))
    devops = lines.index(
        f"ok       devops-troubleshooter (claude) {CORPUS / 'devops-troubleshooter.md'}"
    )
    assert lines[devops + 1].startswith("         tools: file_read, grep, shell, shell_output")
    assert lines[devops + 2] == (
        "         rules: definition devops-troubleshooter: allow Read, Grep, Bash, BashOutput,"
        " KillShell, WebFetch, Bash(kubectl get:*), Bash(kubectl logs:*);"
        " deny Bash(kubectl delete:*), Bash(rm -rf:*)"
    )
    assert "         missing mcp__linear__create_issue: mcp-server-not-configured" in "\n".join(
        lines
    )
    assert lines[-1].startswith("tools    total: 91 mentions in 14 of 15 definitions; 90 resolved")


def test_validate_tools_json_from_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"mcp_servers": SERVERS}))
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    out = subprocess.run(
        [sys.executable, "-m", "clonefleet", "validate", str(CORPUS), "--tools", "--json"]
        + ["--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1  # the file without frontmatter is an error
    totals = json.loads(out.stdout)["tool_resolution"]["totals"]
    assert totals["mentions"] == 91 and totals["resolved_pct"] >= 97.0


def test_a_bare_configured_server_name_resolves_to_its_tools(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "old.md").write_text(
        "---\nname: old\ndescription: an older file\ntools: Read, context7, Docker\n---\nbody\n"
    )
    config = Config(mcp_servers={"context7": SERVERS["context7"]})
    found = validate_report(
        [agents],
        cwd=tmp_path,
        config=config,
        effective_of=lambda defn: clone_tools(defn, config, tmp_path),
        tools=True,
    )
    (row,) = found["tool_resolution"]["definitions"]
    assert (row["mentions"], row["resolved"]) == (3, 2)
    assert "mcp__context7" in row["gets"]
    assert [m["reason"] for m in row["missing"]] == ["unknown-tool"]
