"""``clonefleet bench``: fan-out of counted batches measured against baselines, in one run.

A simulated provider is served over HTTP from its own process; a warm :class:`clonefleet.Fleet`
runs batches of each size, and the same requests are made by a hand-written asyncio loop (the
floor) and by one Ray actor per clone. :func:`run_bench` returns the report as JSON-ready data,
:func:`table` prints it and :func:`plot` draws it (docs/benchmarks.md).
"""

from __future__ import annotations

from clonefleet.bench._plot import check_plotting as check_plotting
from clonefleet.bench._plot import plot as plot
from clonefleet.bench._progress import ProgressDisplay as ProgressDisplay
from clonefleet.bench._report import table as table
from clonefleet.bench._run import BASELINES as BASELINES
from clonefleet.bench._run import SYSTEMS as SYSTEMS
from clonefleet.bench._run import BenchParams as BenchParams
from clonefleet.bench._run import run_bench as run_bench
from clonefleet.bench._run import steps as steps
from clonefleet.bench._server import turn_script as turn_script
from clonefleet.bench._stats import percentile as percentile
from clonefleet.bench._stats import ratio as ratio
from clonefleet.bench._stats import spread as spread

__all__ = [
    "BASELINES",
    "BenchParams",
    "ProgressDisplay",
    "SYSTEMS",
    "check_plotting",
    "percentile",
    "plot",
    "ratio",
    "run_bench",
    "spread",
    "steps",
    "table",
    "turn_script",
]
