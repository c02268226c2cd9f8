"""What a ``shell`` command writes (docs/permissions.md#what-a-command-writes): redirections and
the output options of commands granted as read-only are checked as writes of their paths, apart
from the command, whatever compound command they hide in."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from clonefleet.clone import Clone
from clonefleet.permissions import ALLOW_ALL, Policy, RuleSet, parse_rules
from clonefleet.permissions._commands import read_command
from clonefleet.testing import FunctionModel, call, make_spec, reply

ROOT = "/work/proj"


def policy(*allow: str, deny: tuple[str, ...] = ()) -> Policy:
    rules = RuleSet(
        source="config",
        allow=parse_rules(allow, "permissions.allow"),
        deny=parse_rules(deny, "permissions.deny", deny=True),
    )
    return ALLOW_ALL.child(rules, ROOT)


def denial(p: Policy, command: str) -> str | None:
    found = p.decide("shell", {"command": command})
    return None if found is None else found.message


ESCAPES = [
    "git diff HEAD > ../outside",
    "git diff HEAD >> ../outside",
    "git diff HEAD 2> ../outside",
    "git diff HEAD &> ../outside",
    "git diff HEAD >| ../outside",
    "git diff HEAD 1<>../outside",
    "git diff HEAD >&../outside",
    "git diff HEAD>'../outside'",
    "git diff --output=../outside",
    "git diff --output ../outside",
    "git diff --out=../outside",  # git takes an unambiguous abbreviation
    "git diff > /tmp/outside",
    "git diff > ~/outside",
    # compound commands: every part's writes count
    "git diff; git diff > ../outside",
    "git diff && git diff --output=../outside",
    "git diff || git diff > ../outside",
    "git diff | git diff --output=../outside",
    "git diff $(git diff > ../outside)",
    "git diff `git diff --output=../outside`",
    'git diff "$(git diff > ../outside)"',
    "(git diff > ../outside)",
    "git diff\ngit diff > ../outside",
]


@pytest.mark.parametrize("command", ESCAPES)
def test_a_command_rule_does_not_let_a_command_write_outside_the_launch_directory(
    command: str,
) -> None:
    for p in (policy("Bash(git diff:*)"), policy("Bash(git diff:*)", "Write")):
        assert denial(p, command) is not None, command


def test_the_refusal_names_the_path_and_what_would_allow_it() -> None:
    message = denial(policy("Bash(git diff:*)"), "git diff HEAD > ../outside")
    assert message == (
        "not allowed by config permissions: this shell command writes to ../outside, and a"
        " command rule grants no writes; a Write or Edit allow rule must cover that path"
        " (docs/permissions.md)"
    )


@pytest.mark.parametrize(
    "command",
    [
        "git diff HEAD",
        "git diff --stat HEAD~1",
        "git diff 2>&1",
        "git diff 2>/dev/null",
        "git diff >&2",
        "git diff > /dev/null 2>&1",
        "git diff -- --output=x",  # after `--` it is a path to diff, not an option
    ],
)
def test_ordinary_commands_and_harmless_redirections_stay_allowed(command: str) -> None:
    assert denial(policy("Bash(git diff:*)"), command) is None


def test_a_write_inside_the_launch_directory_needs_a_write_rule() -> None:
    command = "git diff > ./inside.txt"
    assert denial(policy("Bash(git diff:*)"), command) is not None
    assert denial(policy("Bash(git diff:*)", "Write"), command) is None
    assert denial(policy("Bash(git diff:*)", "Edit"), command) is None  # Edit covers writes
    narrow = policy("Bash(git diff:*)", "Write(./out/**)")
    assert denial(narrow, "git diff > out/a.txt") is None
    assert denial(narrow, "git diff --output=out/a.txt") is None
    assert denial(narrow, command) is not None


def test_a_write_outside_needs_a_rule_that_names_its_path() -> None:
    p = policy("Bash(git diff:*)", "Write", "Write(//tmp/reports/**)")
    assert denial(p, "git diff > /tmp/reports/a.diff") is None
    assert denial(p, "git diff > /tmp/elsewhere.diff") is not None
    assert denial(p, "git diff > out/../../outside") is not None  # `..` is folded first


@pytest.mark.parametrize(
    "command",
    [
        "git diff > $HOME/x",
        "git diff > *.txt",
        'git diff > "a b"',
        "git diff > x$(id)",
        "cd .. && git diff > inside.txt",  # a relative path after `cd` is not in the launch dir
        "git -C .. diff --output=inside.txt",
        "git diff --output",  # the value comes from somewhere else
    ],
)
def test_a_target_that_cannot_be_told_is_refused_by_a_write_rule(command: str) -> None:
    p = policy("Bash(git diff:*)", "Bash(cd:*)", "Bash(git -C:*)", "Write")
    assert denial(p, command) is not None


def test_taking_a_target_out_never_hides_a_command() -> None:
    # The target ends at the first blank: the `; rm -rf ~ ;` stays a command of its own.
    p = policy("Bash(git diff:*)", "Write")
    assert denial(p, 'git diff > " ; rm -rf ~ ; echo "') is not None
    # In /bin/sh `&>` may be `&` then `>`: the `&` still separates two commands.
    assert denial(p, "git diff &> out.txt rm -rf ~") is not None


@pytest.mark.parametrize(
    ("command", "targets"),
    [
        ("sort -o out.txt in.txt", ("out.txt",)),
        ("sort -uoout.txt in.txt", ("out.txt",)),
        ("sort --output=o.txt in.txt", ("o.txt",)),
        ("sort -t o in.txt", ()),  # `o` is -t's value
        ("tee -a a.txt b.txt", ("a.txt", "b.txt")),
        ("find . -name x -fprint list.txt", ("list.txt",)),
        ("git format-patch -o patches HEAD~2", ("patches",)),
        ("git grep -o pattern", ()),  # -o is --only-matching there
        ("env X=1 git diff --output=d.txt", ("d.txt",)),
        ("echo a > x 2>> y", ("x", "y")),
    ],
)
def test_output_options_of_read_only_commands_are_write_targets(
    command: str, targets: tuple[str, ...]
) -> None:
    reading = read_command(command, 512)
    assert reading is not None
    assert reading.targets == targets


def test_deny_rules_on_paths_apply_to_what_any_command_writes() -> None:
    p = policy("Bash", deny=("Write(//etc/**)",))
    assert denial(p, "echo x > /etc/passwd") == (
        "denied by rule Write(//etc/**) (config permissions.deny): the command writes to"
        " /etc/passwd"
    )
    assert denial(p, "echo x > $TARGET") is not None  # could be /etc/passwd
    assert denial(p, "echo x > /tmp/ok") is None  # `Bash` grants shell whole, writes with it
    assert denial(policy("Bash", deny=("Write",)), "echo x > notes.txt") is not None
    assert denial(policy("Bash", deny=("Write",)), "echo x") is None


def test_shell_granted_whole_grants_its_writes() -> None:
    for p in (policy(), policy("Bash"), policy("Bash", "Write(./out/**)")):
        assert denial(p, "git diff > ../outside") is None


def test_hostile_write_rules_and_many_targets_are_checked_quickly() -> None:
    hostile = tuple("Write(" + "/".join(["*a*?"] * 30) + f"{i})" for i in range(256))
    p = policy("Bash(echo:*)", *hostile[:255], deny=hostile)
    target = "/".join(["a" * 10] * 15)
    started = time.monotonic()
    assert denial(p, "echo " + " ".join(f">{target}{i}" for i in range(8))) is not None
    assert time.monotonic() - started < 10
    # Past eight different targets the command is too long to check: a patterned deny denies it.
    many = "echo " + " ".join(f"> f{i}" for i in range(9))
    assert denial(policy("Bash", deny=("Bash(rm:*)",)), many) is not None
    assert denial(policy("Bash"), many) is None
    assert read_command("echo " + "> same " * 50, 512) is not None  # the same target counts once


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty git repository in ``tmp_path/repo``."""
    launch = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(launch)], check=True)
    return launch


async def test_a_clone_granted_git_diff_cannot_write_outside_its_launch_directory(
    tmp_path: Path, repo: Path
) -> None:
    launch = repo
    rules = RuleSet(source="definition reviewer", allow=parse_rules(["Bash(git diff:*)"], "tools"))
    spec = make_spec(tools=("shell",), cwd=str(launch), policy=ALLOW_ALL.child(rules, str(launch)))
    commands = [
        "git diff HEAD > ../outside",
        "git diff --output=../outside",
        "git diff; git diff --output ../outside",
        "git diff > inside.txt",
        "git diff --stat",
    ]
    seen: list[Any] = []

    def model(req: Any) -> Any:
        seen.append(req)
        if len(seen) <= len(commands):
            return reply("", call("shell", f"c{len(seen)}", command=commands[len(seen) - 1]))
        return reply("", call("exit_tool", "cx", success=True, summary="done"))

    assert (await Clone(spec, FunctionModel(model)).run()).status == "completed"
    answers = [req.messages[-1] for req in seen[1:]]
    assert [a.is_error for a in answers] == [True, True, True, True, False]
    assert "writes to ../outside" in answers[0].content
    assert answers[4].content.startswith("exit status 0")
    assert not (tmp_path / "outside").exists() and not (launch / "inside.txt").exists()
