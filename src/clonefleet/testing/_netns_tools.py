"""Helpers of the one-machine cluster (``_netns.py``) that run as processes of their own, with
Python's standard library alone (run as a script: importing nothing of clonefleet).

``teardown PREFIX ROOT``: end every process in the network namespaces named ``PREFIX-*``,
delete those namespaces (their links go with them) and remove the folder ``ROOT``.

``janitor PREFIX ROOT``: wait until standard input closes (the harness that started it has
stopped, or died in any way, SIGKILL included), then do the same teardown.

``init``: the first process of a machine's PID namespace: it reaps the processes left to it
(their parents gone) until it is killed, which ends every process of that namespace.

``relay LISTEN_HOST PORT TARGET_PORT [SOURCES_FILE]``: forward TCP connections made to
``LISTEN_HOST:PORT`` to ``127.0.0.1:TARGET_PORT`` in the same network namespace (the simulated
provider binds loopback only; the relay lets the other machines reach it at its machine's
address); with ``SOURCES_FILE``, keep there, as JSON, the requests each source address sent and
when its last one came.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

GRACE_S = 1.0
"""How long processes get after SIGTERM before SIGKILL."""


def _ip(*args: str, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def namespaces(prefix: str) -> list[str]:
    """The network namespaces named ``prefix-*``."""
    listed = _ip("netns", "list").stdout.splitlines()
    names = [line.split()[0] for line in listed if line.strip()]
    return [name for name in names if name.startswith(prefix + "-")]


def pids_in(netns: str) -> set[int]:
    """Every process in network namespace ``netns``."""
    out = _ip("netns", "pids", netns).stdout.split()
    return {int(pid) for pid in out if pid.isdigit()}


def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_processes(names: list[str], grace_s: float = GRACE_S) -> set[int]:
    """SIGTERM every process of the namespaces ``names``, SIGKILL what is left after
    ``grace_s``; returns what is still there after 5 more seconds (nothing, normally)."""
    pids = set().union(*(pids_in(name) for name in names)) if names else set()
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.02)
        pids = set().union(*(pids_in(name) for name in names))
    deadline = time.monotonic() + 5.0
    while pids and time.monotonic() < deadline:
        _signal_all(pids, signal.SIGKILL)
        time.sleep(0.02)
        pids = set().union(*(pids_in(name) for name in names))
    return pids


def teardown(prefix: str, root: str | None) -> list[str]:
    """End the processes of the namespaces ``prefix-*``, delete them and remove ``root``;
    returns what could not be removed (empty when all went)."""
    names = namespaces(prefix)
    left = [f"pid {pid}" for pid in sorted(end_processes(names))]
    # Machines first, the switch (whose bridge holds the other ends of their links) last.
    for name in sorted(names, key=lambda n: n.endswith("-sw")):
        deleted = _ip("netns", "del", name)
        if deleted.returncode != 0:
            left.append(f"netns {name}: {deleted.stderr.strip()}")
    if root:
        shutil.rmtree(root, ignore_errors=True)
        if os.path.exists(root):
            left.append(f"folder {root}")
    return left


def janitor(prefix: str, root: str) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        sys.stdin.read()
    teardown(prefix, root)


def init() -> None:
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)
        except InterruptedError:
            pass


SOURCES_EVERY_S = 0.2
"""How often the relay writes its per-source counts (``relay ... SOURCES_FILE``)."""


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    seen: dict[str, float] | None = None,
) -> None:
    """Copy ``reader`` to ``writer``; with ``seen`` (a source's counts), count each chunk that
    starts an HTTP request (``POST `` or ``GET ``) and when the last one came."""
    try:
        while data := await reader.read(65536):
            if seen is not None and data.startswith((b"POST ", b"GET ")):
                seen["requests"] += 1
                seen["last_at"] = time.time()
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


def _write_json(path: str, value: object) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(value, out)
    os.replace(path + ".tmp", path)


async def _relay(host: str, port: int, target: int, sources_file: str | None = None) -> None:
    sources: dict[str, dict[str, float]] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        seen = sources.setdefault(str(peer[0]) if peer else "?", {"requests": 0, "last_at": 0.0})
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer, seen), _pipe(up_reader, writer))

    async def write_sources() -> None:
        while sources_file:
            await asyncio.to_thread(_write_json, sources_file, dict(sources))
            await asyncio.sleep(SOURCES_EVERY_S)

    server = await asyncio.start_server(serve, host, port, backlog=1024)
    print(f"relaying {host}:{port} to 127.0.0.1:{target}", flush=True)  # noqa: T201
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    writing = asyncio.create_task(write_sources())
    async with server:
        await stop.wait()
    writing.cancel()


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "teardown":
        left = teardown(argv[1], argv[2] or None)
        for item in left:
            print(f"left: {item}", file=sys.stderr)  # noqa: T201
        return 1 if left else 0
    if len(argv) == 3 and argv[0] == "janitor":
        janitor(argv[1], argv[2])
        return 0
    if argv == ["init"]:
        init()
    if len(argv) in (4, 5) and argv[0] == "relay":
        asyncio.run(_relay(argv[1], int(argv[2]), int(argv[3]), *argv[4:]))
        return 0
    print(__doc__, file=sys.stderr)  # noqa: T201
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
