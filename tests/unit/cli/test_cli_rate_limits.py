"""How the CLI shows the fleet's rate limits (no Ray): the live display's lines and how often
they are read, the run summary's refusals, `jobs list`'s table and JSON, and the
`rate_limited` event in `clonefleet events`."""

from __future__ import annotations

import argparse
import io
import json
import re
from typing import Any

import pytest
from rich.console import Console

from clonefleet.cli.events import describe, rate_limited_text
from clonefleet.cli.jobs import _jobs_list, rate_limits_table, read_rate_limits, stream_listing
from clonefleet.cli.progress import (
    RATE_LIMITS_EVERY_S,
    SCOPES_SHOWN,
    RateLimitPoll,
    Tally,
    Watcher,
    rate_limit_line,
    render_live,
    scope_label,
    shown_scopes,
    watch,
)
from clonefleet.cli.summary import RunEnd, refusals_text, summary
from clonefleet.config import Config
from clonefleet.errors import ClusterError
from clonefleet.testing import FakeClock

pytestmark = pytest.mark.timeout(20)

JOBS = [f"sa_{i:08x}" for i in range(4)]


def row(**fields: Any) -> dict[str, Any]:
    """A limiter row (docs/json.md, "Rate limits"): an open provider scope unless told."""
    base = {
        "scope": "p",
        "provider": "p",
        "model": None,
        "source": "none",
        "rpm_limit": None,
        "tpm_limit": None,
        "max_in_flight": None,
        "rpm_now": 0.0,
        "tpm_now": 0.0,
        "in_flight": 0,
        "waiting": 0,
        "rate_limited": 0,
        "rate_limited_last_min": 0,
        "paused_s": 0.0,
    }
    return {**base, **fields}


HEADERS = row(
    scope="p/sim-small",
    model="sim-small",
    source="headers",
    rpm_limit=1140.0,
    rpm_now=1102.0,
    waiting=12,
    rate_limited=3,
    rate_limited_last_min=1,
)


def env(job: str, event: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "subagent_event",
        "subagent_run_id": job,
        "display_name": "general-purpose #0",
        "batch_id": "b_00000001",
        "event": {"ts": 0.0, **event},
    }


def refused(job: str, model: str = "sim-small", status: int = 429) -> dict[str, Any]:
    event = {"type": "rate_limited", "model": model, "provider": "p", "status": status}
    return env(job, {**event, "retry_after_s": 2.0})


def text_of(renderable: Any, width: int = 120) -> str:
    console = Console(
        file=io.StringIO(), force_terminal=True, width=width, record=True, color_system=None
    )
    console.print(renderable)
    return console.export_text()


# -- one line per scope --------------------------------------------------------------------
def test_a_scope_on_one_line_names_the_limit_its_source_the_waiting_and_the_refusals():
    assert rate_limit_line(HEADERS) == (
        "p/sim-small  1,102 of 1,140 rpm (headers) · 12 waiting · 3 × 429 (1 last min)"
    )


def test_tokens_slots_and_a_pause_are_shown_only_when_they_say_something():
    line = rate_limit_line(
        row(
            source="config",
            tpm_limit=90_000.0,
            tpm_now=40_210.0,
            rpm_now=55.0,
            max_in_flight=16,
            in_flight=3,
            paused_s=2.04,
        )
    )
    assert line == "p  55 rpm, 40,210 of 90,000 tpm (config) · 3 of 16 in flight · paused 2.0s"
    assert rate_limit_line(row(in_flight=2, tpm_now=900.0)) == "p  0 rpm · 2 in flight"


def test_only_scopes_with_a_limit_a_window_waiting_or_refusals_are_shown():
    open_scope, probing = row(rpm_now=500.0), row(scope="q", provider="q", max_in_flight=16)
    refusing = row(scope="r", provider="r", rate_limited=1)
    assert shown_scopes([open_scope, probing, refusing, HEADERS]) == [probing, refusing, HEADERS]


def test_labels_are_provider_and_model_and_printable():
    assert scope_label(HEADERS) == "p/sim-small"
    assert scope_label(row()) == "p"
    assert "\x1b" not in scope_label(row(provider="p\x1b[31m", model="m"))


# -- the live display ----------------------------------------------------------------------
def test_live_region_shows_the_limited_scopes_between_the_progress_and_the_bar():
    tally = Tally(JOBS, clock=FakeClock())
    tally.limits = [row(rpm_now=3.0), HEADERS]
    text = text_of(render_live(tally))
    assert "p/sim-small  1,102 of 1,140 rpm (headers) · 12 waiting · 3 × 429" in text
    assert "p  3 rpm" not in text  # the open scope says nothing
    assert text.index("latest progress") < text.index("p/sim-small") < text.index("0/4 done")


def test_live_region_counts_the_scopes_past_the_ones_it_shows():
    tally = Tally(JOBS, clock=FakeClock())
    tally.limits = [row(scope=f"p/m{i}", model=f"m{i}", rpm_limit=60.0) for i in range(12)]
    text = text_of(render_live(tally))
    assert text.count(" of 60 rpm") == SCOPES_SHOWN
    assert f"{12 - SCOPES_SHOWN} more rate-limited scopes" in text


def test_the_limits_are_read_at_most_every_few_seconds_and_a_failed_read_keeps_the_last():
    clock = FakeClock()
    reads: list[float] = []
    answers: list[Any] = [[HEADERS], ClusterError("gone"), [row()]]

    def read() -> list[dict[str, Any]]:
        reads.append(clock())
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    tally = Tally(JOBS, clock=clock)
    watcher = Watcher(tally, [], poll=RateLimitPoll(read, clock))
    for _ in range(int(3 * RATE_LIMITS_EVERY_S / 0.25)):  # redraws 4 times a second
        watcher.page([])
        if len(reads) == 2:
            assert tally.limits == [HEADERS]  # the failed read kept what was read before
        clock.advance(0.25)
    assert len(reads) == 3 and tally.limits == [row()]
    assert all(b - a >= RATE_LIMITS_EVERY_S for a, b in zip(reads, reads[1:], strict=False))


# -- the summary ---------------------------------------------------------------------------
def test_refusals_are_counted_by_model_and_the_summary_says_so():
    tally = Tally(JOBS, clock=FakeClock())
    Watcher(tally, []).page(
        [refused(JOBS[0]), refused(JOBS[1]), refused(JOBS[1], "sim-large", 529)]
    )
    assert tally.rate_limited == {"p/sim-small": 2, "p/sim-large": 1}
    assert refusals_text(tally.rate_limited) == "2 on p/sim-small, 1 on p/sim-large"
    end = RunEnd(records=[], total=4, batch_id="b_00000001", elapsed_s=1.0)
    with_refusals = RunEnd(
        records=[], total=4, batch_id="b_00000001", elapsed_s=1.0, rate_limited=tally.rate_limited
    )
    assert "429s" not in text_of_parts(summary(end, Config()))
    shown = text_of_parts(summary(with_refusals, Config()))
    assert "429s         2 on p/sim-small, 1 on p/sim-large" in shown


def text_of_parts(parts: list[Any]) -> str:
    return "".join(text_of(p) for p in parts)


# -- jobs list -----------------------------------------------------------------------------
class Source:
    """A listing of no jobs and the limiter's rows (or a limiter that fails)."""

    def __init__(self, rows: list[dict[str, Any]] | Exception) -> None:
        self.rows = rows

    def list_jobs(self, **filters: Any) -> dict[str, Any]:
        fleet = {
            "jobs": 0,
            "input_tokens": 0,
            "output_tokens": 0,
            "total_tokens": 0,
            "cost_usd": None,
            "unpriced_tokens": 0,
        }
        return {
            "jobs": [],
            "capacity": {"running": 0, "max_concurrency": None, "queued": 0},
            "totals": {"fleet": fleet, "batches": {}},
            "next_cursor": None,
        }

    def rate_limits(self) -> list[dict[str, Any]]:
        if isinstance(self.rows, Exception):
            raise self.rows
        return self.rows


def list_args(**given: Any) -> argparse.Namespace:
    base = {
        "status": None,
        "batch": None,
        "agent": None,
        "parent": None,
        "cursor": None,
        "key": None,
    }
    return argparse.Namespace(**{**base, "limit": None, "json": False, **given})


def test_the_table_has_one_row_per_scope_with_rates_source_waiting_and_429s():
    text = text_of(rate_limits_table([HEADERS, row(rpm_now=7.0, max_in_flight=16, in_flight=2)]))
    assert "rate limits" in text
    for column in ("provider/model", "rpm now / limit", "tpm now / limit", "source", "waiting"):
        assert column in text
    assert "in flight" in text and "429s (last min)" in text
    line = next(x for x in text.splitlines() if "p/sim-small" in x)
    assert [c.strip() for c in line.strip("│ ").split("│")] == [
        "p/sim-small",
        "1,102 / 1,140",
        "0 / -",
        "headers",
        "12",
        "0",
        "3 (1)",
    ]
    assert "2 / 16" in text and "7 / -" in text


def test_jobs_list_prints_the_rate_limits_under_the_jobs_when_there_are_any(capsys):
    assert _jobs_list(Source([HEADERS]), list_args()) == 0
    out = capsys.readouterr().out
    assert out.index("slots in use") < out.index("rate limits") < out.index("p/sim-small")
    assert _jobs_list(Source([]), list_args()) == 0
    assert "rate limits" not in capsys.readouterr().out


def test_jobs_list_json_carries_the_rows_and_keeps_its_keys(capsys):
    assert stream_listing(Source([HEADERS]), {}, None, None) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"jobs", "capacity", "totals", "next_cursor", "rate_limits"}
    assert out["rate_limits"] == [HEADERS]
    assert stream_listing(Source(ClusterError("no limiter")), {}, None, None) == 0
    assert json.loads(capsys.readouterr().out)["rate_limits"] == []


def test_a_source_without_rate_limits_has_none():
    class Journal:
        pass

    assert read_rate_limits(Journal()) == []
    assert read_rate_limits(Source(ClusterError("frozen"))) == []
    assert read_rate_limits(Source([HEADERS, "junk"])) == [HEADERS]  # type: ignore[list-item]


# -- events --------------------------------------------------------------------------------
def test_a_rate_limited_event_reads_as_a_sentence():
    line = describe({**refused(JOBS[0]), "display_name": "general-purpose #0"})
    assert line == (
        f"general-purpose #0 [{JOBS[0]}] rate_limited HTTP 429 from p on sim-small; retry after"
        " 2.0s; the request waits for capacity"
    )
    bare = {"type": "rate_limited", "provider": "p", "status": 503, "retry_after_s": None}
    assert rate_limited_text(bare) == "HTTP 503 from p; the request waits for capacity"
    other = describe(env(JOBS[0], {"type": "progress", "progress": {"summary": "x"}}))
    assert other.endswith('progress {"progress": {"summary": "x"}}')


# -- watch ---------------------------------------------------------------------------------
class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Batch:
    batch_id = "b_00000001"
    job_ids = (JOBS[0],)


class LimitedFleet:
    """One job that is refused once and then ends; the limiter's rows are counted as read."""

    def __init__(self) -> None:
        self.reads = 0
        self.pages = [[env(JOBS[0], {"type": "started"}), refused(JOBS[0])], [result(JOBS[0])]]

    def events(self, target: str, *, cursor: int, level: str, wait_s: float = 0.0) -> dict:
        page = self.pages[cursor] if cursor < len(self.pages) else []
        return {"events": page, "cursor": min(cursor + 1, len(self.pages))}

    def remaining(self, ids: list[str]) -> int:
        return 0

    def rate_limits(self) -> list[dict[str, Any]]:
        self.reads += 1
        return [HEADERS]


def result(job: str) -> dict[str, Any]:
    record = {
        "job_id": job,
        "clone_index": 0,
        "status": "completed",
        "stop_reason": "completed",
        "outcome": "success",
        "result": {"success": True, "summary": "done"},
        "error": None,
    }
    return env(job, {"type": "result", "record": record})


def test_watch_on_a_terminal_shows_the_fleets_rate_limits_and_counts_the_refusals():
    fleet, stream = LimitedFleet(), Tty()
    tally = watch(fleet, Batch(), stream=stream)
    assert fleet.reads == 1  # the pages came faster than one read every few seconds
    assert tally.rate_limited == {"p/sim-small": 1}
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", stream.getvalue())
    assert "p/sim-small  1,102 of 1,140 rpm (headers)" in shown


def test_watch_off_a_terminal_reads_no_rate_limits():
    fleet = LimitedFleet()
    tally = watch(fleet, Batch(), stream=io.StringIO())
    assert fleet.reads == 0 and tally.rate_limited == {"p/sim-small": 1}
