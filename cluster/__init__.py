"""Connecting to and starting Ray: embedded, local multi-node, remote clusters, cluster configs."""

from ._connect import ClusterConfig as ClusterConfig
from ._connect import ClusterSession as ClusterSession
from ._connect import loopback_environment as loopback_environment

__all__ = ["ClusterConfig", "ClusterSession", "loopback_environment"]
