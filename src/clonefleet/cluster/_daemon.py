"""The process behind ``clonefleet cluster up``: holds a local Ray head and worker nodes.

Every node is bound to 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray from picking
a routable address, and nodes are added through Ray's in-process cluster utility, which does not
rewrite the head address the way ``ray start`` does). Every node runs with Ray's token
authentication (``RAY_AUTH_MODE=token``), reading the token from the file ``--auth-token-file``
names, so its RPC servers and its dashboard agent's HTTP server (which serves the session's log
listing at ``/logs/``) refuse a caller without that token; Ray's session folder (logs, sockets)
is inside a folder only this user may enter. SIGTERM ends every process of the daemon's session
(nodes, the scheduler, clone hosts) within about two seconds and removes the state and token
files.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from clonefleet.cluster._local import end_session, private_ray_temp_dir

STOP_GRACE_S = 0.5
"""How long the cluster's processes get to exit on SIGTERM before they are killed."""


def _ray_environment(token_file: Path) -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray's nodes take over SIGTERM (ours is put back once they are up) and would first wait up
    # to 30 s for a node with any actor on it to drain: `cluster down` took 31.5 s once the
    # scheduler existed. Forced, not defaulted, so a value in the caller's shell cannot bring
    # that back for a SIGTERM that comes while the nodes start.
    os.environ["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    # Ray reads these when it loads (in this process and in every node process it starts, which
    # inherit this environment); a RAY_AUTH_TOKEN from the caller's shell would take precedence
    # over the file, so it goes.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    os.environ.pop("RAY_AUTH_TOKEN", None)


def _own_ray_folder() -> Path:
    """Make Ray's folder for this cluster and point Ray's default temporary folder at it.

    Ray's in-process cluster utility records the head's address in ``ray_current_cluster`` in
    its *default* temporary folder (``$RAY_TMPDIR/ray``, else ``$TMPDIR/ray``), whatever
    ``temp_dir`` the head gets, and fails where that folder does not exist (a machine where Ray
    never ran). Written there, the record would also let any program's
    ``ray.init(address="auto")`` find this cluster. ``RAY_TMPDIR`` names the private folder's
    parent instead, so the record lands in the folder only this user may enter, which is made
    here first; the node processes inherit the setting.
    """
    folder = private_ray_temp_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ["RAY_TMPDIR"] = str(folder.parent)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(prog="clonefleet-cluster-daemon")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=1)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--auth-token-file", required=True)
    args = parser.parse_args()
    token_file = Path(args.auth_token_file).resolve()
    if not token_file.is_file() or not token_file.read_text().strip():
        parser.error(f"no token in {token_file}")
    _ray_environment(token_file)
    temp_dir = _own_ray_folder()
    from ray.cluster_utils import Cluster

    stop = threading.Event()
    _on_stop_signals(stop)
    state_file = Path(args.state)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": args.cpus,
            "include_dashboard": False,
            # A free port for the head's dashboard agent, as for the other nodes: Ray's fixed
            # default (52365) is taken whenever another Ray runs on the machine, and then the
            # head's agent never starts.
            "dashboard_agent_listen_port": None,
            "node_ip_address": "127.0.0.1",
            "gcs_server_port": args.port,
            "temp_dir": str(temp_dir),
        },
    )
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        # Each node Ray starts here installs a SIGTERM handler of its own (it ends that one node
        # and exits through Cluster.shutdown's waits); ours goes back so `_stop` ends them all.
        _on_stop_signals(stop)
        state = {
            "address": cluster.address,
            "pid": os.getpid(),
            "nodes": args.nodes,
            "cpus_per_node": args.cpus,
            "started_at": time.time(),
            "auth": "token",
            "auth_token_path": str(token_file),
            "ready": True,
        }
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(state_file)
        print(f"cluster ready at {cluster.address} with {args.nodes} node(s)", flush=True)  # noqa: T201 (the parent reads this line)
        stop.wait()
    finally:
        _stop(cluster)
        state_file.unlink(missing_ok=True)
        token_file.unlink(missing_ok=True)
    return 0


def _on_stop_signals(stop: threading.Event) -> None:
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())


def _stop(cluster: Any) -> None:
    """End every process of this daemon's session at once, then let Ray forget its nodes.

    Ray's own ``Cluster.shutdown`` ends the processes one after the other with a second of grace
    each and waits up to 30 s for each to be reaped; here they all get SIGTERM together and
    SIGKILL after :data:`STOP_GRACE_S`, and Ray's bookkeeping (which then finds every process
    gone) gets a bounded second in a thread of its own.
    """
    end_session(os.getpid(), grace_s=STOP_GRACE_S)
    done = threading.Thread(target=cluster.shutdown, daemon=True)
    done.start()
    done.join(timeout=1.0)


if __name__ == "__main__":
    raise SystemExit(main())
