"""The trust records: the project folders whose own ``.clonefleet/config.yaml`` and files may ask
for what only ``clonefleet trust`` allows (docs/config.md, "Trusting a project's config").

The records are ``$XDG_STATE_HOME/clonefleet/trusted.json`` (default
``~/.local/state/clonefleet/trusted.json``):
``{"version": 1, "trusted": [{"dir": "/abs/project", "since": "2025-01-01T00:00:00+00:00"}]}``.
They are rewritten whole (a temporary file renamed over the old one) under a lock file beside
them, so two ``trust`` commands at once lose neither folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from clonefleet.config._files import MAX_CONFIG_BYTES, printable, read_regular_file
from clonefleet.errors import ConfigError, UsageError

__all__ = ["read_trust_records", "revoke_folder", "trust_file", "trust_folder"]


def trust_file() -> Path:
    """The trust records, ``$XDG_STATE_HOME/clonefleet/trusted.json`` (default
    ``~/.local/state/clonefleet/trusted.json``); :func:`trust_folder` and :func:`revoke_folder` write them."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "clonefleet" / "trusted.json"


def read_trust_records(file: Path | None = None) -> list[dict[str, str]]:
    """The trusted project folders, ``[{dir, since}]``; empty when there is no file.

    Raises:
        ConfigError: the file cannot be read or is not a trust-record file.
    """
    file = file or trust_file()
    where = printable(str(file))
    try:
        data = json.loads(read_regular_file(file, MAX_CONFIG_BYTES))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read trust records: {exc.strerror or exc}", where) from None
    except ValueError:
        data = None
    records = data.get("trusted") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and isinstance(r.get("dir"), str) for r in records
    ):
        raise ConfigError("not a clonefleet trust-record file; fix or delete it", where)
    return [{"dir": r["dir"], "since": str(r.get("since", ""))} for r in records]


@contextlib.contextmanager
def _locked(file: Path) -> Iterator[None]:
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(file.with_name(file.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _write(file: Path, records: list[dict[str, str]]) -> None:
    text = json.dumps({"version": 1, "trusted": records}, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=".trusted-", suffix=".json")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def trust_folder(directory: str | os.PathLike[str]) -> tuple[dict[str, str], bool]:
    """Trust the project folder ``directory``: returns its record and whether it is new.

    Raises:
        UsageError: ``directory`` is not a folder.
        ConfigError: the records cannot be read (see :func:`read_trust_records`).
    """
    folder = Path(directory).expanduser().resolve()
    if not folder.is_dir():
        raise UsageError(f"{printable(os.fspath(directory))}: no such folder")
    file = trust_file()
    with _locked(file):
        records = read_trust_records(file)
        old = next((r for r in records if r["dir"] == str(folder)), None)
        if old is not None:
            return old, False
        record = {"dir": str(folder), "since": datetime.now(UTC).isoformat(timespec="seconds")}
        _write(file, sorted([*records, record], key=lambda r: r["dir"]))
    return record, True


def revoke_folder(directory: str | os.PathLike[str]) -> str | None:
    """Stop trusting ``directory`` (which may no longer exist): returns the folder removed from
    the records, or ``None`` when it was not in them."""
    raw = Path(directory).expanduser()
    names = {str(raw.resolve()), os.path.abspath(raw)}
    file = trust_file()
    if not file.exists():
        return None
    with _locked(file):
        records = read_trust_records(file)
        kept = [r for r in records if r["dir"] not in names]
        if len(kept) == len(records):
            return None
        _write(file, kept)
    return next(r["dir"] for r in records if r["dir"] in names)
