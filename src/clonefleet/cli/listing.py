"""What ``clonefleet jobs list`` prints: the table of one page, the usage totals lines, and the
``--json`` listing streamed page by page (docs/cli.md, docs/json.md).

It only formats what a listing source returns (a :class:`~clonefleet.Fleet` or the journal's
offline view); fetching and connecting stay in ``clonefleet.cli.control``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["HUMAN_PAGE", "STREAM_PAGE", "dollars", "jobs_table", "stream_listing", "totals_lines"]

HUMAN_PAGE = 100
"""Jobs ``jobs list`` shows in its table unless ``--limit`` says otherwise."""
STREAM_PAGE = 1000
"""Jobs per reply while ``jobs list --json`` streams a whole listing."""


def jobs_table(jobs: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table()
    for col in (
        "job",
        "batch",
        "agent",
        "clone",
        "status",
        "outcome",
        "model",
        "parent",
        "tokens",
        "cost",
        "progress",
    ):
        table.add_column(col, no_wrap=True)
    for j in jobs:
        progress = (
            (j["progress"] or {}).get("summary", "") if isinstance(j["progress"], dict) else ""
        )
        table.add_row(
            j["job_id"],
            j["batch_id"],
            j["agent"],
            str(j["clone_index"]),
            j["status"],
            str(j["outcome"] or ""),
            str(j["model"]),
            str(j["parent"] or ""),
            f"{j['usage'].get('total_tokens', 0):,}",
            dollars(j.get("cost_usd")),
            progress[:40],
        )
    return table


def dollars(cost: float | None) -> str:
    return "-" if cost is None else f"${cost:,.4f}"


def totals_lines(totals: dict[str, Any]) -> list[str]:
    """One line per batch of the page and one for the fleet: tokens, cost and budget."""

    def usage(t: dict[str, Any]) -> str:
        line = (
            f"{t['total_tokens']:,} tokens (in {t['input_tokens']:,}, out {t['output_tokens']:,})"
            f", cost {dollars(t['cost_usd'])}"
        )
        if t["unpriced_tokens"] and t["cost_usd"] is not None:
            line += f" (+{t['unpriced_tokens']:,} tokens on models without a price)"
        return line

    lines = []
    for batch_id, t in totals["batches"].items():
        line = f"batch {batch_id}: {t['jobs']:,} jobs, {usage(t)}"
        budget = t.get("budget")
        if budget:
            limits = [f"{budget['budget_tokens']:,} tokens"] if budget["budget_tokens"] else []
            if budget["budget_usd"] is not None:
                limits.append(f"${budget['budget_usd']:,.4f}")
            state = "passed: stopped" if budget["passed"] else "not passed"
            line += f"; budget {' or '.join(limits)} ({state})"
        lines.append(line)
    lines.append(f"fleet: {usage(totals['fleet'])}")
    return lines


def stream_listing(
    source: Any, filters: dict[str, Any], cursor: str | None, limit: int | None
) -> int:
    """``jobs list --json``: one JSON object (``docs/json.md``), written as its pages arrive, so
    no reply and no buffer holds every job; with ``limit``, that one page and its cursor."""
    query = {**filters, "cursor": cursor, "limit": limit or STREAM_PAGE}
    batches: dict[str, Any] = {}
    sep = "\n"
    sys.stdout.write('{"jobs": [')
    while True:
        page = source.list_jobs(**query)
        for job in page["jobs"]:
            sys.stdout.write(sep + json.dumps(job, default=str))
            sep = ",\n"
        batches.update(page["totals"]["batches"])
        if limit is not None or page["next_cursor"] is None:
            break
        query["cursor"] = page["next_cursor"]
    tail = {
        "capacity": page["capacity"],
        "totals": {"fleet": page["totals"]["fleet"], "batches": batches},
        "next_cursor": page["next_cursor"],
    }
    sys.stdout.write("\n], " + json.dumps(tail, default=str)[1:] + "\n")
    return 0
