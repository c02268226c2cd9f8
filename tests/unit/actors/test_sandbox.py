"""The launch-directory sandbox: the check, the symlink-proof open, and each file tool refusing escapes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from clonefleet.actors import (
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
