"""The ``clonefleet`` command line (docs/cli.md): one module per command group.

``program`` assembles the parser and runs a command; ``run``, ``definitions`` (validate, agents),
``provider``, ``jobs``, ``events``, ``message``, ``cluster``, ``trust``, ``dashboard`` and
``bench`` each hold one group's parser and handlers. ``run`` shows its batch with ``progress``
and ends with ``summary``; ``signals`` turns stop signals into a clean exit; ``console`` holds
what the commands share at the terminal (exit statuses, number options, printing).
"""

from clonefleet.cli.program import build_parser as build_parser
from clonefleet.cli.program import entry as entry
from clonefleet.cli.program import main as main

__all__ = [
    "build_parser",
    "entry",
    "main",
]
