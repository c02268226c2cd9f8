"""Starting and connecting to Ray: the only place that calls ``ray.init`` and ``ray.shutdown``.

With no address, clonefleet starts an embedded local Ray bound to 127.0.0.1 (started lean,
``_lean.py``) and stops it when the session ends, leaving no process behind (``_reap.py``).
With an address (``auto``, ``ray://host:port``, or ``RAY_ADDRESS``) it joins an existing
cluster and leaves it running. The session sets Ray's token variables (``RAY_AUTH_*``) only
while it is connected and puts the caller's values back when it stops; it keeps Ray's signal
handlers out of this process. See docs/cluster.md, "Embedded (the default)" and "Token
authentication".
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

from clonefleet.cluster._lean import lean_local_start
from clonefleet.cluster._local import (
    local_token_path,
    private_ray_temp_dir,
    prune_ray_sessions,
    resolve_address,
)
from clonefleet.cluster._reap import Watchdog, end_instance, reap_orphans, start_watchdog
from clonefleet.errors import ClusterError

__all__ = [
    "ClusterConfig",
    "ClusterSession",
    "loopback_environment",
    "cluster_unreachable",
    "client_steps_left_behind",
    "through_client",
    "named_actor_exists",
    "stop_current_session",
]

log = logging.getLogger(__name__)

NAMESPACE = "clonefleet"
T = TypeVar("T")

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


def _no_signal_dumps() -> None:
    """Keep Ray's C++ failure-signal handlers out of this process: on SIGTERM they printed a
    ``*** SIGTERM received`` stack dump and the process sometimes crashed on its way out
    (``free(): invalid pointer``). Read when the core worker starts, so set after Ray loads;
    ``RAY_DISABLE_FAILURE_SIGNAL_HANDLER=0`` in the environment keeps them."""
    if os.environ.get("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1") != "0":
        from ray._private import ray_constants

        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


def _ray_notices_to_stderr() -> None:
    """Send the notices Ray's raylet publishes to the driver (``(raylet) WARNING: 8 PYTHON worker
    processes have been started ...``) to standard error: Ray prints them on standard output
    whatever ``log_to_driver`` says, where they broke ``--json`` output under load."""
    from ray._private import worker

    original = worker.print_to_stdstream
    if getattr(original, "clonefleet_to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr.clonefleet_to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


@contextlib.contextmanager
def _callers_sigterm_kept() -> Iterator[None]:
    """Inside this block ``ray.init`` does not replace a Python SIGTERM handler the caller
    installed (its own raises ``SystemExit`` wherever the main thread happens to be)."""
    from ray._private import utils

    mine = signal.getsignal(signal.SIGTERM)
    if not callable(mine) or threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = utils.set_sigterm_handler
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = saved
        signal.signal(signal.SIGTERM, mine)


@contextlib.contextmanager
def _ray_processes_in_own_groups() -> Iterator[None]:
    """Inside this block the processes Ray starts (GCS, raylet, and so what the raylet starts)
    get process groups of their own: a signal to the caller's group (a terminal's hangup,
    ``kill -TERM -PGID``) reaches the caller, which stops them, and not them. (SIGHUP killed
    the GCS mid-start, and ``ray.init`` then waited 30 s for its port.)"""
    from ray._private import services

    popen = services.ConsolePopen

    class OwnGroupPopen(popen):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnGroupPopen
    try:
        yield
    finally:
        services.ConsolePopen = popen


def _auth_environment(address: str | None) -> dict[str, str | None]:
    """The ``RAY_AUTH_*`` variables a session on ``address`` needs (``None``: unset it)."""
    env = os.environ
    mode = env.get("RAY_AUTH_MODE")
    if address is None:
        if mode is not None and mode.lower() != "token":
            return {}  # the caller turned token authentication off on purpose
        if env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH"):
            return {"RAY_AUTH_MODE": "token"}  # the caller's own token (Ray creates no file)
        # A token for this instance alone, in memory: Ray would otherwise read, or create with
        # mode 0644, ~/.ray/auth_token.
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_AUTH_TOKEN_PATH": None,
        }
    local = local_token_path(address)
    if local is not None:
        # The cluster `cluster up` started: its own token, whatever the shell says.
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": str(local)}
    # Another cluster: Ray sends a token only in token mode, and turns that on by itself only for
    # a cluster it finds on this machine, never for an explicit address. Send the caller's token
    # when there is one.
    if mode is not None:
        return {}
    token_file = env.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if env.get("RAY_AUTH_TOKEN") or os.path.isfile(token_file):
        return {"RAY_AUTH_MODE": "token"}
    return {}


CLIENT_SERVER_FAILED = "Starting Ray client server failed"
"""What Ray Client says when the head's proxy started no server for this client (the server
process died before it ran; see :func:`_join`)."""
CLIENT_SERVER_TRIES = 3
"""Connections made to a ``ray://`` address whose proxy started no server for the client."""


def _connect_hint(address: str | None, auth: Mapping[str, str | None], error: str = "") -> str:
    """What to add to the ``error`` of a failed connection to ``address`` made with the
    ``auth`` variables of :func:`_auth_environment`: nothing for an embedded instance or
    `cluster up`'s own cluster (clonefleet holds its token); the head's own fault when its Ray
    Client proxy started no server; else whether this client sent a token, so that a timeout
    with the right token does not send the user looking for one."""
    if CLIENT_SERVER_FAILED in error:
        return (
            " (the cluster was reached, but its head could not start a Ray Client server for"
            f" this client, {CLIENT_SERVER_TRIES} times: its ray_client_server*.err logs say"
            " why; a head started without GRPC_ENABLE_FORK_SUPPORT=0 fails this way when it is"
            " busy; see docs/cluster.md)"
        )
    if not address or auth.get("RAY_AUTH_TOKEN_PATH"):
        return ""
    if auth.get("RAY_AUTH_MODE") == "token" or os.environ.get("RAY_AUTH_MODE") == "token":
        return (
            " (the cluster cannot be reached from here, or refused the token this client sends:"
            " check the address and the network, and that RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
            " holds the cluster's token; see docs/cluster.md)"
        )
    return (
        " (the cluster cannot be reached from here, or it has token authentication and refuses"
        " a client without its token, which this one sent none of: set RAY_AUTH_TOKEN or"
        " RAY_AUTH_TOKEN_PATH; see docs/cluster.md)"
    )


def _set_auth_environment(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """Set (or unset) ``values`` in the environment and make a loaded Ray see them; returns the
    values they replace."""
    previous = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if values:
        # Ray caches the mode (its config) and the token; both are read again from here.
        from ray._raylet import (  # type: ignore[attr-defined]  # not in its stub
            AuthenticationTokenLoader,
            Config,
        )

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    return previous


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


def _check_same_cluster(address: str | None) -> None:
    """A process already connected to Ray stays on that instance: refuse a request for another
    cluster instead of quietly using the one that is connected."""
    import ray

    if not address or "://" in address:
        return  # embedded, or Ray Client (whose address Ray does not report the same way)
    current = ray.get_runtime_context().gcs_address
    if current != address:
        raise ClusterError(
            f"this process is already connected to Ray at {current}, not {address}; "
            "one process uses one cluster (close the other Fleet first)"
        )


def named_actor_exists(name: str, namespace: str = NAMESPACE) -> bool:
    """Whether the connected cluster has a live actor of that name (one call to Ray's GCS)."""
    import ray

    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


_current: list[ClusterSession] = []
"""The session this process holds (at most one: one process uses one cluster)."""

GCS_PROBE_S = 1.0
"""How long a joined cluster's GCS gets to accept a TCP connection when a call on it failed."""
GONE_SHUTDOWN_S = 1.0
"""How long disconnecting from a cluster that is gone may take: Ray's own disconnect waited
about 5 s for the missing GCS (the rest goes on in the background)."""


def _gcs_refuses(address: str | None, timeout_s: float = GCS_PROBE_S) -> str | None:
    """Why ``address`` (``HOST:PORT``: a GCS, or a Ray Client endpoint) does not accept a TCP
    connection within ``timeout_s``, or ``None`` when it does (or when there is no address to
    try)."""
    if not address or "://" in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        if isinstance(exc, TimeoutError | socket.timeout):
            return f"no answer within {timeout_s:g} s"
        return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "timeout"


CLIENT_CONNECT_S = 10.0
"""How long the head's Ray Client port gets to accept a TCP connection before a ``ray://``
session is started: past it the command fails saying the cluster cannot be reached (Ray Client
itself would try for about 30 s, then say only "connection timeout")."""
CLIENT_PROBE_S = 2.0
"""How long it gets when a call through a connected ``ray://`` session has had no answer in
its time."""


def client_endpoint(address: str | None) -> str | None:
    """``HOST:PORT`` of a ``ray://`` address (Ray Client's port 10001 when none is given), or
    ``None`` for any other address."""
    if not address or not address.startswith("ray://"):
        return None
    rest = address[len("ray://") :].split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    return rest if sep and port.isdigit() and host else f"{rest}:10001"


def client_unreachable_message(endpoint: str, why: str) -> str:
    """What a command through Ray Client says when the head's port does not answer."""
    return (
        f"the cluster at ray://{endpoint} cannot be reached from here (a TCP connection to "
        f"{endpoint}: {why}): the network between this machine and the head is down, or the "
        "head is gone. Jobs already on the cluster go on; once it can be reached, `clonefleet "
        "jobs` and `clonefleet events` read them"
    )


def cluster_unreachable() -> str | None:
    """When this process's joined cluster can no longer be reached (its GCS refuses
    connections: the cluster was stopped or its head is gone; or, through Ray Client, the
    head's port does not answer), a message saying so; else ``None`` (also for an embedded
    instance, which lives as long as this process).

    Ray itself would retry for 60 s and then end the process with its own log line.
    """
    for session in _current:
        if not session.embedded and (why := _gcs_refuses(session.gcs_address)) is not None:
            return (
                f"the cluster at {session.gcs_address} cannot be reached (its GCS: {why}); it "
                "was stopped (`clonefleet cluster down`) or its head node is gone"
            )
        endpoint = session.client_endpoint
        if endpoint and (why := _gcs_refuses(endpoint, CLIENT_PROBE_S)) is not None:
            return client_unreachable_message(endpoint, why)
    return None


def through_client() -> bool:
    """Whether this process's session is a ``ray://`` one (Ray Client)."""
    return current_client_endpoint() is not None


def _join(
    address: str,
    kwargs: Mapping[str, Any],
    init: Callable[..., object] | None = None,
    shutdown: Callable[[], object] | None = None,
) -> None:
    """``ray.init`` on ``address`` (or ``init``), made again (up to
    :data:`CLIENT_SERVER_TRIES` in all) when a ``ray://`` head's proxy started no server for
    this client: the connection was refused before anything was asked of the cluster, and the
    next one gets a new server."""
    import ray

    init = init or ray.init
    shutdown = shutdown or ray.shutdown
    endpoint = client_endpoint(address)
    for attempt in range(1, CLIENT_SERVER_TRIES + 1):
        try:
            if endpoint:
                try:
                    while_reachable(lambda: init(address=address, **kwargs), endpoint)
                except ClusterError as exc:
                    raise ClusterError(f"cannot reach Ray: {exc}") from None
            else:
                init(address=address, **kwargs)
            return
        except ConnectionError as exc:  # ConnectionAbortedError, from Ray Client's init
            if "://" not in address or CLIENT_SERVER_FAILED not in str(exc):
                raise
            if attempt == CLIENT_SERVER_TRIES:
                raise
            log.warning("%s: no Ray Client server for this client; connecting again", address)
            with contextlib.suppress(Exception):
                shutdown()


class StillRunning(Exception):  # noqa: N818 - a signal to the caller of while_reachable
    """:func:`while_reachable`'s step still ran at the end of its patience, the port
    answering."""


def while_reachable(
    step: Callable[[], T],
    endpoint: str,
    *,
    quiet_s: float = 0.0,
    give_up_s: float | None = None,
) -> T:
    """``step()`` (something Ray Client does over the network: connecting, a ``ray.get``,
    fetching an actor handle's methods) on a thread of its own, kept to a deadline when the
    network to the head is cut: once ``quiet_s`` has passed without its end, the head's port
    ``endpoint`` is tried every :data:`CLIENT_PROBE_S`. Cut off, Ray Client itself would wait
    for gRPC to give up (a minute or more) and then say only that the connection timed out.

    Raises:
        ClusterError: the port stopped answering (the thread is left to Ray).
        StillRunning: still running ``give_up_s`` after the start, the port answering.
    """
    done = threading.Event()
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            with _quiet_thread_init():
                outcome.append((True, step()))
        except BaseException as exc:  # handed to the caller's thread as it is
            outcome.append((False, exc))
        finally:
            done.set()

    late = None if give_up_s is None else time.monotonic() + give_up_s
    thread = threading.Thread(target=run, name="clonefleet-client-step", daemon=True)
    thread.start()
    if not done.wait(quiet_s):
        while True:
            if (why := _gcs_refuses(endpoint, CLIENT_PROBE_S)) is not None:
                _left_behind.append(thread)
                raise ClusterError(client_unreachable_message(endpoint, why))
            if late is not None and time.monotonic() > late:
                _left_behind.append(thread)
                raise StillRunning
            if done.wait(CLIENT_PROBE_S):
                break
    ok, value = outcome[0]
    if ok:
        return cast(T, value)
    raise value


_left_behind: list[threading.Thread] = []
"""Ray Client steps given up on (:func:`while_reachable`), perhaps still running."""


def client_steps_left_behind() -> bool:
    """Whether a Ray Client step this process gave up on still runs: Ray's own exit handlers
    would then wait for the head (a minute or more), so a command ends its process at once
    (``clonefleet.cli``'s ``entry``)."""
    return any(thread.is_alive() for thread in _left_behind)


class _NoThreadSigtermNotice(logging.Filter):
    """Drops Ray's notice that ``ray.init`` on a thread other than the main one set no SIGTERM
    handler: clonefleet keeps the caller's own handler anyway (:func:`_callers_sigterm_kept`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")


@contextlib.contextmanager
def _quiet_thread_init() -> Iterator[None]:
    ray_worker_log = logging.getLogger("ray._private.worker")
    notice = _NoThreadSigtermNotice()
    ray_worker_log.addFilter(notice)
    try:
        yield
    finally:
        ray_worker_log.removeFilter(notice)


def current_client_endpoint() -> str | None:
    """``HOST:PORT`` of the head's Ray Client server when this process's session is a
    ``ray://`` one, else ``None``."""
    return next((s.client_endpoint for s in _current if s.client_endpoint), None)


def stop_current_session() -> None:
    """Stop the session this process holds, if any (for a command interrupted before it had
    the object that owns the session, or while that object was closing it)."""
    for session in _current[:]:
        session.stop()


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
        self._restore_env: dict[str, str | None] = {}
        self._watchdog: Watchdog | None = None
        self._temp_dir: Path | None = None
        self.gcs_address: str | None = None
        """The GCS address of the cluster joined (``None``: embedded, or through Ray Client)."""
        self.client_endpoint: str | None = None
        """``HOST:PORT`` of the head's Ray Client server, for a ``ray://`` session."""

    @property
    def address(self) -> str | None:
        return self.cfg.address or os.environ.get("RAY_ADDRESS") or None

    def start(self) -> ClusterSession:
        """Start or join Ray (a no-op when this process is already connected).

        Raises:
            ClusterError: Ray could not be started or reached.
        """
        loopback_environment()
        import ray

        # `auto` never reaches Ray (whose own search joins any Ray on the machine).
        address = resolve_address(self.cfg.address)
        if ray.is_initialized():
            _check_same_cluster(address)
            return self
        _keep_loopback_if_imported_early(address)
        _no_signal_dumps()
        _ray_notices_to_stderr()
        endpoint = client_endpoint(address)
        if endpoint and (why := _gcs_refuses(endpoint, CLIENT_CONNECT_S)) is not None:
            raise ClusterError(f"cannot reach Ray: {client_unreachable_message(endpoint, why)}")
        auth = _auth_environment(address)
        self._restore_env = _set_auth_environment(auth)
        kwargs: dict[str, Any] = {
            "namespace": self.cfg.namespace,
            "log_to_driver": self.cfg.log_to_driver,
            "logging_level": logging.WARNING,
            "configure_logging": False,
        }
        if self.cfg.runtime_env:
            kwargs["runtime_env"] = self.cfg.runtime_env
        try:
            with _callers_sigterm_kept():
                if address:
                    _join(address, kwargs)
                    if "://" not in address:
                        self.gcs_address = ray.get_runtime_context().gcs_address
                else:
                    self._start_embedded(kwargs)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
            self._end_embedded()
            self._put_back_environment()
            where = address or "an embedded local instance"
            hint = _connect_hint(address, auth, str(exc))
            raise ClusterError(f"cannot start or reach Ray at {where}: {exc}{hint}") from None
        except BaseException:  # interrupted (a signal) while Ray was starting, for one
            self._end_embedded()
            self._put_back_environment()
            raise
        self._owns = True
        self.client_endpoint = endpoint
        _current.append(self)
        return self

    def _start_embedded(self, kwargs: dict[str, Any]) -> None:
        import ray

        self._temp_dir = temp_dir = private_ray_temp_dir()
        prune_ray_sessions(temp_dir)
        # Leftovers of earlier runs killed together with their watchdog: found in the
        # background, so the start does not wait for the search (tens of milliseconds).
        threading.Thread(target=reap_orphans, args=(temp_dir,), daemon=True).start()
        self._watchdog = start_watchdog(temp_dir)
        with (
            _ray_processes_in_own_groups(),
            lean_local_start(logs_to_driver=self.cfg.log_to_driver) as lean,
        ):
            ray.init(
                address="local",
                num_cpus=self.cfg.num_cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                _temp_dir=str(temp_dir),
                **kwargs,
                **lean,
            )
        self.embedded = True

    def _end_embedded(self) -> None:
        """Stop the embedded instance this session started (or began to start) and kill
        whatever of it is left; nothing when it started none. The watchdog is let go last, so
        a stop cut short is done again in full."""
        if self._watchdog is None or self._temp_dir is None:
            return
        import ray

        with contextlib.suppress(Exception):
            ray.shutdown()
        end_instance(self._temp_dir, os.getpid())
        self._watchdog.close()
        self._watchdog = None

    def _put_back_environment(self) -> None:
        restore, self._restore_env = self._restore_env, {}
        _set_auth_environment(restore)

    def stop(self) -> None:
        """Disconnect (and stop an embedded instance); stopping twice is harmless."""
        if not self._owns:
            return
        import ray

        gone = self.gcs_address and _gcs_refuses(self.gcs_address) is not None
        if not gone and self.client_endpoint:
            gone = _gcs_refuses(self.client_endpoint, CLIENT_PROBE_S) is not None
        if gone:
            # The cluster is gone (or out of reach): Ray's disconnect would wait for it. Once
            # disconnected (at once), the rest of Ray's shutdown may finish in the background.
            quit_ray = threading.Thread(target=ray.shutdown, daemon=True)
            quit_ray.start()
            quit_ray.join(GONE_SHUTDOWN_S)
        else:
            ray.shutdown()
        self._end_embedded()
        self._owns = False
        self._put_back_environment()
        with contextlib.suppress(ValueError):
            _current.remove(self)

    def __enter__(self) -> ClusterSession:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
