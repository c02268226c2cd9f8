"""``clonefleet bench``: fan-out of counted batches measured against baselines, in one run.

A simulated provider is served over HTTP from its own process; a warm :class:`clonefleet.Fleet`
runs batches of each size, and the same requests are made by a hand-written asyncio loop (the
floor) and by one Ray actor per clone. :func:`run_bench` returns the report as JSON-ready data,
:func:`table` prints it and :func:`plot` draws it (docs/benchmarks.md).
"""

from __future__ import annotations

from ._plot import check_plotting as check_plotting
from ._plot import plot as plot
from ._progress import ProgressDisplay as ProgressDisplay
from ._report import table as table
from ._run import BASELINES as BASELINES
from ._run import SYSTEMS as SYSTEMS
from ._run import BenchParams as BenchParams
from ._run import run_bench as run_bench
from ._run import steps as steps
from ._server import turn_script as turn_script
from ._stats import percentile as percentile
from ._stats import ratio as ratio
from ._stats import spread as spread

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
