"""Property: nothing an untrusted project brings starts a process or reaches a server (hypothesis).

Hypothesis writes whole projects: a ``.clonefleet/config.yaml`` with folders added to discovery
(``.claude/agents`` among them), inline ``subagents``, MCP servers and simulation scripts;
definition files of both dialects in those folders and in ``.clonefleet/subagents``, with
``mcpServers`` of every kind (a command, a URL, a configured server's name) and ``hooks``; and
skills carrying the same keys. Then, at the pure level a run goes through (loading the config,
the catalog and the plan of a batch, no Ray):

- untrusted, loading the config fails exactly when the config itself asks for a server or a
  script; every definition in the catalog (what a batch or a nested spawn may start) and every
  planned clone has no server to start or reach; a name whose strongest definition asks for one
  is refused, naming ``clonefleet trust``, and never replaced by a weaker definition;
- trusted, the same project plans with exactly the servers its strongest definitions ask for.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.config import load_config, trust_folder
from clonefleet.definitions import load_catalog, load_skills
from clonefleet.errors import ConfigError, DefinitionError
from clonefleet.fleet import plan_batch

pytestmark = pytest.mark.timeout(300)

NAMES = ("general-purpose", "researcher", "helper", "x-agent")
EXTRA_DIRS = ("agents", "../.claude/agents", "../tools/defs")


class _Plain(yaml.SafeDumper):
    """Writes a value given twice in full: no anchors and aliases in generated files."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Plain)


command_entry = st.one_of(
    st.just({"command": ["sh", "-c", "touch MARKER"]}),
    st.just({"command": "touch", "args": ["MARKER"]}),
    st.just({"type": "stdio", "command": ["python3", "-c", "open('MARKER', 'w')"]}),
    st.just({"command": "touch", "args": ["MARKER"], "env": {"A": "b"}, "cwd": "/tmp"}),
)
url_entry = st.one_of(
    st.just({"url": "https://mcp.evil.example/mcp"}),
    st.just({"type": "http", "url": "http://10.0.0.1:8000/mcp", "headers": {"X-Key": "v"}}),
)
server_entry = st.one_of(command_entry, url_entry, st.none())  # None: a configured server's name
servers = st.dictionaries(st.sampled_from(("helper", "time", "tool-1")), server_entry, max_size=2)


@st.composite
def definition(draw: st.DrawFn, name: str) -> str:
    chosen = draw(servers)
    frontmatter: dict[str, Any] = {"name": name, "description": "d"}
    if draw(st.booleans()):  # native
        frontmatter["clonefleet"] = {"mcp_servers": chosen} if chosen else {}
    else:
        if chosen:
            frontmatter["mcpServers"] = chosen
        if draw(st.booleans()):
            frontmatter["hooks"] = {"PreToolUse": [{"type": "command", "command": "touch HOOK"}]}
    return f"---\n{dump(frontmatter)}---\nbody\n"


folder_of_definitions = st.lists(st.sampled_from(NAMES), unique=True, max_size=3).flatmap(
    lambda names: st.tuples(*(definition(n).map(lambda text, n=n: (n, text)) for n in names))
)


@st.composite
def project(draw: st.DrawFn) -> dict[str, Any]:
    extra = draw(st.lists(st.sampled_from(EXTRA_DIRS), unique=True, max_size=3))
    config: dict[str, Any] = {}
    if extra:
        config["discovery"] = {"extra_subagents_dirs": extra}
    inline = {
        n: {"description": "d", "prompt": "body", **({"mcp_servers": s} if s else {})}
        for n, s in draw(st.dictionaries(st.sampled_from(NAMES), servers, max_size=2)).items()
    }
    if inline:
        config["subagents"] = inline
    config_servers = draw(
        st.dictionaries(st.sampled_from(("cfg", "time")), command_entry | url_entry, max_size=1)
    )
    if config_servers:
        config["mcp_servers"] = config_servers
    if draw(st.booleans()):
        config["providers"] = {"sim": {"kind": "simulated", "simulated": {"script": "evil.yaml"}}}
    return {
        "config": config if (config or draw(st.booleans())) else None,
        "extra": {d: draw(folder_of_definitions) for d in extra},
        "own": draw(folder_of_definitions),  # .clonefleet/subagents
        "skills": draw(st.lists(st.sampled_from(("lint", "deploy")), unique=True, max_size=2)),
        "asks_in_config": bool(config_servers) or "providers" in config,
        "inline": inline,
    }


def write_project(root: Path, spec: dict[str, Any]) -> None:
    dot = root / ".clonefleet"
    dot.mkdir(parents=True)
    if spec["config"] is not None:
        (dot / "config.yaml").write_text(dump(spec["config"]))
    layers = [(dot / d, spec["extra"][d]) for d in spec["extra"]] + [
        (dot / "subagents", spec["own"])
    ]
    for folder, files in layers:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files:
            (folder / f"{name}.md").write_text(text)
    for skill in spec["skills"]:
        (dot / "skills" / skill).mkdir(parents=True)
        (dot / "skills" / skill / "SKILL.md").write_text(
            f"---\nname: {skill}\ndescription: d\nmcpServers:\n  s: {{command: [touch, MARKER]}}\n"
            "hooks: {Stop: [{command: touch HOOK}]}\n---\nRun `touch MARKER`.\n"
        )
    (root / "evil.yaml").write_text("default:\n  - {tool: shell, args: {command: touch MARKER}}\n")


def strongest(spec: dict[str, Any]) -> dict[str, set[str]]:
    """Per project-defined name, the servers its strongest definition starts or reaches
    (precedence: extra folders in order, the project's folder, inline entries)."""
    out: dict[str, set[str]] = {}
    files = [f for d in spec["extra"] for f in spec["extra"][d]] + list(spec["own"])
    for name, text in files:
        fm = yaml.safe_load(text.split("---\n")[1])
        table = fm.get("mcpServers") or (fm.get("clonefleet") or {}).get("mcp_servers") or {}
        out[name] = {s for s, e in table.items() if e}
    for name, entry in spec["inline"].items():
        out[name] = {s for s, e in (entry.get("mcp_servers") or {}).items() if e}
    return out


def started(specs: Any) -> set[str]:
    return {n for s in specs for n, e in s.mcp_servers if e}


def check_untrusted(root: Path, spec: dict[str, Any]) -> None:
    try:
        load_config()
        assert not spec["asks_in_config"], "an untrusted config asked for a server or a script"
    except ConfigError as exc:
        assert spec["asks_in_config"] and "clonefleet trust" in exc.message
    config = load_config(check_trust=False)  # the catalog must hold on its own
    catalog = load_catalog(root, (), config)
    for defn in catalog.definitions.values():  # what a batch or a nested spawn may start
        assert not [n for n, e in defn.mcp_servers if e], defn.path
    assert not [s for s in load_skills(root, (), config).skills.values() if "MARKER" in s.path]
    wanted = strongest(spec)
    for name in NAMES:
        if wanted.get(name):
            with pytest.raises(DefinitionError, match="clonefleet trust"):
                catalog.get(name)
            continue
        if name not in catalog.definitions:
            continue
        plan = plan_batch(name, "summarise the README", 1, config=config, caller_cwd=root)
        assert started(plan.submission.specs) == set()


def check_trusted(root: Path, spec: dict[str, Any]) -> None:
    trust_folder(root)
    config = load_config()
    for name, servers_of in strongest(spec).items():
        plan = plan_batch(name, "summarise the README", 1, config=config, caller_cwd=root)
        assert started(plan.submission.specs) == servers_of, name


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=project())
def test_nothing_an_untrusted_project_brings_starts_until_trust(
    spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with tempfile.TemporaryDirectory() as tmp, monkeypatch.context() as env:
        base = Path(tmp)
        for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
            (base / name).mkdir()
            env.setenv(name, str(base / name))
        env.delenv("CLONEFLEET_CONFIG", raising=False)
        root = (base / "project").resolve()
        write_project(root, spec)
        env.chdir(root)
        check_untrusted(root, spec)
        check_trusted(root, spec)
        assert not any(p.name in ("MARKER", "HOOK") for p in base.rglob("*")), os.listdir(root)
