"""How the command line takes SIGINT, SIGTERM and SIGHUP.

While a command runs, each of the three raises :class:`Interrupted` in the main thread, wherever
it is; the command stops what it started and exits with ``128 + signal number``, ignoring further
signals until it has exited. A thread woken through :func:`signal.set_wakeup_fd` ends the process
:data:`HARD_STOP_S` after the signal should the main thread not have done so by then. See
docs/cli.md, "Signals".
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = [
    "HARD_STOP_S",
    "STOP_SIGNALS",
    "Interrupted",
    "as_interrupted",
    "interrupted_line",
    "say_outcome",
    "stop_signals_raise",
]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

HARD_STOP_S = 5.0
"""How long after a stop signal the command may take to stop before it ends at once."""

REARM_S = 0.02
"""How soon a signal whose exception Python ignored is raised again."""

_arrived: list[int] = []
"""The stop signal that arrived inside :func:`stop_signals_raise` (at most one)."""
_outcome: list[Callable[[], str]] = []
"""What the command says became of its work when it is stopped (see :func:`say_outcome`)."""


def say_outcome(describe: Callable[[], str]) -> None:
    """Have ``describe()`` complete the line printed when the command ends at once
    (``clonefleet: interrupted (SIGTERM); <describe()>``)."""
    _outcome[:] = [describe]


def interrupted_line(stop: Interrupted) -> str:
    """``clonefleet: interrupted (SIGTERM)``, with what became of the command's work."""
    what = ""
    with contextlib.suppress(Exception):
        what = _outcome[0]() if _outcome else ""
    return f"clonefleet: interrupted ({stop.name})" + (f"; {what}" if what else "")


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived (a ``KeyboardInterrupt``, so whatever handles Ctrl-C handles it;
    a signal, not an error: off the error tree)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """``SIGTERM``."""
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """``128 + signal number``: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
        return 128 + self.signum


def as_interrupted(exc: KeyboardInterrupt) -> Interrupted:
    """``exc`` as an :class:`Interrupted`. Ray raises a plain ``KeyboardInterrupt`` of its own
    when a handler raised while it waited (``ray.get``): the signal that arrived tells which;
    with none, it was SIGINT's."""
    if isinstance(exc, Interrupted):
        return exc
    return Interrupted(_arrived[0] if _arrived else signal.SIGINT)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Inside this block the first stop signal raises :class:`Interrupted`; later ones are
    ignored. The previous handlers are put back when the block ends."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if _arrived:
            return  # already stopping
        _arrived.append(signum)
        raise Interrupted(signum)

    def swallowed(unraisable: Any) -> None:
        # The handler ran where Python ignores exceptions (an at-fork hook while Ray starts a
        # process, a finaliser): raise it again at the next chance instead.
        exc = unraisable.exc_value
        if isinstance(exc, Interrupted) and _arrived == [exc.signum]:
            _arrived.clear()
            # From another thread, a moment later: in this one the handler would run (and be
            # ignored) at once.
            threading.Thread(target=_interrupt_soon, args=(exc.signum,), daemon=True).start()
            return
        hook(unraisable)

    _arrived.clear()
    _outcome.clear()
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; signals go to it anyway
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    hook, sys.unraisablehook = sys.unraisablehook, swallowed
    backstop = _Backstop()
    try:
        yield
    finally:
        backstop.close()
        sys.unraisablehook = hook
        for sig, old in previous.items():
            signal.signal(sig, old)


def _interrupt_soon(signum: int) -> None:
    time.sleep(REARM_S)
    _thread.interrupt_main(signal.Signals(signum))


class _Backstop:
    """Ends the process :data:`HARD_STOP_S` after a stop signal if the main thread has not
    (it may be inside a C call that does not return to Python for a long time)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        try:
            self._previous_fd: int | None = signal.set_wakeup_fd(
                self._write.fileno(), warn_on_full_buffer=False
            )
        except ValueError:  # not the main thread: no backstop
            self._previous_fd = None
            return
        threading.Thread(target=self._watch, name="clonefleet-stop", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                data = self._read.recv(64)
            except OSError:
                return
            if not data or self._done.is_set():
                return
            signum = next((b for b in data if b in STOP_SIGNALS), None)
            if signum is not None:
                break
        if self._done.wait(HARD_STOP_S):
            return
        with contextlib.suppress(Exception):
            sys.stderr.write(interrupted_line(Interrupted(signum)) + "\n")
            sys.stderr.flush()
        os._exit(128 + signum)

    def close(self) -> None:
        self._done.set()
        if self._previous_fd is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous_fd)
        with contextlib.suppress(OSError):
            self._read.shutdown(socket.SHUT_RDWR)  # wakes the watching thread
        self._write.close()
        self._read.close()
