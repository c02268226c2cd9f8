"""``notebook_edit``: replace, insert and delete cells of a real ``.ipynb`` file in the launch
directory; escapes, malformed notebooks and oversized files are refused; writes are atomic."""

from __future__ import annotations

import json
import os

import pytest

from clonefleet.clone import Clone, ToolContext
from clonefleet.clone.tools import _notebook as _notebook
from clonefleet.clone.tools._notebook import notebook_tool
from clonefleet.errors import ToolRetry
from clonefleet.testing import ScriptedModel, call, make_spec, reply

pytestmark = pytest.mark.timeout(20)


def notebook(minor: int = 5) -> dict:
    return {
        "nbformat": 4,
        "nbformat_minor": minor,
        "metadata": {"kernelspec": {"name": "python3"}},
        "cells": [
            {"id": "intro", "cell_type": "markdown", "metadata": {}, "source": ["# Title\n"]},
            {
                "id": "calc",
                "cell_type": "code",
                "metadata": {},
                "execution_count": 3,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["2\n"]}],
                "source": "print(1 + 1)",
            },
        ],
    }


@pytest.fixture
def nb(tmp_path):
    path = tmp_path / "work" / "nb.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(notebook()))
    os.chmod(path, 0o640)
    return path


async def edit(tmp_path, **args) -> str:
    return await notebook_tool(args, ToolContext(root=tmp_path))


def cells(path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


async def test_replace_by_id_or_number_clears_stale_outputs(tmp_path, nb):
    out = await edit(tmp_path, path="work/nb.ipynb", cell_id="calc", new_source="x = 2\nx")
    assert out == "replaced cell 1 of work/nb.ipynb"
    calc = cells(nb)[1]
    assert calc["source"] == ["x = 2\n", "x"]
    assert calc["outputs"] == [] and calc["execution_count"] is None
    await edit(
        tmp_path, path="work/nb.ipynb", cell_number=1, new_source="# Notes", cell_type="markdown"
    )
    changed = cells(nb)[1]
    assert changed["cell_type"] == "markdown" and "outputs" not in changed
    assert changed["id"] == "calc" and changed["source"] == ["# Notes"]
    # The rest of the file is kept, and so is its mode; nothing is left beside it.
    data = json.loads(nb.read_text())
    assert data["metadata"] == {"kernelspec": {"name": "python3"}} and data["nbformat_minor"] == 5
    assert os.stat(nb).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in nb.parent.iterdir()) == ["nb.ipynb"]


async def test_insert_after_an_id_at_a_number_or_at_the_beginning(tmp_path, nb):
    await edit(
        tmp_path,
        path="work/nb.ipynb",
        edit_mode="insert",
        cell_id="intro",
        cell_type="code",
        new_source="import os",
    )
    await edit(
        tmp_path,
        path="work/nb.ipynb",
        edit_mode="insert",
        cell_number=3,
        cell_type="markdown",
        new_source="end",
    )
    await edit(
        tmp_path, path="work/nb.ipynb", edit_mode="insert", cell_type="raw", new_source="start"
    )
    got = cells(nb)
    assert [c["source"] for c in got] == [
        ["start"],
        ["# Title\n"],
        ["import os"],
        "print(1 + 1)",
        ["end"],
    ]
    assert got[2]["outputs"] == [] and got[2]["execution_count"] is None
    assert all(len(c["id"]) == 8 for c in (got[0], got[2], got[4]))  # nbformat 4.5 cells have ids
    with pytest.raises(ToolRetry, match="insert needs cell_type"):
        await edit(tmp_path, path="work/nb.ipynb", edit_mode="insert", new_source="x")


async def test_delete_and_bad_targets(tmp_path, nb):
    assert await edit(tmp_path, path="work/nb.ipynb", edit_mode="delete", cell_id="intro") == (
        "deleted cell 0 of work/nb.ipynb"
    )
    assert [c["id"] for c in cells(nb)] == ["calc"]
    with pytest.raises(ToolRetry, match="no cell has id 'nope'"):
        await edit(tmp_path, path="work/nb.ipynb", cell_id="nope", new_source="x")
    with pytest.raises(ToolRetry, match="cell_number 5 is out of range: the notebook has 1 cells"):
        await edit(tmp_path, path="work/nb.ipynb", cell_number=5, new_source="x")
    with pytest.raises(ToolRetry, match="name the cell with cell_id or cell_number"):
        await edit(tmp_path, path="work/nb.ipynb", new_source="x")
    with pytest.raises(ToolRetry, match="needs new_source"):
        await edit(tmp_path, path="work/nb.ipynb", cell_number=0)


async def test_paths_outside_the_launch_directory_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside.ipynb"
    outside.write_text(json.dumps(notebook()))
    (root / "link.ipynb").symlink_to(outside)
    for path in ("../outside.ipynb", str(outside), "link.ipynb"):
        with pytest.raises(ToolRetry, match="outside the launch directory"):
            await notebook_tool(
                {"path": path, "cell_number": 0, "new_source": "x"}, ToolContext(root=root)
            )
    assert json.loads(outside.read_text()) == notebook()
    with pytest.raises(ToolRetry, match="edits .ipynb files"):
        await notebook_tool(
            {"path": "notes.txt", "cell_number": 0, "new_source": "x"}, ToolContext(root=root)
        )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "not JSON"),
        ("[]", "needs a `cells` list"),
        (json.dumps({"nbformat": 3, "cells": []}), "nbformat 3"),
        (json.dumps({"nbformat": 4, "cells": [{"cell_type": "weird", "source": ""}]}), "cell 0"),
        (json.dumps({"nbformat": 4, "cells": [{"cell_type": "code", "source": 5}]}), "text source"),
    ],
)
async def test_a_malformed_notebook_is_refused_and_left_alone(tmp_path, content, why):
    (tmp_path / "bad.ipynb").write_text(content)
    with pytest.raises(ToolRetry, match=why):
        await edit(tmp_path, path="bad.ipynb", cell_number=0, new_source="x")
    assert (tmp_path / "bad.ipynb").read_text() == content


async def test_an_oversized_notebook_is_refused(tmp_path, nb, monkeypatch):
    monkeypatch.setattr(_notebook, "MAX_NOTEBOOK_BYTES", 100)
    with pytest.raises(ToolRetry, match="larger than"):
        await edit(tmp_path, path="work/nb.ipynb", cell_number=0, new_source="x")


async def test_a_clone_edits_a_notebook_through_the_claude_name(tmp_path, nb):
    model = ScriptedModel(
        [
            reply(
                "",
                call(
                    "notebook_edit",
                    "c1",
                    path="work/nb.ipynb",
                    cell_id="calc",
                    new_source="print(3)",
                ),
            ),
            reply("", call("notebook_edit", "c2", path="work/nb.ipynb", edit_mode="sideways")),
            reply("", call("exit_tool", "cx", success=True, summary="ok")),
        ]
    )
    spec = make_spec(tools=("NotebookEdit",), cwd=str(tmp_path))
    assert (await Clone(spec, model).run()).status == "completed"
    assert cells(nb)[1]["source"] == ["print(3)"]
    bad = model.calls[2].messages[-1]
    assert bad.is_error and "invalid arguments for notebook_edit: edit_mode" in bad.content
