"""Hostile definition files: bad YAML tags, FIFOs and devices, terminal escapes in names.

Each fails alone, with the loader's per-file report (or is shown escaped), and never stops
`validate`, `agents` or the planning of the good definitions beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clonefleet.cli import program as cli
from clonefleet.config import Config
from clonefleet.definitions import load_file, load_skills, validate_report
from clonefleet.errors import DefinitionError
from clonefleet.fleet import plan_batch

pytestmark = pytest.mark.timeout(30)

GOOD = "---\nname: good\ndescription: A good agent.\ntools: Read\n---\nDo {{ prompt }}\n"

BAD_VALUES = {
    "int": "!!int not-a-number",
    "float": "!!float x",
    "timestamp": "!!timestamp 2024-02-31",
    "bool": "!!bool maybe",
    "digits": "9" * 5000,
    "hex": "0x" + "f" * 5000,
    "binary": "!!binary '@@@'",
    "set": "!!set {a: null}",
}

UNSAFE = ["\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\x00"]


def bad_file(value: str) -> str:
    return f"---\nname: bad\ndescription: d\nmaxTurns: {value}\n---\nbody\n"


def agents_dir(root: Path) -> Path:
    folder = root / ".clonefleet" / "subagents"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("value", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_a_bad_yaml_value_is_invalid_frontmatter_naming_the_line(tmp_path: Path, value: str):
    path = tmp_path / "bad.md"
    path.write_text(bad_file(value))
    with pytest.raises(DefinitionError) as info:
        load_file(path)
    assert info.value.reason == "invalid-frontmatter"
    assert "(line 4)" in info.value.message
    assert len(info.value.message) < 300  # the 5,000 digits are not echoed back


@pytest.mark.parametrize("value", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_a_bad_file_never_breaks_validate_agents_or_run_of_the_good_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
):
    folder = agents_dir(tmp_path)
    (folder / "good.md").write_text(GOOD)
    (folder / "bad.md").write_text(bad_file(value))
    monkeypatch.chdir(tmp_path)

    code, out, _ = run_cli(["validate", "--json"], capsys)
    report = json.loads(out)
    assert code == 1
    assert "good" in [d["name"] for d in report["definitions"]]
    assert [(Path(e["path"]).name, e["reason"]) for e in report["errors"]] == [
        ("bad.md", "invalid-frontmatter")
    ]
    code, out, _ = run_cli(["validate"], capsys)
    assert code == 1 and "ok       good (claude)" in out and "invalid-frontmatter" in out

    code, out, _ = run_cli(["agents", "--json"], capsys)
    assert code == 0 and "good" in [a["name"] for a in json.loads(out)["agents"]]
    code, out, _ = run_cli(["agents"], capsys)
    assert code == 0 and "good" in out

    plan = plan_batch("good", "go", 2, config=Config(), caller_cwd=tmp_path)
    assert [s.task for s in plan.submission.specs] == ["go", "go"]
    with pytest.raises(DefinitionError) as info:
        plan_batch("bad", "go", 1, config=Config(), caller_cwd=tmp_path)
    assert info.value.reason == "invalid-frontmatter"


def cli_subprocess(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(cwd / "xdg")}
    return subprocess.run(
        [sys.executable, "-m", "clonefleet", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,  # a FIFO that is opened blocks forever: this ends the test instead
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_validate_refuses_a_fifo_named_on_the_command_line_without_blocking(tmp_path: Path):
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    out = cli_subprocess(["validate", str(fifo), "--json"], tmp_path)
    assert out.returncode == 1, out.stderr
    (error,) = json.loads(out.stdout)["errors"]
    assert error["reason"] == "io-error" and "not a regular file (a FIFO)" in error["message"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_a_discovery_folder_is_reported_and_the_rest_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    folder = agents_dir(tmp_path)
    (folder / "good.md").write_text(GOOD)
    os.mkfifo(folder / "pipe.md")
    skill = tmp_path / ".clonefleet" / "skills" / "piped"
    skill.mkdir(parents=True)
    os.mkfifo(skill / "SKILL.md")
    report = validate_report(cwd=tmp_path)
    assert "good" in [d["name"] for d in report["definitions"]]
    assert [(Path(e["path"]).name, e["reason"]) for e in report["errors"]] == [
        ("pipe.md", "io-error")
    ]
    assert "FIFO" in report["errors"][0]["message"]
    skills = load_skills(tmp_path)
    assert not skills.skills and [Path(e.path).name for e in skills.errors] == ["SKILL.md"]
    assert "not a regular file (a FIFO)" in skills.errors[0].message
    monkeypatch.chdir(tmp_path)
    assert plan_batch("good", "go", config=Config(), caller_cwd=tmp_path).job_ids


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_is_refused_unread(tmp_path: Path):
    with pytest.raises(DefinitionError) as info:
        load_file(Path("/dev/zero"))
    assert info.value.reason == "io-error"
    assert "not a regular file (a character device)" in info.value.message
    report = validate_report([Path("/dev/zero")], cwd=tmp_path)
    assert [e["reason"] for e in report["errors"]] == ["io-error"]


def test_a_path_too_long_to_look_at_is_an_io_error(tmp_path: Path):
    report = validate_report([tmp_path / ("x" * 5000)], cwd=tmp_path)
    assert [e["reason"] for e in report["errors"]] == ["io-error"]
    report = validate_report(cwd=tmp_path, subagents_dirs=[tmp_path / ("y" * 5000)])
    assert "io-error" in [e["reason"] for e in report["errors"]]


HOSTILE_DESCRIPTION = "\x1b[2J\x1b]0;pwned\x07 \u202eevil\u2066 [/bold] [red]x\x9b1m"


def hostile_project(root: Path) -> Path:
    folder = agents_dir(root)
    escaped = json.dumps(HOSTILE_DESCRIPTION)  # a YAML double-quoted string
    (folder / "shiny.md").write_text(
        f'---\nname: shiny\ndescription: {escaped}\n"odd\\e[1mkey": 1\n---\nbody\n'
    )
    (folder / "\x1b[31mred\u202e.md").write_text("---\ndescription: d\n---\nbody\n")
    return folder


def test_validate_escapes_control_characters_and_bidi_marks_but_json_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    folder = hostile_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["validate"], capsys)
    assert code == 1
    assert not [c for c in UNSAFE if c in out], out
    assert "\\x1b[31mred\\u202e.md" in out  # the file name, escaped
    assert "odd\\x1b[1mkey" in out  # the unknown key's warning, escaped
    code, out, _ = run_cli(["validate", "--json"], capsys)
    report = json.loads(out)
    assert str(folder / "\x1b[31mred\u202e.md") in [e["path"] for e in report["errors"]]


def test_agents_table_escapes_and_reads_no_markup_but_json_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    hostile_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["agents"], capsys)
    assert code == 0
    assert not [c for c in UNSAFE if c in out], out
    assert "\\x1b[2J" in out
    code, out, _ = run_cli(["agents", "--json"], capsys)
    by_name = {a["name"]: a for a in json.loads(out)["agents"]}
    assert by_name["shiny"]["description"] == HOSTILE_DESCRIPTION


def test_agents_table_shows_markup_like_text_literally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    (agents_dir(tmp_path) / "marked.md").write_text(
        "---\nname: marked\ndescription: '[/x] [bold]lit'\n---\nbody\n"
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["agents"], capsys)
    assert code == 0 and "[/x] [bold]lit" in out


def test_run_of_a_failed_file_reports_its_message_escaped(tmp_path: Path):
    (agents_dir(tmp_path) / "esc.md").write_text(
        '---\nname: esc\ndescription: d\nclonefleet:\n  "odd\\e[2Jkey": 1\n---\nbody\n'
    )
    with pytest.raises(DefinitionError) as info:
        plan_batch("esc", "go", config=Config(), caller_cwd=tmp_path)
    assert info.value.reason == "invalid-definition"
    assert "\x1b" not in str(info.value) and "odd\\x1b[2Jkey" in str(info.value)
