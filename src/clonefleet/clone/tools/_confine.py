"""The launch-directory sandbox of the file tools: every path a tool touches goes through here.

:func:`resolve_inside` is the check (``..``, absolute paths, prefix tricks and symbolic links that
leave the launch directory are refused); :func:`open_checked` is the use: it opens the checked
path one component at a time with ``O_NOFOLLOW`` and refuses a regular file with more than one
hard link, truncating a file only after that check. The ``shell`` tool is not confined by this
module. See docs/architecture.md, "Tools a clone can call".
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from clonefleet.errors import ToolRetry

__all__ = ["HardLinked", "open_checked", "open_inside", "resolve_inside"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SWAPPED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)
"""What ``O_NOFOLLOW`` (with ``O_DIRECTORY`` for a directory) answers for a symbolic link."""


class HardLinked(ToolRetry):
    """A regular file with more than one hard link was refused (see the module's text)."""


def resolve_inside(root: Path, path: str) -> Path:
    """Resolve ``path`` against ``root`` and refuse anything that lands outside it.

    Symbolic links are resolved first, so a link (or ``..``) that leaves the launch directory is
    refused, and ``root_evil/`` is not mistaken for ``root/`` (the check compares whole path parts).
    An absolute path is accepted only when it lies inside the launch directory.

    Returns:
        The real path (every symbolic link resolved) inside the launch directory.

    Raises:
        ToolRetry: the path escapes the launch directory, or is not a valid path.
    """
    if "\0" in path:
        raise ToolRetry("a path may not contain a NUL character")
    real_root = Path(os.path.realpath(root))
    candidate = Path(path)
    joined = candidate if candidate.is_absolute() else real_root / candidate
    real = Path(os.path.realpath(joined))
    if real != real_root and real_root not in real.parents:
        raise ToolRetry(f"path {path!r} is outside the launch directory {real_root}")
    return real


def open_checked(
    root: Path, real: Path, flags: int, *, make_parents: bool = False, mode: int = 0o644
) -> int:
    """Open ``real`` (a result of :func:`resolve_inside`) without following any symbolic link.

    Each component is opened relative to the previous one, from a descriptor of the launch
    directory, with ``O_NOFOLLOW``.

    Args:
        root: the launch directory.
        real: the checked real path inside it.
        flags: ``os.open`` flags for the last component (``O_NOFOLLOW`` is added).
        make_parents: create missing directories on the way (for writes).
        mode: permissions of a created file.

    Returns:
        An open file descriptor; the caller closes it.

    Raises:
        ToolRetry: the path left the launch directory, a component was swapped for a symbolic
            link, the file is a regular file with more than one hard link (refused before
            ``O_TRUNC`` takes effect), or the open failed (the message says why).
    """
    real_root = Path(os.path.realpath(root))
    try:
        parts = real.relative_to(real_root).parts
    except ValueError:
        raise ToolRetry(f"path {str(real)!r} is outside the launch directory {real_root}") from None
    fd = _open(real_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, None, real)
    try:
        for part in parts[:-1]:
            nxt = _step_into(fd, part, make_parents, real)
            os.close(fd)
            fd = nxt
        if not parts:  # the launch directory itself
            result, fd = fd, -1
            return result
        final = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC
        return _single_link(_open(parts[-1], final, fd, real, mode), real, flags & os.O_TRUNC)
    finally:
        if fd >= 0:
            os.close(fd)


def open_inside(
    root: Path, path: str, flags: int, *, make_parents: bool = False, mode: int = 0o644
) -> int:
    """:func:`resolve_inside` then :func:`open_checked`: a descriptor of ``path`` in the launch directory."""
    return open_checked(
        root, resolve_inside(root, path), flags, make_parents=make_parents, mode=mode
    )


def _single_link(fd: int, real: Path, truncate: int) -> int:
    """``fd`` when it is not a regular file with several hard links (then truncated if asked)."""
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise HardLinked(
                f"{real.name} has {st.st_nlink} hard links, and another name of it may be outside "
                "the launch directory; refused (copy it to work on it)"
            )
        if truncate and stat.S_ISREG(st.st_mode):
            os.ftruncate(fd, 0)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise ToolRetry(f"cannot open {real.name}: {exc.strerror}") from exc
        raise
    return fd


def _step_into(fd: int, part: str, make_parents: bool, real: Path) -> int:
    try:
        return _open(part, _DIR_FLAGS, fd, real)
    except ToolRetry as exc:
        if not (make_parents and isinstance(exc.__cause__, FileNotFoundError)):
            raise
    try:
        os.mkdir(part, 0o755, dir_fd=fd)
    except FileExistsError:
        pass  # made by someone else meanwhile; the open below checks what it is
    except OSError as exc:
        raise ToolRetry(f"cannot create directory {part!r}: {exc.strerror}") from exc
    return _open(part, _DIR_FLAGS, fd, real)


def _open(name: str | Path, flags: int, dir_fd: int | None, real: Path, mode: int = 0o644) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _SWAPPED and os.path.islink(
            real if dir_fd is None else _joined(dir_fd, name)
        ):
            raise ToolRetry(
                f"{real.name}: a symbolic link appeared on the path after it was checked; refused"
            ) from exc
        raise ToolRetry(f"cannot open {real.name}: {exc.strerror}") from exc


def _joined(dir_fd: int, name: str | Path) -> str:
    # Only used to word an error: whether the component that failed is now a symbolic link.
    return os.path.join(f"/proc/self/fd/{dir_fd}", name)
