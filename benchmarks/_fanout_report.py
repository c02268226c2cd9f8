"""Small figures shared by the benchmark scripts, and the fan-out targets and their verdicts
(``benchmarks/fanout.py``; ``messaging.py`` and the faults scripts use the helpers)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clonefleet.bench import percentile

__all__ = ["TARGETS", "mb", "percentile", "rounded", "tally", "verdicts"]

TARGETS = {
    "ratio_1000": 1.2,
    "ratio_10000": 1.0,
    "cpu_ms_per_clone_10000": 0.8,
    "added_mb_10000": 500.0,
    "cold_s": 6.0,
}


def mb(n: float) -> float:
    """Bytes as megabytes, one decimal."""
    return round(n / 1e6, 1)


def rounded(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def tally(items: Iterable[str]) -> dict[str, int]:
    """How often each item occurs, in order of first occurrence."""
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def verdicts(results: list[dict[str, Any]], cold: dict[str, Any] | None) -> list[str]:
    """One line per target the run could check (clonefleet's rows of ``clonefleet.bench``)."""
    by_n = {r["n"]: r for r in results if r["system"] == "clonefleet"}
    out = []
    if 1000 in by_n:
        r = by_n[1000]["ratio_to_floor"]
        ok = r is not None and r <= TARGETS["ratio_1000"]
        out.append(f"N=1000 within {TARGETS['ratio_1000']}x the floor: {_met(ok)} ({r}x)")
    if 10000 in by_n:
        row = by_n[10000]
        r, mem, done = row["ratio_to_floor"], row["added_rss_mb"], row["completed"]
        ok = done == row["clones"] and r is not None and r <= TARGETS["ratio_10000"]
        out.append(
            f"N=10000 completes at or under {TARGETS['ratio_10000']}x the floor: "
            f"{_met(ok)} ({r}x, {done}/{row['clones']} ok)"
        )
        cpu_ms = row["cpu_s_per_clone"] * 1000
        ok = cpu_ms <= TARGETS["cpu_ms_per_clone_10000"]
        out.append(
            f"N=10000 CPU per clone at or under {TARGETS['cpu_ms_per_clone_10000']} ms: "
            f"{_met(ok)} ({cpu_ms:.2f} ms)"
        )
        ok = mem < TARGETS["added_mb_10000"]
        out.append(
            f"N=10000 under {TARGETS['added_mb_10000']:g} MB added: {_met(ok)} ({mem} MB RSS)"
        )
    if cold is not None:
        ok = cold["completed_success"] == cold["count"] and cold["wall_s"] < TARGETS["cold_s"]
        out.append(
            f"cold `clonefleet run general-purpose --count {cold['count']}` under "
            f"{TARGETS['cold_s']:g} s: {_met(ok)} ({cold['wall_s']} s, "
            f"{cold['completed_success']}/{cold['count']} ok)"
        )
    return out
