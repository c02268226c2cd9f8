"""Connecting to and starting Ray: embedded, local multi-node, remote clusters, cluster configs.

The only package (with ``*/remote.py``) that touches Ray; ``ClusterSession`` owns ``ray.init``
and ``ray.shutdown``; ``cluster_up``/``cluster_down`` manage a persistent local cluster;
``call_with_deadline``/``ray_wait`` bound and translate a client's calls on the scheduler.
"""

from clonefleet.cluster._calls import CALL_TIMEOUT_S as CALL_TIMEOUT_S
from clonefleet.cluster._calls import START_TIMEOUT_S as START_TIMEOUT_S
from clonefleet.cluster._calls import WAIT_MARGIN_S as WAIT_MARGIN_S
from clonefleet.cluster._calls import NoAnswer as NoAnswer
from clonefleet.cluster._calls import call_with_deadline as call_with_deadline
from clonefleet.cluster._calls import client_step as client_step
from clonefleet.cluster._calls import connect_client as connect_client
from clonefleet.cluster._calls import connecting_step as connecting_step
from clonefleet.cluster._calls import positive_seconds as positive_seconds
from clonefleet.cluster._calls import ray_wait as ray_wait
from clonefleet.cluster._connect import NAMESPACE as NAMESPACE
from clonefleet.cluster._connect import SCHEDULER_NAME as SCHEDULER_NAME
from clonefleet.cluster._connect import ClusterConfig as ClusterConfig
from clonefleet.cluster._connect import ClusterSession as ClusterSession
from clonefleet.cluster._connect import client_steps_left_behind as client_steps_left_behind
from clonefleet.cluster._connect import loopback_environment as loopback_environment
from clonefleet.cluster._connect import named_actor_exists as named_actor_exists
from clonefleet.cluster._connect import stop_current_session as stop_current_session
from clonefleet.cluster._local import cluster_down as cluster_down
from clonefleet.cluster._local import cluster_up as cluster_up
from clonefleet.cluster._local import dead_daemon_state as dead_daemon_state
from clonefleet.cluster._local import read_state as read_state
from clonefleet.cluster._local import resolve_address as resolve_address
from clonefleet.cluster._local import state_dir as state_dir
from clonefleet.cluster._local import state_path as state_path
from clonefleet.cluster._runtime import GC_THRESHOLDS as GC_THRESHOLDS
from clonefleet.cluster._runtime import cache_dir as cache_dir
from clonefleet.cluster._runtime import remote_runtime_env as remote_runtime_env
from clonefleet.cluster._runtime import tune_collector as tune_collector

__all__ = [
    "CALL_TIMEOUT_S",
    "GC_THRESHOLDS",
    "NAMESPACE",
    "SCHEDULER_NAME",
    "START_TIMEOUT_S",
    "WAIT_MARGIN_S",
    "ClusterConfig",
    "ClusterSession",
    "NoAnswer",
    "cache_dir",
    "call_with_deadline",
    "client_steps_left_behind",
    "client_step",
    "connecting_step",
    "cluster_down",
    "cluster_up",
    "connect_client",
    "dead_daemon_state",
    "loopback_environment",
    "named_actor_exists",
    "positive_seconds",
    "ray_wait",
    "read_state",
    "remote_runtime_env",
    "resolve_address",
    "state_dir",
    "state_path",
    "stop_current_session",
    "tune_collector",
]
