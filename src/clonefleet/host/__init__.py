"""Clone hosts: many clones as concurrent loops in one process, the models they share, and the
calls a scheduler makes on a host (:class:`HostCalls`).

Importing this package does not import Ray; ``clonefleet.host.remote`` holds the Ray shell.
"""

from clonefleet.host._core import HostCore as HostCore
from clonefleet.host._model_pool import ProviderPool as ProviderPool
from clonefleet.host._model_pool import is_gated as is_gated
from clonefleet.host._protocol import AskingHostFactory as AskingHostFactory
from clonefleet.host._protocol import HostCalls as HostCalls
from clonefleet.host._protocol import HostFactory as HostFactory
from clonefleet.host._protocol import PlacedHost as PlacedHost
from clonefleet.host._protocol import WatchedHost as WatchedHost

__all__ = [
    "AskingHostFactory",
    "HostCalls",
    "HostCore",
    "HostFactory",
    "is_gated",
    "PlacedHost",
    "ProviderPool",
    "WatchedHost",
]
