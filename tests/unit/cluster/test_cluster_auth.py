"""Which token a Ray session uses, and how ``cluster up`` writes its token file (no Ray started).

The end-to-end checks (a client without the token refused, the log listing refused, an embedded
run leaving no token behind) are in ``tests/ray/test_cluster_auth.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from clonefleet.cluster import _connect, _local
from clonefleet.errors import ClusterError

pytestmark = pytest.mark.timeout(20)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLONEFLEET_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def _record_cluster(tmp_path: Path, address: str = "127.0.0.1:6390") -> Path:
    """A state file as the daemon writes it, for a cluster whose daemon is this process."""
    _local._write_token(_local.token_path())
    state = {
        "address": address,
        "pid": os.getpid(),
        "auth": "token",
        "auth_token_path": str(_local.token_path()),
        "ready": True,
    }
    _local.state_path().write_text(json.dumps(state))
    return _local.token_path()


def test_the_token_file_is_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = _local.token_path()
        _local._write_token(path)
        first = path.read_text()
        _local._write_token(path)  # `cluster up` again: a new token replaces the old
    finally:
        os.umask(old)
    assert path == tmp_path / "state" / "auth_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(path.read_text()) == 64 and path.read_text() != first
    assert [p.name for p in path.parent.iterdir()] == ["auth_token"]  # no temporary file left


def test_an_embedded_session_gets_a_fresh_token_in_memory():
    first = _connect._auth_environment(None)
    second = _connect._auth_environment(None)
    assert first["RAY_AUTH_MODE"] == "token" and first["RAY_AUTH_TOKEN_PATH"] is None
    assert len(first["RAY_AUTH_TOKEN"] or "") == 64
    assert first["RAY_AUTH_TOKEN"] != second["RAY_AUTH_TOKEN"]


def test_an_embedded_session_keeps_the_callers_explicit_choice(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert _connect._auth_environment(None) == {}
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/somewhere/token")
    assert _connect._auth_environment(None) == {"RAY_AUTH_MODE": "token"}


def test_the_local_cluster_is_joined_with_its_own_token_file(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "a token for some other cluster")
    with socket.create_server(("127.0.0.1", 0)) as gcs:  # `auto` checks the GCS port answers
        address = f"127.0.0.1:{gcs.getsockname()[1]}"
        token = _record_cluster(tmp_path, address)
        assert _local.resolve_address("auto") == address
    assert _connect._auth_environment(address) == {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": None,
        "RAY_AUTH_TOKEN_PATH": str(token),
    }


def test_other_addresses_send_the_callers_token_when_there_is_one(monkeypatch, tmp_path):
    _record_cluster(tmp_path)
    assert _connect._auth_environment("127.0.0.1:7000") == {}  # no token anywhere
    ray_default = tmp_path / "home" / ".ray" / "auth_token"
    ray_default.parent.mkdir(parents=True)
    ray_default.write_text("x" * 64)
    assert _connect._auth_environment("ray://10.0.0.5:10001") == {"RAY_AUTH_MODE": "token"}
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert _connect._auth_environment("ray://10.0.0.5:10001") == {}


def test_a_failed_connection_says_whether_a_token_was_sent(monkeypatch, tmp_path):
    _record_cluster(tmp_path)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    # No token anywhere: it may be the token that is missing.
    none = _connect._connect_hint("ray://10.0.0.5:10001", _connect._auth_environment("x:1"))
    assert "cannot be reached" in none and "sent none" in none and "RAY_AUTH_TOKEN" in none
    # A token sent (the caller's, from the environment): the cluster is out of reach, or the
    # token is not its own; never "set RAY_AUTH_TOKEN" as if none were there.
    monkeypatch.setenv("RAY_AUTH_TOKEN", "y" * 64)
    sent = _connect._connect_hint("ray://10.0.0.5:10001", _connect._auth_environment("x:1"))
    assert "cannot be reached" in sent and "refused the token this client sends" in sent
    assert "sent none" not in sent
    # An embedded instance, or `cluster up`'s own cluster (clonefleet holds its token): nothing.
    assert _connect._connect_hint(None, {}) == ""
    assert _connect._connect_hint("10.0.0.5:6379", {"RAY_AUTH_TOKEN_PATH": "/t"}) == ""


def test_a_dead_clusters_token_is_never_used_and_goes_with_cluster_down(tmp_path):
    token = _record_cluster(tmp_path)
    state = json.loads(_local.state_path().read_text())
    _local.state_path().write_text(json.dumps({**state, "pid": 2**22 + 1}))  # no such process
    assert _local.read_state() is None
    assert _local.local_token_path("127.0.0.1:6390") is None
    # The record stays for `cluster down`, which ends what is left of its session.
    assert _local.dead_daemon_state() is not None
    _local.cluster_down(timeout_s=0.1)
    assert not token.exists() and not _local.state_path().exists()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path (Ray's socket paths under it must fit)."""
    path = Path(tempfile.mkdtemp(prefix="cf", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_rays_temporary_folder_is_inside_a_folder_only_its_owner_enters(monkeypatch, short_tmp):
    tmp_path = short_tmp
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    base = tmp_path / f"clonefleet-{os.getuid()}"
    assert _local.private_ray_temp_dir() == base / "ray"
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    base.chmod(0o755)  # loosened since: tightened again
    assert _local.private_ray_temp_dir() == base / "ray"
    assert stat.S_IMODE(base.stat().st_mode) == 0o700

    base.rmdir()
    (tmp_path / "elsewhere").mkdir()
    base.symlink_to(tmp_path / "elsewhere")  # a planted link is never followed
    other = _local.private_ray_temp_dir()
    assert other.parent.parent == tmp_path and other.parent != base
    assert stat.S_IMODE(other.parent.stat().st_mode) == 0o700


def test_a_temporary_folder_too_long_for_rays_sockets_gives_way_to_tmp(monkeypatch, tmp_path):
    long = tmp_path / ("x" * 60)
    long.mkdir()
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(long))
    folder = _local.private_ray_temp_dir()
    assert folder == Path("/tmp") / f"clonefleet-{os.getuid()}" / "ray"
    # The longest socket Ray makes there still fits in a Unix socket's 107 bytes.
    sock = folder / "session_2026-12-01_18-29-13_525661_4194304" / "sockets" / "plasma_store.9"
    assert len(str(sock)) <= 107


def test_rays_raylet_notices_go_to_stderr_not_into_json_on_stdout(monkeypatch, capsys):
    from ray._private import worker

    monkeypatch.setattr(worker, "print_to_stdstream", worker.print_to_stdstream)
    _connect._ray_notices_to_stderr()
    _connect._ray_notices_to_stderr()  # once is enough: a second call wraps nothing again
    notice = "WARNING: 8 PYTHON worker processes have been started on node: abc"
    # As Ray's listener for the raylet's notices calls it (a module global, looked up per call).
    worker.print_to_stdstream({"lines": [notice], "pid": "raylet", "is_err": False}, False)
    out, err = capsys.readouterr()
    assert out == "" and notice in err


def test_a_head_that_starts_no_client_server_is_asked_again_then_named_in_the_error():
    failed = ConnectionAbortedError(
        "Initialization failure from server:\nRuntimeError: Starting Ray client server failed."
    )
    calls: list[str] = []

    def init_failing(times: int):
        def init(address: str, **kwargs: object) -> None:
            calls.append(address)
            if len(calls) <= times:
                raise failed

        return init

    # Refused twice, then a server: the third connection is the session.
    _connect._join("ray://10.0.0.5:10001", {}, init_failing(2), lambda: None)
    assert len(calls) == _connect.CLIENT_SERVER_TRIES == 3
    # Refused every time: the last refusal is the error, with a hint that names the head.
    calls.clear()
    with pytest.raises(ConnectionAbortedError):
        _connect._join("ray://10.0.0.5:10001", {}, init_failing(99), lambda: None)
    assert len(calls) == 3
    hint = _connect._connect_hint("ray://10.0.0.5:10001", {}, str(failed))
    assert "head could not start a Ray Client server" in hint
    assert "GRPC_ENABLE_FORK_SUPPORT=0" in hint and "cannot be reached" not in hint
    # Any other refusal (or a GCS address) is not made again.
    calls.clear()

    def refused(address: str, **kwargs: object) -> None:
        calls.append(address)
        raise ConnectionError("timed out")

    with pytest.raises(ConnectionError):
        _connect._join("ray://10.0.0.5:10001", {}, refused, lambda: None)
    with pytest.raises(ConnectionAbortedError):
        _connect._join("10.0.0.5:6379", {}, init_failing(99), lambda: None)
    assert len(calls) == 2


def test_client_endpoints_of_ray_client_addresses():
    assert _connect.client_endpoint("ray://10.0.0.5:10001") == "10.0.0.5:10001"
    assert _connect.client_endpoint("ray://head.internal") == "head.internal:10001"
    assert _connect.client_endpoint("ray://10.0.0.5:2345/extra") == "10.0.0.5:2345"
    assert _connect.client_endpoint("10.0.0.5:6379") is None
    assert _connect.client_endpoint(None) is None


def test_a_ray_client_address_that_does_not_answer_fails_at_once_saying_so():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    session = _connect.ClusterSession(_connect.ClusterConfig(address=f"ray://127.0.0.1:{port}"))
    with pytest.raises(ClusterError) as failed:
        session.start()
    text = str(failed.value)
    assert f"ray://127.0.0.1:{port} cannot be reached from here" in text
    assert "Jobs already on the cluster go on" in text
    assert not _connect.through_client() and not session._owns


def test_a_ray_client_connect_whose_head_stops_answering_fails_saying_so(monkeypatch):
    monkeypatch.setattr(_connect, "CLIENT_PROBE_S", 0.05)
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    tries: list[str] = []
    released = threading.Event()

    def init(address: str, **kwargs: object) -> None:  # Ray Client, never answered
        tries.append(address)
        listening.close()  # the head is cut off once the connection began
        released.wait(10)

    try:
        with pytest.raises(ClusterError) as failed:
            _connect._join(f"ray://127.0.0.1:{port}", {}, init, lambda: None)
    finally:
        released.set()
    assert tries == [f"ray://127.0.0.1:{port}"]
    assert f"ray://127.0.0.1:{port} cannot be reached from here" in str(failed.value)
    # A connection that ends on its own is waited for, its error handed on as it is.
    with pytest.raises(ConnectionRefusedError):
        _connect._join("ray://127.0.0.1:1", {}, _refuse, lambda: None)


def _refuse(address: str, **kwargs: object) -> None:
    raise ConnectionRefusedError(address)
