"""Starting and connecting to Ray: the only place that calls ``ray.init`` and ``ray.shutdown``.

With no address, clonefleet starts an embedded local Ray bound to 127.0.0.1 with the dashboard
off, and stops it when the session ends. With an address (``auto``, ``ray://host:port``, or
``RAY_ADDRESS``) it joins an existing cluster and leaves it running.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..errors import ClusterError

__all__ = ["ClusterConfig", "ClusterSession", "loopback_environment"]

NAMESPACE = "clonefleet"
SCHEDULER_NAME = "scheduler"
"""The scheduler actor's name in :data:`NAMESPACE`."""


def loopback_environment() -> None:
    """Keep Ray on loopback and quiet: no usage reporting, no routable node address.

    Must run before Ray starts; processes Ray starts inherit these variables.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _keep_loopback_if_imported_early(address: str | None) -> None:
    # When the caller imported Ray before clonefleet, Ray computed its "clusters enabled" switch
    # from the environment of that moment and would resolve 127.0.0.1 to the machine's routable
    # address. For an embedded instance or a loopback address, turn that switch off again.
    if (
        address is None
        or address == "auto"
        or address.split("://")[-1].startswith(("127.", "localhost"))
    ):
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


def _token_auth_for_client() -> None:
    # A cluster started with `ray start` uses token authentication and writes the token to
    # ~/.ray/auth_token; a client given an explicit address only sends it in token mode.
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_file = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(token_file):
        os.environ["RAY_AUTH_MODE"] = "token"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """How to reach Ray."""

    address: str | None = None
    """``None`` = embedded local Ray (unless ``RAY_ADDRESS`` is set); ``auto``; ``ray://host:port``."""
    num_cpus: int | None = None
    """CPUs of the embedded instance (default: the machine's)."""
    namespace: str = NAMESPACE
    log_to_driver: bool = False
    """Forward worker logs to this process (off: a CLI's output stays clean)."""
    runtime_env: dict[str, Any] | None = None
    """Ray runtime environment for a remote cluster (working dir, packages)."""


class ClusterSession:
    """Context manager owning one connection to Ray.

    Example::

        with ClusterSession(ClusterConfig()) as session:
            ...  # Ray is up; session.embedded says whether we started it
    """

    def __init__(self, cfg: ClusterConfig | None = None) -> None:
        self.cfg = cfg or ClusterConfig()
        self.embedded = False
        self._owns = False

    @property
    def address(self) -> str | None:
        return self.cfg.address or os.environ.get("RAY_ADDRESS") or None

    def start(self) -> ClusterSession:
        """Start or join Ray (a no-op when this process is already connected).

        Raises:
            ClusterError: Ray could not be started or reached.
        """
        loopback_environment()
        if self.address:
            _token_auth_for_client()  # read by Ray at import time
        import ray

        if ray.is_initialized():
            return self
        _keep_loopback_if_imported_early(self.address)
        kwargs: dict[str, Any] = {
            "namespace": self.cfg.namespace,
            "log_to_driver": self.cfg.log_to_driver,
            "logging_level": logging.WARNING,
            "configure_logging": False,
        }
        if self.cfg.runtime_env:
            kwargs["runtime_env"] = self.cfg.runtime_env
        address = self.address
        try:
            if address:
                ray.init(address=address, **kwargs)
            else:
                ray.init(
                    address="local",
                    num_cpus=self.cfg.num_cpus,
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    **kwargs,
                )
                self.embedded = True
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = address or "an embedded local instance"
            raise ClusterError(f"cannot start or reach Ray at {where}: {exc}") from None
        self._owns = True
        return self

    def stop(self) -> None:
        """Disconnect (and stop an embedded instance); stopping twice is harmless."""
        if not self._owns:
            return
        import ray

        ray.shutdown()
        self._owns = False

    def __enter__(self) -> ClusterSession:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
