"""The journal's folder: file names, making and checking the folder, and reading it back.

Reading (:func:`read_journal`) only reads. Repairing a torn tail and finishing an interrupted
compaction are separate functions that :meth:`Journal.open` calls; the writer lives in
``_writer.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from clonefleet.errors import JournalError
from clonefleet.journal._frame import DEFAULT_LIMITS, Damage, Limits, decode_records

__all__ = ["Replay", "read_journal"]

_NAME = re.compile(r"(seg|snap)-(\d{8,})\.cfj")
"""A segment or snapshot; temp files (``.tmp``) and kept damage (``.damaged``) do not match."""

UNREADABLE = "unreadable"
"""How the reason of damage starts when the file itself could not be opened or read."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted under a journal name must not hang the reader.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def segment_name(seq: int) -> str:
    return f"seg-{seq:08d}.cfj"


def snapshot_name(seq: int) -> str:
    return f"snap-{seq:08d}.cfj"


@dataclass(slots=True, kw_only=True)
class Listing:
    """The segments and snapshots in a folder, by sequence number, and the other names."""

    segments: dict[int, str] = field(default_factory=dict)
    snapshots: dict[int, str] = field(default_factory=dict)
    others: list[str] = field(default_factory=list)

    @property
    def highest_seq(self) -> int:
        return max([0, *self.segments, *self.snapshots])


def list_folder(dir_fd: int) -> Listing:
    listing = Listing()
    for name in os.listdir(dir_fd):
        match = _NAME.fullmatch(name)
        if match is None:
            listing.others.append(name)
        elif match[1] == "seg":
            listing.segments[int(match[2])] = name
        else:
            listing.snapshots[int(match[2])] = name
    return listing


@dataclass(slots=True, kw_only=True)
class Replay:
    """What a journal folder holds, read back in order."""

    records: list[dict[str, Any]] = field(default_factory=list)
    """The records of the snapshot used (if any), then those of every later segment, in order."""
    damage: list[Damage] = field(default_factory=list)
    """Every file part that could not be read, in the order met; nothing in it was used."""
    snapshot_seq: int | None = None
    """Sequence number of the snapshot the records start from; ``None`` when none was used."""
    bytes: int = 0
    """Total size of the files read, in bytes."""


def open_folder(folder: str | os.PathLike[str]) -> int:
    """Make the folder (mode 0700) if missing and open it, refusing a symlink or a stranger's.

    Returns:
        A file descriptor of the folder, for ``dir_fd=`` calls and fsync.

    Raises:
        JournalError: the folder cannot be made or opened, is a symlink or not a folder, or is
            owned by another user.
    """
    path = os.fspath(folder)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        dir_fd = os.open(path, _DIR_FLAGS | os.O_NOFOLLOW)
    except OSError as exc:
        if os.path.islink(path):
            raise JournalError(f"journal folder {path} is a symlink; give the real path") from exc
        raise JournalError(f"cannot open journal folder {path}: {exc}") from exc
    info = os.fstat(dir_fd)
    if info.st_uid != os.geteuid():
        os.close(dir_fd)
        raise JournalError(
            f"journal folder {path} belongs to user {info.st_uid}, not to this user "
            f"({os.geteuid()}); use a folder of your own"
        )
    return dir_fd


def read_file(dir_fd: int, name: str) -> bytes:
    """The whole content of the regular file ``name``; ``OSError`` when it is not one."""
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(f"{name} is not a regular file")
        return file.read()


def _decode_file(
    dir_fd: int, folder: str, name: str, limits: Limits
) -> tuple[list[dict[str, Any]], Damage | None, int]:
    path = os.path.join(folder, name)
    try:
        data = read_file(dir_fd, name)
    except OSError as exc:
        return [], Damage(path=path, offset=0, reason=f"{UNREADABLE}: {exc}"), 0
    records, damage, _ = decode_records(data, path=path, limits=limits)
    return records, damage, len(data)


def read_journal(folder: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> Replay:
    """Read a journal folder back without changing anything in it.

    The newest snapshot that reads without damage is used; a damaged snapshot is reported and
    an older one tried. Then every segment from that snapshot's sequence number on is read in
    order. Damage in a segment is reported and the rest of that segment skipped; later segments
    are still read.

    Args:
        folder: the journal folder; a missing one reads as an empty journal.
        limits: the limits each record must fit.

    Returns:
        The records in order, the damage found, the snapshot used and the bytes read.

    Raises:
        JournalError: the folder exists but cannot be listed.
    """
    path = os.fspath(folder)
    replay = Replay()
    try:
        dir_fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return replay
    except OSError as exc:
        raise JournalError(f"cannot read journal folder {path}: {exc}") from exc
    try:
        listing = list_folder(dir_fd)
        for seq in sorted(listing.snapshots, reverse=True):
            records, damage, size = _decode_file(dir_fd, path, listing.snapshots[seq], limits)
            replay.bytes += size
            if damage is not None:
                replay.damage.append(damage)
                continue
            replay.records, replay.snapshot_seq = records, seq
            break
        start = replay.snapshot_seq or 0
        for seq in sorted(s for s in listing.segments if s >= start):
            records, damage, size = _decode_file(dir_fd, path, listing.segments[seq], limits)
            replay.bytes += size
            replay.records.extend(records)
            if damage is not None:
                replay.damage.append(damage)
    except OSError as exc:
        raise JournalError(f"cannot read journal folder {path}: {exc}") from exc
    finally:
        os.close(dir_fd)
    return replay


def fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_name(dir_fd: int, base: str) -> tuple[int, str]:
    """Create a new file named ``base`` (or ``base.1``, ``base.2``, ... when taken)."""
    for n in range(1000):
        name = base if n == 0 else f"{base}.{n}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(name, flags, 0o600, dir_fd=dir_fd), name
        except FileExistsError:
            continue
    raise FileExistsError(f"no free name for {base}")


def cut_damaged_tail(dir_fd: int, name: str, offset: int) -> str | None:
    """Move the bytes of ``name`` from ``offset`` on into ``<name>.damaged``, then truncate it.

    The copy is made durable before the segment is cut, so a crash in between loses nothing.

    Returns:
        The name of the file the damaged bytes were kept in; ``None`` when there were none.
    """
    fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        tail = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        if not tail:
            return None
        out, kept = _free_name(dir_fd, f"{name}.damaged")
        try:
            view = memoryview(tail)
            while view:
                view = view[os.write(out, view) :]
        finally:
            fsync_and_close(out)
        os.fsync(dir_fd)
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return kept


def remove_stale(dir_fd: int, snapshot_seq: int | None) -> int:
    """Delete what an interrupted compaction left: temp snapshots, and (with a snapshot used)
    every segment and snapshot older than it. Returns the bytes freed."""
    listing = list_folder(dir_fd)
    doomed = [n for n in listing.others if n.endswith(".tmp") and _NAME.fullmatch(n[:-4])]
    if snapshot_seq is not None:
        doomed += [n for s, n in listing.segments.items() if s < snapshot_seq]
        doomed += [n for s, n in listing.snapshots.items() if s < snapshot_seq]
    freed = 0
    for name in doomed:
        with contextlib.suppress(FileNotFoundError):
            freed += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
            os.unlink(name, dir_fd=dir_fd)
    if doomed:
        os.fsync(dir_fd)
    return freed
