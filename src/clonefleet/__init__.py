"""clonefleet: run counted batches of LLM subagents as Ray actors.

The public API is :class:`Fleet` (a facade over the scheduler actor), :class:`AgentDefinition`
(definitions made in code) and the error tree in :mod:`clonefleet.errors`. Importing this package
does not import Ray; the Ray-facing parts load on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# Ray reads these when it is imported; setting them here (before any Ray import that goes
# through clonefleet) keeps nodes on 127.0.0.1 and turns usage reporting off. See
# clonefleet.cluster.loopback_environment.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

__version__ = "0.1.0"
__all__ = ["AgentDefinition", "Fleet", "__version__"]

if TYPE_CHECKING:
    from clonefleet.definitions import AgentDefinition
    from clonefleet.fleet import Fleet


def __getattr__(name: str) -> Any:
    # Lazy: keeps `import clonefleet` (and the pure core) free of Ray.
    if name == "Fleet":
        from clonefleet.fleet import Fleet

        return Fleet
    if name == "AgentDefinition":
        from clonefleet.definitions import AgentDefinition

        return AgentDefinition
    raise AttributeError(name)
