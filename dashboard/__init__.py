"""A live web view of a running fleet: ``clonefleet dashboard`` (docs/dashboard.md).

The server (``aiohttp``) reads the fleet through a :class:`DataSource`, which a
:class:`~clonefleet.Fleet` is, and serves one page (plain HTML, CSS and JavaScript shipped in
``static/``) with a JSON API and a server-sent event stream. It never imports Ray: the fleet's
blocking calls run in worker threads with deadlines.
"""

from ._data import DataSource as DataSource
from ._data import Snapshot as Snapshot
from ._live import DashboardOptions as DashboardOptions
from ._run import DashboardThread as DashboardThread
from ._run import is_loopback as is_loopback
from ._run import serve as serve
from ._run import serving as serving
from ._server import Dashboard as Dashboard

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
