"""Connecting to and starting Ray: embedded, local multi-node, remote clusters, cluster configs.

The only package (with ``*/remote.py``) that touches Ray; ``ClusterSession`` owns ``ray.init``
and ``ray.shutdown``; ``cluster_up``/``cluster_down`` manage a persistent local cluster.
"""

from ._connect import NAMESPACE as NAMESPACE
from ._connect import SCHEDULER_NAME as SCHEDULER_NAME
from ._connect import ClusterConfig as ClusterConfig
from ._connect import ClusterSession as ClusterSession
from ._connect import loopback_environment as loopback_environment
from ._local import cluster_down as cluster_down
from ._local import cluster_up as cluster_up
from ._local import read_state as read_state
from ._local import resolve_address as resolve_address
from ._local import state_dir as state_dir
from ._local import state_path as state_path
from ._runtime import remote_runtime_env as remote_runtime_env

__all__ = [
    "NAMESPACE",
    "SCHEDULER_NAME",
    "ClusterConfig",
    "ClusterSession",
    "cluster_down",
    "cluster_up",
    "loopback_environment",
    "read_state",
    "remote_runtime_env",
    "resolve_address",
    "state_dir",
    "state_path",
]
