"""The benchmark's arithmetic: percentiles, the spread of repeats, ratios and unit conversions.

Pure functions over plain numbers; nothing here measures or prints.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

__all__ = [
    "batch_tokens",
    "limit_min_makespan_s",
    "mb",
    "percentile",
    "ratio",
    "rounded",
    "spread",
    "tally",
]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0 to 1, nearest rank) of ``values``; ``None`` when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def spread(values: Sequence[float]) -> tuple[float, float, float] | None:
    """``(median, low, high)`` of the repeats of one measurement; ``None`` when there are none."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``; ``None`` when either is missing or the reference is not positive."""
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def rounded(x: float | None, nd: int = 1) -> float | None:
    """``round(x, nd)``, passing ``None`` through."""
    return None if x is None else round(x, nd)


def mb(n: float) -> float:
    """Bytes as megabytes (10^6), one decimal."""
    return round(n / 1e6, 1)


def tally(items: Iterable[str]) -> dict[str, int]:
    """How often each item occurs, in order of first occurrence."""
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def limit_min_makespan_s(
    requests: int, rpm: int | None, tpm: int | None, tokens: float | None
) -> float | None:
    """The least time ``requests`` model requests costing ``tokens`` tokens in all can take
    under the limits: the requests at ``rpm / 60`` a second, or the tokens at ``tpm / 60`` a
    second, whichever is longer; nothing is taken off for the burst a full bucket lets through
    at once. ``None`` when neither limit applies (no ``rpm``, and no ``tpm`` or no ``tokens``)."""
    spans = []
    if rpm:
        spans.append(requests / (rpm / 60.0))
    if tpm and tokens is not None:
        spans.append(tokens / (tpm / 60.0))
    return max(spans) if spans else None


def batch_tokens(requests: int, charged: int | None, answered: int | None) -> float | None:
    """Tokens ``requests`` requests of a batch cost: ``charged`` tokens for the ``answered``
    ones, at the same cost per request for the rest (a failed clone sent fewer than its share).
    ``None`` when nothing was answered or the server does not count."""
    if charged is None or not answered:
        return None
    return charged * requests / answered
