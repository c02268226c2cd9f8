"""The benchmark's plot: makespan and ratio to the floor against batch size, one line per
system (needs matplotlib, the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clonefleet.errors import UsageError

__all__ = ["check_plotting", "plot"]

_STYLE = {
    "clonefleet": {"color": "tab:blue", "marker": "o"},
    "floor": {"color": "tab:gray", "marker": "s"},
    "actor-per-clone": {"color": "tab:red", "marker": "^"},
}


def check_plotting() -> None:
    """Raises:
    UsageError: matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'clonefleet[plot]'") from None


def plot(report: dict[str, Any], path: str | Path) -> Path:
    """Draw ``report`` (from :func:`run_bench`) into the PNG file ``path``; returns it.

    Raises:
        UsageError: matplotlib is not installed.
    """
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in report["results"] if "skipped" not in r]
    params = report["params"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=100)
    for system, style in _STYLE.items():
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["n"])
        if not mine:
            continue
        ns = [r["n"] for r in mine]
        left.plot(ns, [r["makespan_s"] for r in mine], label=system, **style)
        left.fill_between(
            ns,
            [r["makespan_min_s"] for r in mine],
            [r["makespan_max_s"] for r in mine],
            color=style["color"],
            alpha=0.15,
        )
        ratios = [(r["n"], r["ratio_to_floor"]) for r in mine if r["ratio_to_floor"]]
        if system != "floor" and ratios:
            right.plot(*zip(*ratios, strict=True), label=system, **style)
            for x, y in ratios:  # the figure people look for, next to its point
                right.annotate(f"{y:.3g}x", (x, y), textcoords="offset points", xytext=(4, 6))
    sizes = sorted({r["n"] for r in rows})
    floor_s = params["turns"] * params["latency_ms"] / 1000
    left.axhline(floor_s, color="black", linestyle="--", linewidth=1, label="turns x latency")
    right.axhline(1.0, color="tab:gray", linestyle="--", linewidth=1, label="floor")
    left.set(xscale="log", yscale="log", xlabel="batch size (clones)", ylabel="makespan (s)")
    right.set(xscale="log", yscale="log", xlabel="batch size (clones)", ylabel="makespan / floor")
    right.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    left.set_title("makespan (median, band: min-max)")
    right.set_title("ratio to the asyncio floor")
    right.margins(y=0.2)
    for ax in (left, right):
        ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=9)
    fig.suptitle(
        f"clonefleet bench: {params['turns']} turns x {params['latency_ms']:g} ms, "
        f"{report['machine']['cpus']} CPUs",
        fontsize=11,
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
