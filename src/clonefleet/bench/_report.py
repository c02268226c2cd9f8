"""The benchmark's report: one summary row per batch size and system, the terminal table, and
the versions and machine recorded with the results (docs/json.md, ``clonefleet bench``)."""

from __future__ import annotations

import os
import platform
import statistics
from importlib import metadata
from typing import Any

from clonefleet.bench._measure import Sample
from clonefleet.bench._stats import (
    batch_tokens,
    limit_min_makespan_s,
    mb,
    percentile,
    ratio,
    rounded,
    spread,
)

__all__ = ["COLUMNS", "LIMIT_COLUMNS", "machine", "summarise", "table", "versions"]


def summarise(
    system: str, n: int, runs: list[Sample], params: Any, floor: list[Sample] | None
) -> dict[str, Any]:
    """One result row: the repeats of ``system`` at size ``n`` (``floor``: the floor's repeats
    at the same size, for the ratio)."""
    makespans = [r.makespan_s for r in runs]
    median, low, high = spread(makespans) or (0.0, 0.0, 0.0)
    floor_median = statistics.median(r.makespan_s for r in floor) if floor else None
    firsts = [ms for r in runs for ms in r.first_request_ms]
    requests = [r.requests / r.makespan_s for r in runs if r.requests and r.makespan_s > 0]
    completed = sum(r.completed for r in runs)
    return {
        "n": n,
        "system": system,
        "repeats": len(runs),
        "makespan_s": round(median, 3),
        "makespan_min_s": round(low, 3),
        "makespan_max_s": round(high, 3),
        "makespans_s": [round(m, 3) for m in makespans],
        "clones_per_s": rounded(ratio(n, median), 1),
        "ratio_to_floor": rounded(ratio(median, floor_median), 2),
        "first_request_p50_ms": rounded(percentile(firsts, 0.50)),
        "first_request_p99_ms": rounded(percentile(firsts, 0.99)),
        "cpu_s_per_clone": round(statistics.median(r.cpu_s for r in runs) / n, 6),
        "added_rss_mb": mb(max(r.added_rss_b for r in runs)),
        "added_pss_mb": mb(max(r.added_pss_b for r in runs)),
        "requests_per_s": rounded(statistics.median(requests), 1) if requests else None,
        # With a server of one's own (--base-url) its turns and latency are not known.
        "min_makespan_s": None
        if params.base_url
        else round(params.turns * params.latency_ms / 1000, 3),
        "completed": completed,
        "clones": n * len(runs),
        "errors": sorted({e for r in runs for e in r.errors}),
        **_cached(runs),
        **(_limited(n, runs, params, median) if getattr(params, "limited", False) else {}),
    }


def _total(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _cached(runs: list[Sample]) -> dict[str, Any]:
    """Input tokens over the repeats, those read from the prompt cache, and their share
    (``None`` where not known)."""
    tin = _total([r.input_tokens for r in runs])
    read = _total([r.cache_read_tokens for r in runs])
    return {
        "input_tokens": tin,
        "cache_read_tokens": read,
        "cached_share": rounded(ratio(read, tin), 4),
    }


def _limited(n: int, runs: list[Sample], params: Any, makespan_s: float) -> dict[str, Any]:
    """The fields of a row measured against a rate limit (docs/benchmarks.md, "Against a rate
    limit"): requests sent and 429s over the repeats, and the least makespan the limit allows."""
    needed = params.turns * n
    tokens = [batch_tokens(needed, r.tokens, r.answered) for r in runs]
    known = [t for t in tokens if t is not None]
    floor = limit_min_makespan_s(
        needed, params.rpm, params.tpm, statistics.median(known) if known else None
    )
    sent, refused = _total([r.requests for r in runs]), _total([r.rate_limited for r in runs])
    return {
        "requests_sent": sent,
        "rate_limited": refused,
        "rate_limited_share": rounded(ratio(refused, sent), 4),
        "tokens_per_batch": rounded(statistics.median(known), 0) if known else None,
        "limit_min_makespan_s": rounded(floor, 3),
        "ratio_to_limit_min": rounded(ratio(makespan_s, floor), 3),
    }


def _spread_cell(row: dict[str, Any]) -> str:
    return f"{row['makespan_min_s']:.3f}-{row['makespan_max_s']:.3f}"


COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("N", "n", "d"),
    ("system", "system", "s"),
    ("makespan s", "makespan_s", ".3f"),
    ("min-max s", "spread", "s"),
    ("clones/s", "clones_per_s", ".1f"),
    ("x floor", "ratio_to_floor", ".2f"),
    ("1st req p50 ms", "first_request_p50_ms", ".1f"),
    ("p99 ms", "first_request_p99_ms", ".1f"),
    ("CPU s/clone", "cpu_s_per_clone", ".5f"),
    ("added MB", "added_rss_mb", ".1f"),
    ("req/s", "requests_per_s", ".1f"),
    ("min s", "min_makespan_s", ".3f"),
    ("cached %", "cached_pct", ".1f"),
    ("ok", "ok", "s"),
)
"""(title, key of a result row, format) of each column of :func:`table`."""

LIMIT_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sent", "requests_sent", "d"),
    ("429s", "rate_limited", "d"),
    ("429 %", "rate_limited_pct", ".1f"),
    ("limit min s", "limit_min_makespan_s", ".3f"),
    ("x limit min", "ratio_to_limit_min", ".2f"),
)
"""The columns :func:`table` adds for rows measured against a rate limit."""


def _cells(row: dict[str, Any], columns: tuple[tuple[str, str, str], ...]) -> list[str]:
    if "skipped" in row:
        return [str(row["n"]), row["system"], f"skipped: {row['skipped']}"]
    shown = {**row, "spread": _spread_cell(row), "ok": f"{row['completed']}/{row['clones']}"}
    if row.get("rate_limited_share") is not None:
        shown["rate_limited_pct"] = 100 * row["rate_limited_share"]
    if row.get("cached_share") is not None:
        shown["cached_pct"] = 100 * row["cached_share"]
    return ["-" if shown.get(k) is None else format(shown[k], spec) for _, k, spec in columns]


def table(results: list[dict[str, Any]]) -> str:
    """The results as a plain-text table, one line per batch size and system (a skipped
    baseline gets its reason instead of figures); rows measured against a rate limit add
    :data:`LIMIT_COLUMNS`."""
    limited = any("limit_min_makespan_s" in r for r in results)
    columns = COLUMNS + LIMIT_COLUMNS if limited else COLUMNS
    head = [title for title, _, _ in columns]
    rows = [_cells(r, columns) for r in results]
    full = [r for r in rows if len(r) == len(head)]
    widths = [max(len(r[i]) for r in [head, *full]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        if len(cells) < len(head):  # a skipped row: N, system, then the reason
            return " ".join(c.rjust(w) for c, w in zip(cells[:2], widths, strict=False)) + (
                " " + cells[2]
            )
        return " ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    lines = [line(head), *(line(r) for r in rows)]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def versions() -> dict[str, str | None]:
    """Versions of clonefleet, Ray, Python and aiohttp."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("clonefleet", "ray", "aiohttp"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def machine() -> dict[str, Any]:
    """CPUs, memory, platform and load average of this machine."""
    total_mb = None
    try:
        total_mb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e6)
    except (ValueError, OSError):
        pass
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpus": os.cpu_count(),
        "memory_mb": total_mb,
        "platform": platform.platform(),
        "load_average": load,
    }
