"""Clone hosts: many clones as concurrent loops in one process, and the models they share.

Importing this package does not import Ray; ``clonefleet.host.remote`` holds the Ray shell.
"""

from clonefleet.host._core import HostCore as HostCore
from clonefleet.host._model_pool import ProviderPool as ProviderPool

__all__ = [
    "HostCore",
    "ProviderPool",
]
