"""The verdicts and the printed table of the fault benchmark (``benchmarks/faults.py``)."""

from __future__ import annotations

from typing import Any

__all__ = ["NAMES", "judge", "print_table"]

NAMES = {
    1: "scheduler SIGKILL mid-batch",
    2: "clone host SIGKILL mid-turn",
    3: "idle warm hosts killed, batch at once",
    4: "cluster down with clones running, up",
    5: "frozen scheduler (SIGSTOP), jobs wait",
    6: "--address auto with no cluster",
    7: "journal overhead",
}

_RECOVERY = {
    1: (
        ("killed_at_s", "killed at +{} s"),
        ("scheduler_back_s", "scheduler back {} s"),
        ("all_running_again_s", "all running again {} s"),
        ("batch_done_after_kill_s", "batch done {} s"),
    ),
    2: (
        ("killed_at_s", "killed at +{} s"),
        ("victim_restarted_s", "victim restarted {} s"),
        ("victim_resumed_turn", "from turn {}"),
        ("all_running_again_s", "all running again {} s"),
        ("batch_done_after_kill_s", "batch done {} s"),
    ),
    3: (("hosts_killed", "{} hosts killed"), ("pool_replaced_s", "pool replaced {} s")),
    4: (
        ("down_s", "down {} s"),
        ("offline_list_s", "offline list {} s"),
        ("up_again_s", "up {} s"),
        ("first_command_after_up_s", "first command after up {} s"),
        ("done_after_up_s", "done {} s after up"),
        ("resumed_from", "resumed from {}"),
    ),
    5: (
        ("wait_answering_s", "wait --timeout 5: {} s answering"),
        ("wait_frozen_s", "{} s frozen"),
        ("done_after_sigcont_s", "done {} s after SIGCONT"),
    ),
    6: (("fail_s", "fails in {} s"), ("rc", "exit {}"), ("names_cluster_up", "names up: {}")),
}


def _fault_checks(n: int, rec: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """What a fault's own figures must show."""
    bad = []
    if n == 1 and rec.get("scheduler_back_s") is None:
        bad.append("scheduler not back")
    if n in (1, 2) and rec.get("all_running_again_s") is None:
        bad.append("a restarted job did not run again")
    if n == 2 and (rec.get("victim_restarted_s") is None or not row.get("restarted_jobs")):
        bad.append("victim not restarted")
    if n == 3 and rec.get("pool_replaced_s") is None:
        bad.append("pool did not report the replacements")
    if n == 4:
        off, says = row.get("offline", {}), (row.get("down", {}).get("says") or [{}])[0]
        if says.get("running_jobs_ended") != row.get("expected_running"):
            bad.append(f"down ended {says.get('running_jobs_ended')} running jobs")
        if off.get("list_rc") != 0 or not off.get("results_same_as_before"):
            bad.append("finished results not readable offline")
        if off.get("unfinished_result_rc") != 2 or not off.get("unfinished_result_names_up"):
            bad.append("unfinished result does not point to cluster up")
    if n == 5:
        if rec.get("wait_frozen_rc") in (0, None):
            bad.append(f"frozen wait exit {rec.get('wait_frozen_rc')}")
        if (rec.get("wait_frozen_s") or 99) > (rec.get("wait_answering_s") or 0) + 3:
            bad.append("frozen wait > 3 s longer than an answered one")
        if rec.get("wait_after_sigcont_rc") != 0:
            bad.append("batch not completed after SIGCONT")
    if n == 6 and (rec.get("rc") in (0, None) or not rec.get("names_cluster_up")):
        bad.append("no clear failure naming `clonefleet cluster up`")
    return bad


def judge(row: dict[str, Any], count: int) -> None:
    """Set ``row["verdict"]``: ``ok``, or what looks wrong."""
    if row.get("note"):
        row["verdict"] = f"not run: {row['note']}"
        return
    bad = [row["error"]] if row.get("error") else []
    n, rec = row["fault"], row.get("recovery") or {}
    expected = row.get("expected_jobs", 0)
    if expected and not row.get("error"):
        good = (row.get("statuses") or {}).get("completed/success", 0)
        if not row.get("done") or good != expected:
            bad.append(f"{good}/{expected} completed/success: {row.get('statuses')}")
        if row.get("ends_once") is False:
            bad.append(f"end records not once each ({row.get('ends_missing_or_repeated')})")
    if not row.get("error"):
        bad += _fault_checks(n, rec, row)
    row["verdict"] = "ok" if not bad else "CHECK: " + "; ".join(bad)


def _jobs(row: dict[str, Any]) -> str:
    expected = row.get("expected_jobs")
    if not expected:
        return "-"
    good = (row.get("statuses") or {}).get("completed/success", 0)
    once = {True: "yes", False: "NO", None: "-"}[row.get("ends_once")]
    return f"{good}/{expected} ok, ends once: {once}, restarted {row.get('restarted_jobs')}"


def _recovery(row: dict[str, Any]) -> str:
    rec = row.get("recovery") or {}
    parts = [fmt.format(rec[k]) for k, fmt in _RECOVERY.get(row["fault"], ()) if k in rec]
    return "; ".join(parts) or "-"


def _cost(row: dict[str, Any]) -> str:
    mk, base, cost = row.get("makespan_s"), row.get("baseline_makespan_s"), row.get("cost_s")
    if mk is None:
        return "-"
    if base is None:
        return f"makespan {mk} s"
    return f"{mk} s vs {base} s ({cost:+} s)"


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("#", "fault", "jobs", "recovery", "makespan vs no fault", "verdict")
    cells = [
        (
            f"{r['fault']}" + (f".{r['repeat']}" if r.get("repeat") else ""),
            r["name"],
            _jobs(r),
            _recovery(r),
            _cost(r),
            r.get("verdict", ""),
        )
        for r in rows
    ]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for line in (head, *cells):
            print(" | ".join(line))  # noqa: T201 - a benchmark script prints its table
        return
    table = Table(title="clonefleet faults", show_lines=True)
    for name in head:
        table.add_column(name, overflow="fold")
    for line in cells:
        table.add_row(*line)
    Console(width=200).print(table)
