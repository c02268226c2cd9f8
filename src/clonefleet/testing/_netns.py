"""A Ray cluster of several machines on one Linux box, each machine a network namespace.

Every machine (the head, the workers, a client and a ``model`` machine for the simulated
provider) is a network namespace of its own with one address on a private /24, joined by a
bridge that lives in a namespace of its own too (``-sw``): nothing is added to the host's own
network, and nothing inside can reach it. Ray runs as a user would run it: ``ray start --head``
on the head and ``ray start --address HEAD:6379`` on each worker, with token authentication on
and each node in its own temporary folder. Every command of a machine runs in a PID namespace
of its own as well, so Ray's process searches (``ray stop``, a driver looking for its node) see
that machine's processes only, as on separate machines.

A machine's link is cut (:meth:`NetnsCluster.cut`) by taking its port on the bridge down: its
packets are dropped, no connection is refused, as when a cable is pulled; :meth:`heal` puts it
back.

Teardown ends every process in the namespaces, then deletes the namespaces (their links and the
bridge go with them) and the harness's folder: on :meth:`NetnsCluster.stop` (the context
manager's exit), at the interpreter's exit, and, when the process dies in a way that runs no
code of its own (SIGKILL, a signal without a handler), by a janitor process started first, which
waits for the harness's pipe to close. Namespaces of a harness whose process is gone are removed
by the next one that starts. See docs/cluster.md, "A cluster on one Linux machine".
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from clonefleet.testing import _netns_tools as tools

__all__ = ["Machine", "NetnsCluster", "in_netns", "netns_unsupported"]

T = TypeVar("T")

PREFIX = "cfnet"
"""Every namespace of a harness is named ``cfnet-PID-TAG-MACHINE``."""
GCS_PORT = 6379
CLIENT_PORT = 10001
PROVIDER_PORT = 8000
CLIENT_SERVER_FAILED = ("Starting Ray client server failed", "in start_specific_server")
"""What a Ray Client connection gets when the head's proxy could not start the server for it
(or found it a zombie), before anything was asked of the cluster, so such a command may be made
again (:meth:`NetnsCluster.node_ids` does; see :func:`client_server_failed`). The usual cause,
a forked child aborted by gRPC, is kept off by :data:`NODE_FORK_SAFE`."""


NOWHERE = "02:00:00:00:00:01"
"""A locally administered MAC address that no machine of a harness has (their veths get random
ones): what :meth:`NetnsCluster.cut_between` sends a cut pair's packets to."""
NODE_FORK_SAFE = {"GRPC_ENABLE_FORK_SUPPORT": "0"}
"""Environment of every node's processes: without it, the head's Ray Client proxy (a Python
gRPC server) forks to start each client's server and gRPC's after-fork handler restarts its
threads in the child, which on a busy machine aborts it (SIGABRT or SIGSEGV, before the exec,
with empty logs): the client then fails with "Starting Ray client server failed". Nothing on
a node forks to go on using gRPC in the child, so the handlers are not needed."""


def client_server_failed(stderr: str) -> bool:
    """Whether a client command failed because Ray Client's proxy did not start its server."""
    return any(sign in stderr for sign in CLIENT_SERVER_FAILED)


CLONE_NEWNET = 0x40000000
_TOOLS = Path(tools.__file__).resolve()
_DROPPED = (
    "RAY_ADDRESS",
    "RAY_TMPDIR",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    "CLONEFLEET_STATE_DIR",
    "CLONEFLEET_CONFIG",
    "CLONEFLEET_CACHE_DIR",
    "CLONEFLEET_BLOCK_LIVE",
    "TMPDIR",
)
"""The caller's settings no machine inherits (each has its own folders; addresses are its own;
requests to the machines' addresses are what the harness is for)."""


def netns_unsupported() -> str | None:
    """Why this machine cannot run the harness (``None`` when it can): it needs Linux, root,
    ``ip`` (iproute2) with ``ip netns``, and ``unshare`` (util-linux)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add` needs CAP_SYS_ADMIN)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"the `{tool}` command ({package}) is not installed"
    probe = f"{PREFIX}-{os.getpid()}-probe-x"
    try:
        made = tools._ip("netns", "add", probe)
        if made.returncode != 0:
            return f"`ip netns add` fails here: {made.stderr.strip()}"
        inside = subprocess.run(
            ["ip", "netns", "exec", probe, "unshare", "--pid", "--fork", "--mount-proc", "true"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if inside.returncode != 0:
            return f"`unshare --pid --mount-proc` fails in a namespace: {inside.stderr.strip()}"
    finally:
        tools._ip("netns", "del", probe)
    return None


_libc: Any = None


def in_netns(netns: str, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
    """``fn()`` called in a thread that entered network namespace ``netns``: sockets it opens
    are that machine's (a network namespace is a property of each thread)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, Any] = {}

    def inside() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into {netns}: {os.strerror(errno)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=inside, name=f"in-{netns}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"a call in namespace {netns} took over {timeout_s} s")
    if "error" in out:
        raise out["error"]
    value: T = out["value"]
    return value


@dataclass
class Machine:
    """One machine: a network namespace with one address, and a folder of its own (its HOME,
    temporary folder, clonefleet state folder and Ray's folder)."""

    name: str
    netns: str
    ip: str
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    """The environment its commands start with (see :meth:`environment`)."""
    init_pid: int = 0
    """The first process of its PID namespace (as this process sees it)."""

    @property
    def home(self) -> Path:
        return self.root / "home"

    def environment(self, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """This machine's environment with ``extra`` applied (``None``: unset that name)."""
        env = dict(self.env)
        for name, value in (extra or {}).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def command(self, *args: str) -> list[str]:
        """``args`` as run on this machine: in its network namespace and its PID namespace
        (where its Ray node runs, when it has one; :meth:`NetnsCluster.start` makes both)."""
        assert self.init_pid, f"machine {self.name} is not started"
        return ["nsenter", "--target", str(self.init_pid), "--net", "--pid", "--mount", "--", *args]

    def popen(
        self,
        *args: str,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
        stdout: int | IO[Any] | None = subprocess.PIPE,
        stderr: int | IO[Any] | None = subprocess.PIPE,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
    ) -> subprocess.Popen[str]:
        """Start ``args`` on this machine."""
        return subprocess.Popen(
            self.command(*args),
            env=self.environment(env),
            cwd=cwd or self.home,
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            text=True,
            start_new_session=True,
        )

    @staticmethod
    def send_signal(proc: subprocess.Popen[Any], sig: int) -> None:
        """Send ``sig`` to the command ``proc`` (from :meth:`popen`) runs on the machine, not
        to the ``nsenter`` around it (which ends with the command's own status)."""
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), sig)

    @staticmethod
    def kill(proc: subprocess.Popen[Any]) -> None:
        """Kill the command ``proc`` (from :meth:`popen`) runs and the ``nsenter`` around it
        (they share a process group of their own)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def run(
        self,
        *args: str,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
        timeout: float = 120.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` on this machine to its end; after ``timeout`` seconds it is killed
        (with what it started) and :class:`subprocess.TimeoutExpired` raised."""
        with subprocess.Popen(
            self.command(*args),
            env=self.environment(env),
            cwd=cwd or self.home,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def clonefleet(
        self,
        *args: str,
        env: Mapping[str, str | None] | None = None,
        cwd: Path | None = None,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """``python -m clonefleet ARGS`` on this machine (this interpreter's clonefleet)."""
        return self.run(
            sys.executable, "-m", "clonefleet", *args, env=env, cwd=cwd, timeout=timeout
        )

    def call(self, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
        """``fn()`` in a thread of this process inside this machine's network (see
        :func:`in_netns`)."""
        return in_netns(self.netns, fn, timeout_s)

    def get_json(self, url: str, timeout_s: float = 10.0) -> Any:
        """``GET url`` from this machine, its JSON answer (:class:`urllib.error.HTTPError`
        for an HTTP error status)."""

        def fetch() -> Any:
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                exc.close()  # its connection, which the caller never reads
                raise

        return self.call(fetch, timeout_s + 5)


def _ray_command() -> str:
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if found is None:
        raise RuntimeError("the `ray` command is not installed next to this Python or on PATH")
    return found


def _owner_gone(name: str) -> bool:
    parts = name.split("-")
    return len(parts) > 2 and parts[1].isdigit() and not os.path.exists(f"/proc/{parts[1]}")


def remove_stale() -> list[str]:
    """Remove the namespaces of harnesses whose process is gone (killed with their janitor);
    returns their prefixes."""
    found = {"-".join(n.split("-")[:3]) for n in tools.namespaces(PREFIX) if _owner_gone(n)}
    for prefix in sorted(found):
        tools.teardown(prefix, None)
    return sorted(found)


class NetnsCluster:
    """A head, ``workers`` workers, a client and a ``model`` machine, each its own network
    namespace on one bridge; Ray nodes on the head and the workers.

    Example::

        with NetnsCluster(workers=2) as net:
            url = net.serve_provider("--latency-ms", "50")
            config = net.write_config()
            out = net.client.clonefleet(
                "run", "general-purpose", "--prompt", "hi", "--count", "10",
                "--address", net.client_address, "--config", str(config),
                env=net.client_env(),
            )

    Args:
        workers: worker machines (each a Ray node).
        cpus_per_node: ``--num-cpus`` of every node.
        head_cpus: ``--num-cpus`` of the head (default: ``cpus_per_node``); with 0 the
            scheduler puts no clone host there (it places hosts on nodes with CPUs only).
        system_config: Ray's ``--system-config`` for the head (its node-death timeouts:
            ``health_check_period_ms``, ``health_check_timeout_ms``,
            ``health_check_failure_threshold``).
        ray_env: extra environment of every Ray node.
        start_timeout_s: how long the nodes get to start.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        cpus_per_node: int = 1,
        head_cpus: int | None = None,
        system_config: Mapping[str, Any] | None = None,
        ray_env: Mapping[str, str] | None = None,
        start_timeout_s: float = 90.0,
    ) -> None:
        if workers < 0:
            raise ValueError("workers must be 0 or more")
        self.tag = f"{os.getpid()}-{secrets.token_hex(2)}"
        self.prefix = f"{PREFIX}-{self.tag}"
        rng = random.Random(secrets.randbits(32))
        self.subnet = ipaddress.ip_network(f"10.{rng.randint(64, 250)}.{rng.randint(1, 254)}.0/24")
        self.cpus_per_node = cpus_per_node
        self.head_cpus = cpus_per_node if head_cpus is None else head_cpus
        self.system_config = dict(system_config or {})
        self.ray_env = dict(ray_env or {})
        self.start_timeout_s = start_timeout_s
        self.root = Path(tempfile.mkdtemp(prefix="cfn-", dir="/tmp"))  # short: Ray's socket paths
        self.root.chmod(0o700)
        self.token_path = self.root / "auth_token"
        names = ["head", *(f"w{i}" for i in range(1, workers + 1)), "client", "model"]
        hosts = list(self.subnet.hosts())
        self.machines: dict[str, Machine] = {
            name: Machine(name, f"{self.prefix}-{name}", str(hosts[i + 1]), self.root / name)
            for i, name in enumerate(names)
        }
        self.switch = f"{self.prefix}-sw"
        self._janitor: subprocess.Popen[bytes] | None = None
        self._nodes: dict[str, subprocess.Popen[str]] = {}
        self._inits: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[str]] = []
        self.provider_url: str | None = None
        self._started = False
        self._stopped = False

    # -- the machines ---------------------------------------------------------------------

    @property
    def head(self) -> Machine:
        return self.machines["head"]

    @property
    def workers(self) -> list[Machine]:
        return [m for n, m in self.machines.items() if n.startswith("w")]

    @property
    def client(self) -> Machine:
        return self.machines["client"]

    @property
    def model(self) -> Machine:
        return self.machines["model"]

    @property
    def nodes(self) -> list[Machine]:
        """The machines that run a Ray node: the head, then the workers."""
        return [self.head, *self.workers]

    @property
    def gcs_address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    @property
    def client_address(self) -> str:
        """The head's Ray Client server: ``ray://HEAD:10001``."""
        return f"ray://{self.head.ip}:{CLIENT_PORT}"

    def machine_of(self, ip: str) -> Machine:
        return next(m for m in self.machines.values() if m.ip == ip)

    # -- starting and stopping ------------------------------------------------------------

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> NetnsCluster:
        """Make the network, start the nodes and wait until each says it runs.

        Raises:
            RuntimeError: the machine cannot run it (:func:`netns_unsupported`), or a node did
                not start (with the end of its log); everything made is removed first.
        """
        if self._started:
            return self
        why = netns_unsupported()
        if why is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            raise RuntimeError(why)
        self._started = True
        remove_stale()
        # First: whatever happens to this process from here on, the janitor cleans up.
        self._janitor = subprocess.Popen(
            [sys.executable, str(_TOOLS), "janitor", self.prefix, str(self.root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        atexit.register(self.stop)
        try:
            self._make_network()
            self._prepare_machines()
            self._start_inits()
            self._start_nodes()
        except BaseException:
            self.stop()
            raise
        return self

    def _ip(self, *args: str) -> None:
        done = tools._ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def _make_network(self) -> None:
        self._ip("netns", "add", self.switch)
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        prefix_len = self.subnet.prefixlen
        for machine in self.machines.values():
            ns = machine.netns
            self._ip("netns", "add", ns)
            port = f"p-{machine.name}"
            # Both ends made in their namespaces: no name is ever taken in the host's own.
            self._ip(
                "link",
                "add",
                "eth0",
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch,
            )
            self._ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            self._ip("-n", ns, "addr", "add", f"{machine.ip}/{prefix_len}", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def _prepare_machines(self) -> None:
        base = {k: v for k, v in os.environ.items() if k not in _DROPPED}
        base = {k: v for k, v in base.items() if not k.startswith(("RAY_AUTH", "XDG_"))}
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        for machine in self.machines.values():
            for sub in ("home", "tmp", "state", "cache"):
                (machine.root / sub).mkdir(parents=True, mode=0o700)
            machine.env = {
                **base,
                "HOME": str(machine.home),
                "TMPDIR": str(machine.root / "tmp"),
                "CLONEFLEET_STATE_DIR": str(machine.root / "state"),
                "CLONEFLEET_CACHE_DIR": str(machine.root / "cache"),
                "RAY_USAGE_STATS_ENABLED": "0",
            }

    def _start_inits(self) -> None:
        """One PID namespace per machine, its first process the reaper of ``_netns_tools``;
        every command of the machine enters it (and its network and mount namespaces)."""
        starters = {
            name: subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    machine.netns,
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount-proc",
                    "--kill-child",
                    sys.executable,
                    str(_TOOLS),
                    "init",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for name, machine in self.machines.items()
        }
        self._inits = starters
        deadline = time.monotonic() + 10
        for name, starter in starters.items():
            children = Path(f"/proc/{starter.pid}/task/{starter.pid}/children")
            while not (found := children.read_text().split() if children.exists() else []):
                if starter.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the PID namespace of {name} did not start")
                time.sleep(0.01)
            self.machines[name].init_pid = int(found[0])

    def node_environment(self, machine: Machine) -> dict[str, str]:
        """What a Ray node's processes (and so every actor on it) run with: the token file,
        no drain on SIGTERM, and gRPC's fork handlers off (:data:`NODE_FORK_SAFE`)."""
        return machine.environment(
            {
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(self.token_path),
                "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
                **NODE_FORK_SAFE,
                **self.ray_env,
            }
        )

    def client_env(self, token: bool = True) -> dict[str, str | None]:
        """The settings a client command on the client machine needs: the cluster's token file
        (``RAY_AUTH_TOKEN_PATH``), or none with ``token=False``."""
        return {"RAY_AUTH_TOKEN_PATH": str(self.token_path) if token else None}

    def _ray_start(self, machine: Machine, *args: str) -> None:
        log = open(machine.root / "ray-start.log", "w")  # noqa: SIM115 (closed by stop)
        self._logs.append(log)
        command = [
            _ray_command(),
            "start",
            "--block",
            "--node-ip-address",
            machine.ip,
            "--num-cpus",
            str(self.head_cpus if machine is self.head else self.cpus_per_node),
            "--temp-dir",
            str(machine.root / "ray"),
            "--disable-usage-stats",
            *args,
        ]
        self._nodes[machine.name] = subprocess.Popen(
            machine.command(*command),
            env=self.node_environment(machine),
            cwd=machine.home,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def _wait_started(self, machines: Sequence[Machine]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        waiting = list(machines)
        while waiting:
            for machine in waiting[:]:
                log = (machine.root / "ray-start.log").read_text(errors="replace")
                if "Ray runtime started" in log:
                    waiting.remove(machine)
                elif self._nodes[machine.name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the Ray node on {machine.name} did not start:\n{log[-3000:]}"
                    )
            time.sleep(0.05)

    def _start_nodes(self) -> None:
        head = ["--head", "--port", str(GCS_PORT), "--ray-client-server-port", str(CLIENT_PORT)]
        head += ["--include-dashboard", "false"]
        if self.system_config:
            head += ["--system-config", json.dumps(self.system_config)]
        self._ray_start(self.head, *head)
        self._wait_started([self.head])
        for worker in self.workers:
            self._ray_start(worker, "--address", self.gcs_address)
        self._wait_started(self.workers)

    def stop(self) -> list[str]:
        """End everything this harness started and remove it; returns what could not be
        removed (empty normally). Stopping twice is harmless."""
        if self._stopped or not self._started:
            return []
        self._stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        left = tools.teardown(self.prefix, str(self.root))
        started: list[subprocess.Popen[Any]] = [*self._nodes.values(), *self._inits.values()]
        for proc in started:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
        for log in self._logs:
            log.close()
        if self._janitor is not None:
            with contextlib.suppress(Exception):
                assert self._janitor.stdin is not None
                self._janitor.stdin.close()
                self._janitor.wait(timeout=15)
        return left

    # -- partitions -----------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Cut machine ``name`` off the network: its port on the bridge goes down, so its
        packets are dropped both ways (nothing is refused: connections time out)."""
        self._ip("-n", self.switch, "link", "set", f"p-{self.machines[name].name}", "down")

    def heal(self, name: str) -> None:
        """Put machine ``name`` back on the network."""
        self._ip("-n", self.switch, "link", "set", f"p-{self.machines[name].name}", "up")

    def cut_between(self, name: str, others: Sequence[str]) -> None:
        """Cut machine ``name`` off from each of ``others`` only (both ways), the rest of the
        network untouched: each side's neighbour entry for the other points at an address no
        machine has, so their packets are dropped, and new connections time out, as on a real
        partition."""
        for a, b in self._pairs(name, others):
            self._ip("-n", a.netns, "neigh", "replace", b.ip, "lladdr", NOWHERE, "nud",
                     "permanent", "dev", "eth0")  # fmt: skip

    def heal_between(self, name: str, others: Sequence[str]) -> None:
        """Undo :meth:`cut_between`: the machines find each other again (ARP)."""
        for a, b in self._pairs(name, others):
            self._ip("-n", a.netns, "neigh", "del", b.ip, "dev", "eth0")

    def _pairs(self, name: str, others: Sequence[str]) -> list[tuple[Machine, Machine]]:
        one = self.machines[name]
        pairs = []
        for other in others:
            two = self.machines[other]
            pairs += [(one, two), (two, one)]
        return pairs

    # -- the simulated provider -----------------------------------------------------------

    def serve_provider(self, *args: str, timeout_s: float = 30.0) -> str:
        """Start ``clonefleet provider serve ARGS`` on the model machine, reachable from the
        others at that machine's address; returns its base URL (``http://MODEL:8000/v1``).

        The provider binds loopback only; a relay on the model machine forwards its
        address's port 8000 to it.
        """
        model = self.model
        serve = [sys.executable, "-m", "clonefleet", "provider", "serve"]
        port = PROVIDER_PORT + 1
        log = open(model.root / "provider.log", "w")  # noqa: SIM115 (closed by stop)
        self._logs.append(log)
        self._nodes["provider"] = model.popen(
            *serve, "--port", str(port), *args, stdout=log, stderr=log
        )
        relay = [sys.executable, str(_TOOLS), "relay", model.ip, str(PROVIDER_PORT), str(port)]
        relay.append(str(model.root / "sources.json"))
        self._nodes["relay"] = model.popen(*relay, stdout=log, stderr=log)
        url = f"http://{model.ip}:{PROVIDER_PORT}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                model.get_json(f"{url}/v1/models", timeout_s=1.0)
                break
            except OSError:
                for name in ("provider", "relay"):
                    if self._nodes[name].poll() is not None:
                        text = (model.root / "provider.log").read_text(errors="replace")
                        raise RuntimeError(f"the provider did not start:\n{text[-3000:]}") from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.provider_url = f"{url}/v1"
        return self.provider_url

    def serve_script(self, script: Mapping[str, Any], *args: str) -> str:
        """Serve the simulated provider (:meth:`serve_provider`) playing ``script``, a
        simulation script's data, and write the client's config for it (:meth:`write_config`);
        returns the provider's base URL."""
        path = self.model.home / "script.json"
        path.write_text(json.dumps(script))
        url = self.serve_provider("--script", str(path), *args)
        self.write_config()
        return url

    def provider_stats(self) -> dict[str, Any]:
        """The provider's counters (``GET /sim/stats``, asked from the model machine)."""
        assert self.provider_url is not None, "serve_provider() first"
        stats: dict[str, Any] = self.model.get_json(
            self.provider_url.removesuffix("/v1") + "/sim/stats"
        )
        return stats

    def provider_sources(self) -> dict[str, dict[str, float]]:
        """The model requests each machine sent (by name) and when its last one came
        (``time.time()``), as the relay in front of the provider counts them (0.2 s late at
        most)."""
        path = self.model.root / "sources.json"
        try:
            counts: dict[str, dict[str, float]] = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        names = {m.ip: m.name for m in self.machines.values()}
        return {names.get(ip, ip): seen for ip, seen in counts.items()}

    def write_config(
        self, extra: str = "", *, machine: Machine | None = None, name: str = "config.yaml"
    ) -> Path:
        """A clonefleet config in ``machine``'s HOME (the client's by default) whose default
        model is ``sim-small`` at the provider (:meth:`serve_provider` first); ``extra`` is YAML
        added at the end."""
        assert self.provider_url is not None, "serve_provider() first"
        path = (machine or self.client).home / name
        path.write_text(
            "version: 1\n"
            "providers:\n"
            f'  model-machine: {{kind: openai, base_url: "{self.provider_url}"}}\n'
            "models:\n"
            "  m: {provider: model-machine, name: sim-small}\n"
            "model_groups:\n"
            "  default: [m]\n" + extra
        )
        return path

    def node_ids(self) -> dict[str, str]:
        """The Ray node id of each machine that runs a node (asked through the client)."""
        script = (
            "import json, sys, ray\n"
            "ray.init(address=sys.argv[1], log_to_driver=False)\n"
            "print(json.dumps({n['NodeManagerAddress']: n['NodeID'] for n in ray.nodes()"
            " if n['Alive']}))\n"
        )
        for _ in range(2):
            out = self.client.run(
                sys.executable,
                "-c",
                script,
                self.client_address,
                env={**self.client_env(), "RAY_AUTH_MODE": "token"},
                timeout=90,
            )
            if not client_server_failed(out.stderr):
                break
        if out.returncode != 0:
            raise RuntimeError(f"cannot list the nodes: {out.stderr[-3000:]}")
        by_ip: dict[str, str] = json.loads(out.stdout.splitlines()[-1])
        return {self.machine_of(ip).name: node for ip, node in by_ip.items()}

    def ray_logs(self, machine: str, pattern: str = "*.err", tail: int = 2000) -> str:
        """The ends of the Ray log files of ``machine``'s node matching ``pattern`` (to tell
        why something failed)."""
        logs = self.machines[machine].root / "ray" / "session_latest" / "logs"
        parts = []
        for path in sorted(logs.glob(pattern)):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").strip()
                if text:
                    parts.append(f"--- {path.name}\n{text[-tail:]}")
        return "\n".join(parts)

    def leftovers(self) -> list[str]:
        """What of this harness is still there (namespaces, processes, its folder)."""
        left = [f"netns {n}" for n in tools.namespaces(self.prefix)]
        left += [f"pid {p}" for n in tools.namespaces(self.prefix) for p in tools.pids_in(n)]
        if self.root.exists():
            left.append(f"folder {self.root}")
        return left
