"""The process behind ``clonefleet cluster up``: holds a local Ray head and worker nodes.

Every node is bound to 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray from picking
a routable address, and nodes are added through Ray's in-process cluster utility, which does not
rewrite the head address the way ``ray start`` does). SIGTERM shuts every node down and removes
the state file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="clonefleet-cluster-daemon")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=1)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    args = parser.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from ray.cluster_utils import Cluster

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    state_file = Path(args.state)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": args.cpus,
            "include_dashboard": False,
            "node_ip_address": "127.0.0.1",
            "gcs_server_port": args.port,
        },
    )
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=args.cpus, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        state = {
            "address": cluster.address,
            "pid": os.getpid(),
            "nodes": args.nodes,
            "cpus_per_node": args.cpus,
            "started_at": time.time(),
            "ready": True,
        }
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(state_file)
        print(f"cluster ready at {cluster.address} with {args.nodes} node(s)", flush=True)  # noqa: T201 (the parent reads this line)
        stop.wait()
    finally:
        cluster.shutdown()
        state_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
