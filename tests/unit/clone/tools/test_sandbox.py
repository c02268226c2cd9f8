"""The launch-directory sandbox: the check, the symlink-proof open, and each file tool refusing escapes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from clonefleet.clone import (
    WORK_TOOL_TABLE,
    ToolContext,
    open_checked,
    open_inside,
    resolve_inside,
)
from clonefleet.errors import ToolRetry

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """``(root, outside)``: a launch directory ``proj`` and, beside it, ``proj_evil`` with a secret."""
    root, outside = tmp_path / "proj", tmp_path / "proj_evil"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "inside.txt").write_text("inside text\n")
    (root / "sub" / "data.txt").write_text("sub data\n")
    (outside / "secret.txt").write_text("TOPSECRET\n")
    (outside / "data.txt").write_text("TOPSECRET data\n")
    return root, outside


async def run(tool: str, root: Path, **args: object) -> str:
    return await WORK_TOOL_TABLE[tool].run(dict(args), ToolContext(root=root))


# -- the check ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../proj_evil/secret.txt",
        "sub/../../proj_evil/secret.txt",
        "sub/../..",
        "/etc/passwd",
        "/",
        "a\0b",
    ],
)
def test_escaping_paths_are_refused(tree, path):
    root, _ = tree
    with pytest.raises(ToolRetry):
        resolve_inside(root, path)


def test_prefix_trick_absolute_path_of_a_sibling_is_refused(tree):
    root, outside = tree
    # `<tmp>/proj_evil` starts with the text `<tmp>/proj`; only whole path parts count.
    assert str(outside / "secret.txt").startswith(str(root))
    with pytest.raises(ToolRetry, match="outside the launch directory"):
        resolve_inside(root, str(outside / "secret.txt"))


@pytest.mark.parametrize(
    "path", [".", "inside.txt", "sub/../inside.txt", "sub/data.txt", "new/dir/file.txt"]
)
def test_paths_inside_are_accepted(tree, path):
    root, _ = tree
    real = resolve_inside(root, path)
    assert real == Path(os.path.realpath(root)) / os.path.normpath(path)


def test_absolute_path_inside_is_accepted(tree):
    root, _ = tree
    assert resolve_inside(root, str(root / "sub" / "data.txt")).read_text() == "sub data\n"


def test_symlinks_are_judged_by_where_they_lead(tree):
    root, outside = tree
    (root / "out_link").symlink_to(outside / "secret.txt")
    (root / "out_dir").symlink_to(outside, target_is_directory=True)
    (root / "in_link").symlink_to(root / "sub" / "data.txt")
    with pytest.raises(ToolRetry):
        resolve_inside(root, "out_link")
    with pytest.raises(ToolRetry):
        resolve_inside(root, "out_dir/secret.txt")
    assert resolve_inside(root, "in_link") == Path(os.path.realpath(root / "sub" / "data.txt"))


# -- the open: a symlink swapped in after the check ---------------------------------------------
def test_final_component_swapped_for_a_symlink_after_the_check_is_refused(tree):
    root, outside = tree
    checked = resolve_inside(root, "inside.txt")
    (root / "inside.txt").unlink()
    (root / "inside.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolRetry, match="symbolic link"):
        open_checked(root, checked, os.O_RDONLY)


def test_intermediate_directory_swapped_for_a_symlink_after_the_check_is_refused(tree):
    root, outside = tree
    checked = resolve_inside(root, "sub/data.txt")
    (root / "sub").rename(root / "sub_old")
    (root / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ToolRetry, match="symbolic link"):
        open_checked(root, checked, os.O_RDONLY)


def test_write_through_a_directory_swapped_after_the_check_creates_nothing_outside(tree):
    root, outside = tree
    checked = resolve_inside(root, "sub/new.txt")
    (root / "sub").rename(root / "sub_old")
    (root / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ToolRetry):
        open_checked(root, checked, os.O_WRONLY | os.O_CREAT, make_parents=True)
    assert not (outside / "new.txt").exists()


def test_open_inside_creates_missing_parents_and_reads_back(tree):
    root, _ = tree
    fd = open_inside(root, "a/b/c.txt", os.O_WRONLY | os.O_CREAT, make_parents=True)
    os.write(fd, b"made")
    os.close(fd)
    assert (root / "a" / "b" / "c.txt").read_text() == "made"


def test_open_checked_refuses_a_path_it_was_not_given_by_the_check(tree):
    root, outside = tree
    with pytest.raises(ToolRetry, match="outside"):
        open_checked(root, outside / "secret.txt", os.O_RDONLY)


# -- every file tool refuses escapes ------------------------------------------------------------
async def test_file_read_reads_inside_and_refuses_outside(tree):
    root, outside = tree
    (root / "link").symlink_to(outside / "secret.txt")
    assert await run("file_read", root, path="sub/data.txt") == "sub data\n"
    for path in ("../proj_evil/secret.txt", str(outside / "secret.txt"), "link"):
        with pytest.raises(ToolRetry):
            await run("file_read", root, path=path)


async def test_file_write_refuses_outside_and_writes_nothing_there(tree):
    root, outside = tree
    (root / "out_dir").symlink_to(outside, target_is_directory=True)
    for path in ("../proj_evil/new.txt", str(outside / "new.txt"), "out_dir/new.txt"):
        with pytest.raises(ToolRetry):
            await run("file_write", root, path=path, content="x")
    assert sorted(p.name for p in outside.iterdir()) == ["data.txt", "secret.txt"]
    assert "wrote 5 characters" in await run(
        "file_write", root, path="deep/er/f.txt", content="hello"
    )
    assert (root / "deep" / "er" / "f.txt").read_text() == "hello"


async def test_file_edit_refuses_outside_and_leaves_the_file_alone(tree):
    root, outside = tree
    (root / "link").symlink_to(outside / "secret.txt")
    for path in ("../proj_evil/secret.txt", "link"):
        with pytest.raises(ToolRetry):
            await run("file_edit", root, path=path, old_string="TOPSECRET", new_string="gone")
    assert (outside / "secret.txt").read_text() == "TOPSECRET\n"
    await run("file_edit", root, path="inside.txt", old_string="inside", new_string="edited")
    assert (root / "inside.txt").read_text() == "edited text\n"


async def test_list_dir_refuses_outside_and_marks_links(tree):
    root, outside = tree
    (root / "out_dir").symlink_to(outside, target_is_directory=True)
    for path in ("..", str(outside), "out_dir", "../proj_evil"):
        with pytest.raises(ToolRetry):
            await run("list_dir", root, path=path)
    assert (await run("list_dir", root)).splitlines() == ["inside.txt", "out_dir@", "sub/"]


async def test_glob_refuses_escaping_patterns_and_never_lists_outside_files(tree):
    root, outside = tree
    (root / "out_dir").symlink_to(outside, target_is_directory=True)
    for args in (
        {"pattern": "../*"},
        {"pattern": str(outside / "*")},
        {"pattern": "*", "path": ".."},
        {"pattern": "*", "path": "out_dir"},
    ):
        with pytest.raises(ToolRetry):
            await run("glob", root, **args)
    listed = (await run("glob", root, pattern="**/*.txt")).splitlines()
    assert listed == ["inside.txt", "sub/data.txt"]
    assert await run("glob", root, pattern="*.txt", path="sub") == "sub/data.txt"


async def test_grep_refuses_outside_and_never_reads_through_links(tree):
    root, outside = tree
    (root / "out_dir").symlink_to(outside, target_is_directory=True)
    (root / "out_file.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolRetry):
        await run("grep", root, pattern="TOPSECRET", path="..")
    assert await run("grep", root, pattern="TOPSECRET") == "no matches"
    assert await run("grep", root, pattern="data", include="*.txt") == "sub/data.txt:1:sub data"


async def test_shell_runs_in_the_launch_directory(tree):
    root, _ = tree
    out = await run("shell", root, command="pwd; cat inside.txt")
    assert out.splitlines() == ["exit status 0", str(root.resolve()), "inside text"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def test_shell_timeout_kills_the_command_and_its_children(tree, tmp_path):
    root, _ = tree
    pidfile = tmp_path / "child.pid"
    command = f"sleep 30 & echo $! > {pidfile}; wait"
    with pytest.raises(ToolRetry, match="timed out"):
        await WORK_TOOL_TABLE["shell"].run(
            {"command": command}, ToolContext(root=root, shell_timeout_s=0.3)
        )
    pid = int(pidfile.read_text())
    for _ in range(100):  # bounded poll: the background child was in the killed process group
        if not _alive(pid):
            break
        await asyncio.sleep(0.02)
    assert not _alive(pid)


# -- escapes the check must keep refusing, tool by tool -----------------------------------------
async def test_relative_and_chained_symlinks_out_are_refused_by_every_reading_tool(tree):
    root, outside = tree
    (root / "rel_link").symlink_to(Path("..") / "proj_evil" / "secret.txt")
    (root / "hop").symlink_to(root / "rel_link")  # inside -> inside -> outside
    (root / "up").symlink_to(Path(".."), target_is_directory=True)
    (root / "out_dir").symlink_to(outside, target_is_directory=True)
    for path in ("rel_link", "hop", "up/proj_evil/secret.txt", "out_dir/secret.txt"):
        with pytest.raises(ToolRetry, match="outside the launch directory"):
            await run("file_read", root, path=path)
        with pytest.raises(ToolRetry, match="outside the launch directory"):
            await run("file_edit", root, path=path, old_string="TOPSECRET", new_string="x")
    for path in ("up", "out_dir", "up/proj_evil"):
        with pytest.raises(ToolRetry, match="outside the launch directory"):
            await run("grep", root, pattern="TOPSECRET", path=path)
        with pytest.raises(ToolRetry, match="outside the launch directory"):
            await run("glob", root, pattern="*", path=path)
    assert await run("grep", root, pattern="TOPSECRET") == "no matches"
    assert "secret" not in await run("glob", root, pattern="**/*")
    assert (outside / "secret.txt").read_text() == "TOPSECRET\n"


async def test_write_through_symlinks_and_dotdot_changes_nothing_outside(tree):
    root, outside = tree
    (root / "rel_link").symlink_to(Path("..") / "proj_evil" / "secret.txt")
    (root / "up").symlink_to(Path(".."), target_is_directory=True)
    for path in ("rel_link", "up/proj_evil/secret.txt", "sub/../../proj_evil/secret.txt"):
        with pytest.raises(ToolRetry, match="outside the launch directory"):
            await run("file_write", root, path=path, content="owned")
    with pytest.raises(ToolRetry, match="outside the launch directory"):
        await run("file_write", root, path=str(outside / "secret.txt"), content="owned")
    assert (outside / "secret.txt").read_text() == "TOPSECRET\n"
    assert sorted(p.name for p in outside.iterdir()) == ["data.txt", "secret.txt"]


# -- hard links: a second name of a file may be outside; refused on the opened descriptor ---------
@pytest.fixture
def linked(tree: tuple[Path, Path]) -> tuple[Path, Path]:
    """``tree`` plus ``proj/link.txt`` and ``proj/sub/hard.txt``: hard links to outside files."""
    root, outside = tree
    os.link(outside / "secret.txt", root / "link.txt")
    os.link(outside / "data.txt", root / "sub" / "hard.txt")
    return root, outside


def _outside_unchanged(outside: Path) -> None:
    assert (outside / "secret.txt").read_text() == "TOPSECRET\n"
    assert (outside / "data.txt").read_text() == "TOPSECRET data\n"
    assert os.stat(outside / "secret.txt").st_nlink == 2  # the link itself is left alone


async def test_file_read_refuses_a_hard_link_to_a_file_outside(linked):
    root, outside = linked
    for path in ("link.txt", "sub/hard.txt", str(root / "link.txt")):
        with pytest.raises(ToolRetry, match="2 hard links"):
            await run("file_read", root, path=path)
    _outside_unchanged(outside)


async def test_file_write_refuses_a_hard_link_and_truncates_nothing(linked):
    root, outside = linked
    for path in ("link.txt", "sub/hard.txt"):
        with pytest.raises(ToolRetry, match="hard links"):
            await run("file_write", root, path=path, content="owned")
        with pytest.raises(ToolRetry, match="hard links"):
            await run("file_write", root, path=path, content="")
    _outside_unchanged(outside)


async def test_file_edit_refuses_a_hard_link(linked):
    root, outside = linked
    with pytest.raises(ToolRetry, match="hard links"):
        await run("file_edit", root, path="link.txt", old_string="TOPSECRET", new_string="owned")
    _outside_unchanged(outside)


async def test_grep_skips_hard_links_and_says_so(linked):
    root, outside = linked
    out = (await run("grep", root, pattern="TOPSECRET|data")).splitlines()
    assert out == [
        "sub/data.txt:1:sub data",
        "[2 files with more than one hard link were not searched]",
    ]
    _outside_unchanged(outside)


def test_open_checked_refuses_a_hard_link_before_o_trunc_takes_effect(linked):
    root, outside = linked
    checked = resolve_inside(root, "link.txt")
    with pytest.raises(ToolRetry, match="hard links"):
        open_checked(root, checked, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with pytest.raises(ToolRetry, match="hard links"):
        open_checked(root, checked, os.O_RDONLY)
    _outside_unchanged(outside)


async def test_a_file_linked_twice_inside_is_refused_too_and_one_link_is_fine(tree):
    root, _ = tree
    os.link(root / "inside.txt", root / "twin.txt")
    with pytest.raises(ToolRetry, match="hard links"):
        await run("file_read", root, path="inside.txt")
    (root / "twin.txt").unlink()
    assert await run("file_read", root, path="inside.txt") == "inside text\n"
    await run("file_write", root, path="inside.txt", content="new")
    assert (root / "inside.txt").read_text() == "new"


async def test_file_tools_refuse_a_named_pipe_without_waiting_for_a_writer(tree):
    root, _ = tree
    os.mkfifo(root / "pipe")
    with pytest.raises(ToolRetry, match="not a file"):
        await run("file_read", root, path="pipe")
    with pytest.raises(ToolRetry):
        await run("file_write", root, path="pipe", content="x")
    assert await run("grep", root, pattern="inside") == "inside.txt:1:inside text"


async def test_shell_commands_do_not_see_the_clusters_token(tree, monkeypatch):
    root, _ = tree
    monkeypatch.setenv("RAY_AUTH_TOKEN", "cf-canary-token-0123")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/secret/path/auth_token")
    out = await run("shell", root, command="env")
    assert "cf-canary-token-0123" not in out and "/secret/path/auth_token" not in out
    assert out.startswith("exit status 0")
