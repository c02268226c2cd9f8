"""Failures counted by cause in the run summary, and a failed job's cause in `jobs status`."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

from rich.console import Console

from clonefleet.cli.jobs import _jobs_status
from clonefleet.cli.summary import CAUSES_LISTED, RunEnd, cause_lines, print_summary, summary
from clonefleet.config import Config


def cause(text: str) -> dict[str, Any]:
    return {"summary": text, "attempts": 2, "waited_s": 0.0, "candidates": []}


def failed(i: int, why: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "job_id": f"sa_{i:08x}",
        "batch_id": "b_00000001",
        "agent": "a",
        "clone_index": i,
        "status": "failed",
        "stop_reason": "failed",
        "outcome": "failure",
        "result": None,
        "salvaged": False,
        "nonconforming": False,
        "concerns": [],
        "warnings": [],
        "error": "Error: subagent run failed",
        "model": "x",
        "turns": 0,
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        "cause": why,
    }


def test_failures_are_counted_by_cause_most_first():
    records = [failed(i, cause("HTTP 401 invalid_api_key on model x")) for i in range(12)]
    records += [failed(12 + i, cause("HTTP 500 server_error on model y")) for i in range(3)]
    records.append(failed(15, None))  # ended for another reason: no cause to count
    assert cause_lines(records) == [
        "12 failed: HTTP 401 invalid_api_key on model x",
        "3 failed: HTTP 500 server_error on model y",
    ]
    end = RunEnd(records=records, total=len(records), batch_id="b_00000001", elapsed_s=1.0)
    console = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    print_summary(console, summary(end, Config()))
    text = console.export_text()
    assert "cause        12 failed: HTTP 401 invalid_api_key on model x" in text
    assert text.index("12 failed") < text.index("3 failed") < text.index("failures: 16")
    assert "Error: subagent run failed" in text


def test_past_the_listed_causes_the_rest_are_counted_together():
    records = [failed(i, cause(f"HTTP 4{i:02d} e on model m")) for i in range(CAUSES_LISTED + 3)]
    lines = cause_lines(records)
    assert len(lines) == CAUSES_LISTED + 1 and lines[-1] == "3 failed: 3 other causes"


class OneJob:
    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def expand(self, ids: list[str]) -> list[str]:
        return ids

    def job_status(self, job_id: str) -> dict[str, Any]:
        return self.status


def test_jobs_status_shows_a_failed_jobs_cause(capsys):
    status = {
        **failed(0, cause("HTTP 401 invalid_api_key on model x\x1b[31m")),
        "display_name": "a #0",
        "cost_usd": None,
        "detail": None,
    }
    ns = argparse.Namespace(ids=["sa_00000000"], json=False)
    assert _jobs_status(OneJob(status), ns) == 0
    line = capsys.readouterr().out
    assert "cause: HTTP 401 invalid_api_key on model x" in line and "(2 attempts)" in line
    assert "\x1b" not in line
    assert _jobs_status(OneJob(status), argparse.Namespace(ids=["sa_00000000"], json=True)) == 0
    assert json.loads(capsys.readouterr().out)["cause"] == status["cause"]
