"""How the command line takes SIGINT, SIGTERM and SIGHUP (docs/cli.md, "Signals").

While a command runs, each of the three raises :class:`Interrupted` in the main thread, wherever
it is (Ray starting, a batch running, the summary being printed); the command stops what it
started and exits with ``128 + signal number``. Once one arrived, the others are ignored until
the command has exited: stopping is bounded (a few seconds) and must not itself be cut short.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

__all__ = ["STOP_SIGNALS", "Interrupted", "as_interrupted", "stop_signals_raise"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_arrived: list[int] = []
"""The stop signal that arrived inside :func:`stop_signals_raise` (at most one)."""


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

    _arrived.clear()
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
