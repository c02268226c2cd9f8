"""Resuming an ``--inputs`` run from its batch: which batch an identical command left behind
(the run ledger in the state folder), and what that batch already holds (docs/inputs.md)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clonefleet.control import JobListing
from clonefleet.vocab import JobState

__all__ = ["Adopted", "LedgerEntry", "RunLedger", "adopt", "run_fingerprint"]

KEEP_ENTRIES = 200
"""The most entries the ledger keeps (the oldest are removed when a new one is written)."""
_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


def run_fingerprint(parts: Mapping[str, Any]) -> str:
    """The identity of a command: a digest of ``parts`` (the definition, prompt, inputs file,
    key, format, limit, variables, model... as JSON with sorted keys). Two commands with the
    same parts are the same run, resumed rather than begun again."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """The batch an ``--inputs`` run submitted, kept until that run has ended."""

    batch_id: str
    address: str | None
    """Where it ran: ``None`` for an embedded cluster, else the address given."""
    journal: str | None = None
    """An embedded run's journal folder (where its batch can be read back from)."""
    detached: bool = False
    """Submitted with ``--detach``: the command that collects its records adopts it."""
    at: float = field(default_factory=time.time)


class RunLedger:
    """The ``--inputs`` runs still to finish, one small JSON file each in ``folder`` (the state
    folder's ``inputs/``), named by the run's fingerprint; the newest ``keep`` are kept. A file
    that cannot be read is taken as no entry."""

    def __init__(self, folder: str | os.PathLike[str], keep: int = KEEP_ENTRIES) -> None:
        self.folder, self.keep = Path(folder), keep

    def _path(self, fingerprint: str) -> Path:
        return self.folder / f"{fingerprint}.json"

    def find(self, fingerprint: str) -> LedgerEntry | None:
        """The entry of ``fingerprint``, or ``None``."""
        try:
            data = json.loads(self._path(fingerprint).read_text(encoding="utf-8"))
            return LedgerEntry(**data)
        except (OSError, ValueError, TypeError):
            return None

    def record(self, fingerprint: str, entry: LedgerEntry) -> None:
        """Write ``entry`` for ``fingerprint`` (atomically), removing the oldest entries past
        the newest ``keep``."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._path(fingerprint)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(entry)), encoding="utf-8")
        os.replace(tmp, path)
        entries = sorted(self.folder.glob("*.json"), key=_mtime)
        for old in entries[: max(len(entries) - self.keep, 0)]:
            with contextlib.suppress(OSError):
                old.unlink()

    def forget(self, fingerprint: str) -> None:
        """Remove the entry of ``fingerprint`` (the run ended: nothing is left to resume)."""
        with contextlib.suppress(OSError):
            self._path(fingerprint).unlink()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


@dataclass(frozen=True, slots=True)
class Adopted:
    """What a batch submitted by an earlier run of the same command holds, for the rows still
    to do: the feeder collects these jobs instead of submitting their rows again."""

    batch_id: str
    jobs: dict[str, str]
    """Key -> job id of each of the batch's jobs whose row is still to do."""
    ended: frozenset[str]
    """The job ids among those that have ended already (their records are read, not waited)."""
    size: int
    """Jobs in the batch: the clone index the next part starts at."""
    open: bool
    """Whether the batch takes more parts (rows that were never submitted go there)."""


def adopt(
    pages: Iterable[JobListing], batch_id: str, wanted: Callable[[str], bool]
) -> Adopted | None:
    """Read the listing ``pages`` of ``batch_id`` (``Fleet.iter_pages(batch=batch_id)``) into
    :class:`Adopted`, keeping only the jobs whose key ``wanted`` answers true for (rows whose
    record is not in the results file yet). ``None`` when the fleet does not know the batch."""
    jobs: dict[str, str] = {}
    ended: set[str] = set()
    size, is_open, known = 0, False, False
    for page in pages:
        batch = page["totals"]["batches"].get(batch_id)
        if batch is not None:
            known = True
            size = max(size, int(batch.get("jobs") or 0))
            is_open = bool(batch.get("open"))
        for job in page["jobs"]:
            key = job.get("key")
            if key is None or job.get("parent") is not None or not wanted(key):
                continue
            jobs[key] = job["job_id"]
            if job.get("status") in _TERMINAL:
                ended.add(job["job_id"])
    if not known and not jobs:
        return None
    return Adopted(batch_id, jobs, frozenset(ended), max(size, len(jobs)), is_open)
