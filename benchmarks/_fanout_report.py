"""Figures and the printed report of the fan-out benchmark (``benchmarks/fanout.py``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "COLUMNS",
    "TARGETS",
    "mb",
    "percentile",
    "rounded",
    "table",
    "tally",
    "verdicts",
]

TARGETS = {"ratio_1000": 1.5, "ratio_10000": 2.0, "added_mb_10000": 3000.0, "cold_s": 20.0}


def mb(n: float) -> float:
    """Bytes as megabytes, one decimal."""
    return round(n / 1e6, 1)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``values``; ``None`` when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def rounded(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def tally(items: Iterable[str]) -> dict[str, int]:
    """How often each item occurs, in order of first occurrence."""
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


COLUMNS = (
    ("N", "n", "d"),
    ("clones/actor", "cpa", "s"),
    ("ray start s", "ray_start_s", ".2f"),
    ("spawn call s", "spawn_call_s", ".3f"),
    ("makespan s", "makespan_s", ".3f"),
    ("asyncio s", "baseline_s", ".3f"),
    ("ratio", "ratio", ".2f"),
    ("start/s", "start_rate_per_s", ".1f"),
    ("1st req p50 ms", "first_request_p50_ms", ".1f"),
    ("p99 ms", "first_request_p99_ms", ".1f"),
    ("added RSS MB", "added_rss_mb", ".1f"),
    ("added PSS MB", "added_pss_mb", ".1f"),
    ("ok", "ok", "s"),
)
"""(title, key of a result row, format spec) of each table column."""


def table(rows: list[dict[str, Any]]) -> str:
    cells = [[title for title, _, _ in COLUMNS]]
    cells += [
        ["-" if r.get(key) is None else format(r[key], spec) for _, key, spec in COLUMNS]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = [" ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]], cold: dict[str, Any] | None) -> list[str]:
    by_n = {r["n"]: r for r in rows}
    out = []
    if 1000 in by_n:
        r = by_n[1000]["ratio"]
        out.append(
            f"N=1000 within {TARGETS['ratio_1000']}x the asyncio loop: {'met' if r is not None and r <= TARGETS['ratio_1000'] else 'MISSED'} ({r}x)"
        )
    if 10000 in by_n:
        r, mem, ok = (
            by_n[10000]["ratio"],
            by_n[10000]["added_rss_mb"],
            by_n[10000]["completed_success"] == 10000,
        )
        met = (
            ok and r is not None and r <= TARGETS["ratio_10000"] and mem < TARGETS["added_mb_10000"]
        )
        out.append(
            f"N=10000 completes within {TARGETS['ratio_10000']}x, under 3 GB added: {'met' if met else 'MISSED'} ({r}x, {mem} MB RSS, {by_n[10000]['completed_success']}/10000 ok)"
        )
    if cold is not None:
        met = cold["completed_success"] == cold["count"] and cold["wall_s"] < TARGETS["cold_s"]
        out.append(
            f"cold `clonefleet run general-purpose --count {cold['count']}` under {TARGETS['cold_s']:g} s: {'met' if met else 'MISSED'} ({cold['wall_s']} s, {cold['completed_success']}/{cold['count']} ok)"
        )
    return out
