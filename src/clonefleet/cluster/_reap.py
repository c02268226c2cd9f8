"""Ending what is left of an embedded Ray instance: found by the files it holds open.

Every process of an embedded instance holds log files open inside its session folder, which Ray
names after the process that started it; that folder is how they are found. This file imports
only the standard library and also runs as the watchdog script an embedded session starts
(``python -I -S _reap.py --owner PID --temp-dir DIR``): when its standard input closes it ends
what is left of the owner's instance. It never signals a process of another user. See
docs/cluster.md, "Embedded (the default)".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Watchdog", "end_instance", "instance_pids", "reap_orphans", "start_watchdog"]

WATCH_S = 2.0
"""How long the watchdog keeps looking for processes of a dead owner's instance (one started
while its raylet was dying appears a little later)."""
CLOSE_WAIT_S = 5.0
"""How long a watchdog told to stop gets to exit (it may still be starting) before it is killed."""
STOPPED = b"stopped"
"""What an owner that stopped its instance itself writes to its watchdog before closing it."""


def _session_folders(temp_dir: Path, owners: set[int] | None) -> tuple[str, ...]:
    """The session folders in ``temp_dir`` that processes ``owners`` started (``None``: those
    whose starting process is gone)."""
    found = []
    try:
        for entry in temp_dir.iterdir():
            pid = entry.name.rpartition("_")[2]
            if not entry.name.startswith("session_2") or not pid.isdigit() or entry.is_symlink():
                continue
            if (int(pid) in owners) if owners is not None else not _alive(int(pid)):
                found.append(f"{entry}/")
    except OSError:
        return ()
    return tuple(found)


def _holds_file_in(pid: int, folders: tuple[str, ...]) -> bool:
    """Whether ``pid`` has a file inside one of ``folders`` open for writing."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError, ValueError, IndexError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folders) and _writes(pid, fd):
                return True
    return False


def _writes(pid: int, fd: str) -> bool:
    # Ray's processes write their logs there; a reader (a pager on a log file) is not one of them.
    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        flags = next(line for line in f if line.startswith("flags:")).split()[1]
    return int(flags, 8) & 3 in (os.O_WRONLY, os.O_RDWR)


def _own_live_pids() -> list[int]:
    uid, found = os.getuid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            found.append(int(name))
    return found


def _pids_holding(folders: tuple[str, ...]) -> list[int]:
    skip = {os.getpid()}
    return [p for p in _own_live_pids() if p not in skip and _holds_file_in(p, folders)]


def instance_pids(temp_dir: Path, owner: int) -> list[int]:
    """This user's live processes (the caller excepted) holding a file open in a session
    folder of ``temp_dir`` that ``owner``'s Ray made (on Linux; elsewhere none)."""
    folders = _session_folders(temp_dir, {owner})
    return [p for p in _pids_holding(folders) if p != owner] if folders else []


def _end(folders: tuple[str, ...], spare: int, settle_s: float) -> int:
    deadline = time.monotonic() + settle_s
    killed: set[int] = set()
    while True:
        pids = [p for p in _pids_holding(folders) if p not in killed and p != spare]
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        killed.update(pids)
        if not pids and time.monotonic() >= deadline:
            return len(killed)
        time.sleep(0.1)


def end_instance(temp_dir: Path, owner: int, *, settle_s: float = 0.0) -> int:
    """SIGKILL every process :func:`instance_pids` finds, looking again until none is left
    (and for at least ``settle_s``); returns how many were signalled."""
    folders = _session_folders(temp_dir, {owner})
    return _end(folders, owner, settle_s) if folders else 0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which still answers ``kill(pid, 0)``, does not).

    The same as ``_local.pid_alive``, written again: the watchdog runs this file as a script
    (``python -I -S``, for a start in milliseconds), so it imports nothing of clonefleet's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def reap_orphans(temp_dir: Path) -> int:
    """End the processes left by instances in ``temp_dir`` whose starting process is gone
    (killed with SIGKILL together with its watchdog, say); returns how many were signalled."""
    folders = _session_folders(temp_dir, None)
    return _end(folders, 0, 0.0) if folders else 0


class Watchdog:
    """The watchdog of the embedded instance this process starts: it ends what is left of
    that instance if this process dies without calling :meth:`close` (killed, say)."""

    def __init__(self, proc: subprocess.Popen[bytes] | None) -> None:
        self._proc = proc

    def close(self) -> None:
        """Tell the watchdog the instance was stopped here and wait for it to exit (a few
        milliseconds); twice is harmless."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.write(STOPPED)
            proc.stdin.close()
        try:
            proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_watchdog(temp_dir: Path) -> Watchdog:
    """Start the watchdog of the embedded instance this process is about to start in
    ``temp_dir`` (one that does nothing where there is no ``/proc`` to search)."""
    if not Path("/proc/self/fd").is_dir():
        return Watchdog(None)
    cmd = [sys.executable, "-I", "-S", __file__, "--owner", str(os.getpid()), "--temp-dir"]
    proc = subprocess.Popen(
        [*cmd, str(temp_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the caller's process group: it outlives a kill of it
    )
    return Watchdog(proc)


def _watch(owner: int, temp_dir: Path) -> None:
    said = b""
    with contextlib.suppress(OSError):
        while chunk := sys.stdin.buffer.read(64):
            said += chunk
    if said != STOPPED:  # the owner died (or was killed) with its instance running
        end_instance(temp_dir, owner, settle_s=WATCH_S)


def main() -> int:
    parser = argparse.ArgumentParser(prog="clonefleet-reap")
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--temp-dir", required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _watch(args.owner, Path(args.temp_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
