"""What the commands share at the terminal: exit statuses, whole-number options, a rich console
for tables, and one result printed either as JSON or as a line for people (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from clonefleet.config import printable

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "make_console",
    "print_result",
    "whole_number",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
"""Exit statuses: every job succeeded (or the command did what it was asked), something failed,
a usage or definition error with nothing started."""


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number ``low <= n <= high`` (``high`` None = no upper bound)."""

    def parse(text: str) -> int:
        span = f"from {low} to {high}" if high is not None else f"{low} or more"
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"must be a whole number {span}, got {printable(repr(text[:40]))}"
            )
        return value

    return parse


def make_console() -> Any:
    """A rich console; piped output gets a fixed wide width instead of 80 squeezed columns."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def print_result(obj: Any, as_json: bool, human: str) -> None:
    """Print ``obj`` as one JSON line (``--json``), else the line ``human``."""
    print(json.dumps(obj, default=str) if as_json else human)
