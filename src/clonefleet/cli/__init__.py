"""The ``clonefleet`` command line (docs/cli.md): one module per command group."""

from clonefleet.cli.program import build_parser as build_parser
from clonefleet.cli.program import entry as entry
from clonefleet.cli.program import main as main

__all__ = [
    "build_parser",
    "entry",
    "main",
]
