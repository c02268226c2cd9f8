"""A live web view of a running fleet: ``clonefleet dashboard`` (docs/dashboard.md).

The server (``aiohttp``) reads the fleet through a :class:`DataSource`, which a
:class:`~clonefleet.Fleet` is, and serves one page (plain HTML, CSS and JavaScript shipped in
``static/``) with a JSON API and a server-sent event stream. It never imports Ray: the fleet's
blocking calls run in worker threads with deadlines.
"""

from clonefleet.dashboard._data import DataSource as DataSource
from clonefleet.dashboard._data import Snapshot as Snapshot
from clonefleet.dashboard._live import DashboardOptions as DashboardOptions
from clonefleet.dashboard._run import DashboardThread as DashboardThread
from clonefleet.dashboard._run import is_loopback as is_loopback
from clonefleet.dashboard._run import serve as serve
from clonefleet.dashboard._run import serving as serving
from clonefleet.dashboard._server import Dashboard as Dashboard

__all__ = [
    "Dashboard",
    "DashboardOptions",
    "DashboardThread",
    "DataSource",
    "Snapshot",
    "is_loopback",
    "serve",
    "serving",
]
