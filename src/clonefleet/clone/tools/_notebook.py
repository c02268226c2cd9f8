"""The ``notebook_edit`` tool: replace, insert or delete one cell of a Jupyter notebook.

The notebook is plain JSON (nbformat 4), read and written here without nbformat: the structure
is checked (a ``cells`` list of cells with a known ``cell_type`` and a text or list ``source``)
and a malformed file is refused with the reason. Paths go through the launch-directory sandbox
(``_confine``), the file may be at most :data:`MAX_NOTEBOOK_BYTES`, and the new file is written
to a temporary name in the same directory and renamed over the old one, so a reader never sees
half a notebook. The work runs off the event loop under the call's deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from clonefleet.clone.tools._confine import open_checked, resolve_inside
from clonefleet.clone.tools._tool import ToolContext, off_loop
from clonefleet.errors import ToolRetry

__all__ = ["CELL_TYPES", "EDIT_MODES", "MAX_NOTEBOOK_BYTES", "edit_cells", "notebook_tool"]

MAX_NOTEBOOK_BYTES = 16 * 1024 * 1024
"""Largest notebook file read or written."""
CELL_TYPES = ("code", "markdown", "raw")
EDIT_MODES = ("replace", "insert", "delete")


def _malformed(path: str, why: str) -> ToolRetry:
    return ToolRetry(f"{path} is not a notebook this tool can edit: {why}")


def _check(nb: Any, path: str) -> list[dict[str, Any]]:
    """The notebook's cells, after its structure passed the checks."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise _malformed(path, "its top level needs a `cells` list")
    if nb.get("nbformat") != 4:
        raise _malformed(path, f"nbformat {nb.get('nbformat')!r} (only 4 is supported)")
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") not in CELL_TYPES:
            raise _malformed(path, f"cell {i} has no known cell_type")
        src = cell.get("source")
        if not isinstance(src, str) and not (
            isinstance(src, list) and all(isinstance(s, str) for s in src)
        ):
            raise _malformed(path, f"cell {i} has no text source")
    return nb["cells"]  # type: ignore[no-any-return]


def _index(cells: list[dict[str, Any]], args: dict[str, Any], *, insert: bool) -> int | None:
    """The cell the call names (``cell_id`` or ``cell_number``); for ``insert``, the position
    of the new cell, ``None`` for neither (the beginning)."""
    if args.get("cell_id") is not None:
        found = [i for i, c in enumerate(cells) if c.get("id") == args["cell_id"]]
        if not found:
            raise ToolRetry(f"no cell has id {args['cell_id']!r}")
        return found[0] + 1 if insert else found[0]
    number = args.get("cell_number")
    if number is None:
        if insert:
            return None
        raise ToolRetry("name the cell with cell_id or cell_number")
    if not 0 <= number < len(cells) + (1 if insert else 0):
        raise ToolRetry(
            f"cell_number {number} is out of range: the notebook has {len(cells)} cells"
        )
    return int(number)


def _new_cell(cell_type: str, source: str, with_id: bool) -> dict[str, Any]:
    cell: dict[str, Any] = {"cell_type": cell_type, "metadata": {}, "source": _lines(source)}
    if with_id:
        cell["id"] = secrets.token_hex(4)
    if cell_type == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def _lines(source: str) -> list[str]:
    return source.splitlines(keepends=True)


def _retype(cell: dict[str, Any], cell_type: str) -> None:
    cell["cell_type"] = cell_type
    if cell_type == "code":
        cell.setdefault("outputs", [])
        cell.setdefault("execution_count", None)
    else:
        cell.pop("outputs", None)
        cell.pop("execution_count", None)


def edit_cells(nb: dict[str, Any], args: dict[str, Any], path: str) -> str:
    """Apply one edit to the notebook ``nb`` (in place); returns what was done.

    Raises:
        ToolRetry: a malformed notebook, or arguments that name no cell.
    """
    cells = _check(nb, path)
    mode = str(args.get("edit_mode") or "replace")
    source, cell_type = args.get("new_source"), args.get("cell_type")
    if mode != "delete" and source is None:
        raise ToolRetry(f"edit_mode {mode} needs new_source")
    if mode == "insert":
        if cell_type is None:
            raise ToolRetry("edit_mode insert needs cell_type (code or markdown)")
        at: int = _index(cells, args, insert=True) or 0
        with_id = nb.get("nbformat_minor", 0) >= 5 or any("id" in c for c in cells)
        cells.insert(at, _new_cell(str(cell_type), str(source), with_id))
        return f"inserted a {cell_type} cell at position {at} of {path}"
    index = _index(cells, args, insert=False)
    assert index is not None
    if mode == "delete":
        del cells[index]
        return f"deleted cell {index} of {path}"
    cell = cells[index]
    if cell_type is not None and cell_type != cell["cell_type"]:
        _retype(cell, str(cell_type))
    cell["source"] = _lines(str(source))
    if cell["cell_type"] == "code":
        cell.update(execution_count=None, outputs=[])  # they belonged to the old source
    return f"replaced cell {index} of {path}"


def _read(root: Path, real: Path, path: str) -> tuple[dict[str, Any], int]:
    """The notebook's JSON and the file's permission bits."""
    fd = open_checked(root, real, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ToolRetry(f"{path} is not a file")
        data = fh.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ToolRetry(f"{path} is larger than {MAX_NOTEBOOK_BYTES // (1024 * 1024)} MiB")
    try:
        nb = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _malformed(path, f"not JSON ({str(exc)[:200]})") from None
    return nb, stat.S_IMODE(st.st_mode)


def _write_atomically(root: Path, real: Path, text: str, mode: int) -> None:
    data = text.encode("utf-8")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ToolRetry(f"the edited notebook would be larger than {MAX_NOTEBOOK_BYTES} bytes")
    dir_fd = open_checked(root, real.parent, os.O_RDONLY | os.O_DIRECTORY)
    tmp = f".{real.name}.{secrets.token_hex(4)}.tmp"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, real.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    except OSError as exc:
        raise ToolRetry(f"cannot write {real.name}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)


def _edit(root: Path, args: dict[str, Any]) -> str:
    path = str(args["path"])
    if not path.endswith(".ipynb"):
        raise ToolRetry(f"{path} is not a notebook: notebook_edit edits .ipynb files")
    real = resolve_inside(root, path)
    nb, mode = _read(root, real, path)
    done = edit_cells(nb, args, path)
    _write_atomically(root, real, json.dumps(nb, indent=1, ensure_ascii=False) + "\n", mode)
    return done


async def notebook_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    return await off_loop(ctx, "notebook_edit", lambda _: _edit(ctx.root, args))
