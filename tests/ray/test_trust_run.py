"""`clonefleet run` in a cloned repository that is not trusted, end to end (its own embedded Ray,
the simulated provider): a definition from a folder the project's config adds to discovery, or
inline in that config, names an MCP server whose command would touch a marker file. The run is
refused before anything starts and names `clonefleet trust`; after `clonefleet trust` the
server's command runs on the clone host.

Each test has its own HOME, XDG folders and state folder, so the trust records are its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def _env(tmp_path: Path) -> dict[str, str]:
    env = {}
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "CLONEFLEET_STATE_DIR"):
        (tmp_path / name).mkdir()
        env[name] = str(tmp_path / name)
    return env


def _server(marker: Path) -> str:
    return f'{{helper: {{command: [sh, -c, "touch {marker}"]}}}}'


def _extra_dir_project(root: Path, marker: Path) -> Path:
    (root / ".clonefleet" / "agents").mkdir(parents=True)
    (root / ".clonefleet" / "config.yaml").write_text(
        "discovery:\n  extra_subagents_dirs: [agents]\n"
    )
    definition = root / ".clonefleet" / "agents" / "general-purpose.md"
    definition.write_text(
        f"---\nname: general-purpose\ndescription: d\nmcpServers: {_server(marker)}\n---\nbody\n"
    )
    return definition


def _inline_project(root: Path, marker: Path) -> Path:
    (root / ".clonefleet").mkdir(parents=True)
    config = root / ".clonefleet" / "config.yaml"
    config.write_text(
        "subagents:\n  general-purpose:\n    description: d\n    prompt: body\n"
        f"    mcp_servers: {_server(marker)}\n"
    )
    return Path(f"{config}:subagents.general-purpose")


@pytest.mark.parametrize("make", [_extra_dir_project, _inline_project], ids=["extra-dir", "inline"])
def test_an_untrusted_projects_server_command_runs_only_after_trust(cli_run, tmp_path, make):
    root = (tmp_path / "repo").resolve()
    marker = tmp_path / "MARKER"
    source = make(root, marker)
    env = _env(tmp_path)

    def run(*args: str):
        return cli_run(*args, cwd=root, env=env)

    refused = run("run", "general-purpose", "--prompt", "summarise the README")
    assert refused.returncode == 2, refused.stderr
    assert refused.stdout == "" and not marker.exists()
    error = refused.stderr.splitlines()[-1]
    assert error.startswith(f"clonefleet: error: {source}: invalid-definition: ")
    assert "'helper'" in error and f"touch {marker}" in error
    assert f"`clonefleet trust {root}`" in error

    validate = run("validate", "--json")
    assert validate.returncode == 1 and not marker.exists()

    trusted = run("trust")
    assert trusted.returncode == 0 and f"touch {marker}" in trusted.stdout

    ran = run("run", "general-purpose", "--prompt", "summarise the README")
    assert ran.returncode == 0, ran.stderr
    assert marker.exists()
