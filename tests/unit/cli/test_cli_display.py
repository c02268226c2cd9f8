"""`clonefleet run`'s display while a batch runs, fed with events (no Ray)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from clonefleet.cli.progress import (
    FAILURES_SHOWN,
    MORE_FAILURES,
    PLAIN_EVERY_S,
    REFRESH_S,
    ROLLING_LINES,
    ExecLines,
    LiveView,
    PlainView,
    ProgressNote,
    Rate,
    Tally,
    Watcher,
    clock_text,
    failure_line,
    render_live,
    watch,
)
from clonefleet.testing import FakeClock

pytestmark = pytest.mark.timeout(20)

JOBS = [f"sa_{i:08x}" for i in range(10)]


def env(job: str, event: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "subagent_event",
        "subagent_run_id": job,
        "display_name": f"general-purpose #{JOBS.index(job) if job in JOBS else 0}",
        "batch_id": "b_00000001",
        "event": {"ts": 0.0, **event},
    }


def record(job: str, *, ok: bool = True, **fields: Any) -> dict[str, Any]:
    index = JOBS.index(job)
    out = {
        "job_id": job,
        "batch_id": "b_00000001",
        "agent": "general-purpose",
        "clone_index": index,
        "status": "completed" if ok else "failed",
        "stop_reason": "completed" if ok else "failed",
        "outcome": "success" if ok else "failure",
        "result": {"success": True, "summary": f"clone {index} done"} if ok else None,
        "salvaged": False,
        "nonconforming": False,
        "concerns": [],
        "warnings": [],
        "error": None if ok else "Error: subagent run failed",
        "model": "sim-small",
        "turns": 2,
        "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110},
    }
    return {**out, **fields}


def progress(job: str, summary: str) -> dict[str, Any]:
    return env(job, {"type": "progress", "progress": {"summary": summary}})


def started(job: str) -> dict[str, Any]:
    return env(job, {"type": "started", "model": "sim-small"})


def result(job: str, **kw: Any) -> dict[str, Any]:
    return env(job, {"type": "result", "record": record(job, **kw)})


def terminal(width: int = 100) -> Console:
    return Console(
        file=io.StringIO(), force_terminal=True, width=width, record=True, color_system=None
    )


class Recorder:
    """A view that keeps what it was shown."""

    def __init__(self) -> None:
        self.notes: list[ProgressNote] = []
        self.failures: list[tuple[dict[str, Any], str | None]] = []
        self.flushes = 0

    def progress(self, note: ProgressNote) -> None:
        self.notes.append(note)

    def failure(self, record: dict[str, Any], detail: str | None) -> None:
        self.failures.append((record, detail))

    def flush(self, tally: Tally, *, final: bool = False) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


# -- lines --------------------------------------------------------------------------------------
def test_exec_line_names_the_job_and_clone_before_the_progress_fields():
    note = ProgressNote(job_id="sa_1a2b3c4d", clone_index=17, progress={"summary": "reading"})
    assert note.exec_line == (
        'exec: progress {"job_id": "sa_1a2b3c4d", "clone_index": 17, "summary": "reading"}'
    )
    assert note.line == "#17 sa_1a2b3c4d: reading"


def test_progress_line_is_one_printable_line():
    note = ProgressNote(
        job_id="sa_1", clone_index=0, progress={"summary": "a\nb\x1b[31m\u202e" + "x" * 400}
    )
    line = note.line
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    assert "\\x1b" in line and len(line) < 320


def test_failure_line_carries_the_error_and_the_detail():
    rec = record(JOBS[3], ok=False)
    line = failure_line(rec, "every candidate model failed (sim-small: HTTP 401)")
    assert line == (
        f"#3 {JOBS[3]} failed: Error: subagent run failed; "
        "every candidate model failed (sim-small: HTTP 401)"
    )
    budget = record(JOBS[1], ok=False, stop_reason="budget", error="Error: budget")
    assert failure_line(budget).startswith(f"#1 {JOBS[1]} failed (budget): Error: budget")


def test_failure_line_of_a_completed_run_with_outcome_failure_shows_its_summary():
    rec = record(JOBS[2], outcome="failure", result={"success": False, "summary": "no tests"})
    assert failure_line(rec) == f"#2 {JOBS[2]} completed: outcome failure: no tests"


# -- counting -------------------------------------------------------------------------------------
def test_watcher_counts_running_queued_done_and_failed():
    clock = FakeClock()
    tally = Tally(JOBS, batch_id="b_00000001", clock=clock)
    view = Recorder()
    written: list[dict[str, Any]] = []
    watcher = Watcher(tally, [view], [written.append])
    watcher.page([started(JOBS[0]), started(JOBS[1]), started(JOBS[2])])
    assert (tally.done, len(tally.running), tally.queued, tally.failed) == (0, 3, 7, 0)
    error = env(JOBS[1], {"type": "error", "stop_reason": "failed", "detail": "sim: 401\nx"})
    watcher.page([progress(JOBS[0], "reading"), error, result(JOBS[1], ok=False)])
    watcher.page([result(JOBS[0]), started(JOBS[0])])  # a late duplicate start is ignored
    assert (tally.done, len(tally.running), tally.queued, tally.failed) == (2, 1, 7, 1)
    assert [n.line for n in view.notes] == [f"#0 {JOBS[0]}: reading"]
    assert view.failures == [(record(JOBS[1], ok=False), "sim: 401 x")]
    assert [r["job_id"] for r in written] == [JOBS[1], JOBS[0]]
    assert [r["job_id"] for r in tally.ordered_records()] == [JOBS[0], JOBS[1]]
    assert view.flushes == 3


def test_jobs_whose_host_waits_for_a_node_are_counted_apart_from_queued_ones():
    tally = Tally(JOBS, batch_id="b_00000001", clock=FakeClock())
    watcher = Watcher(tally, [Recorder()])
    pending = [env(j, {"type": "host_pending", "host": "h3"}) for j in JOBS[:4]]
    watcher.page([started(JOBS[9]), *pending])
    assert (len(tally.running), len(tally.waiting), tally.queued) == (1, 4, 5)
    assert "running 1, queued 5, waiting for a node 4, failed 0" in tally.counts_text()
    watcher.page([started(JOBS[0]), result(JOBS[1])])  # its host came; another ended
    assert (len(tally.running), len(tally.waiting), tally.queued, tally.done) == (2, 2, 5, 1)
    watcher.page([started(j) for j in JOBS[2:4]])
    assert "waiting for a node" not in tally.counts_text()


def test_rate_and_eta_come_from_the_recent_window():
    clock = FakeClock()
    rate = Rate(clock)
    rate.sample(0)
    assert rate.per_s() is None and rate.eta_s(10) is None
    clock.advance(2.0)
    rate.sample(10)
    assert rate.per_s() == 5.0 and rate.eta_s(10) == 2.0
    clock.advance(100.0)  # only the last window counts: the early burst is forgotten
    rate.sample(20)
    clock.advance(10.0)
    rate.sample(30)
    assert rate.per_s() == pytest.approx(1.0)
    assert rate.eta_s(0) == 0.0


def test_clock_text():
    assert [clock_text(x) for x in (None, 0, 59.6, 61, 3723)] == [
        "-",
        "0:00",
        "1:00",
        "1:01",
        "1:02:03",
    ]


# -- plain views ----------------------------------------------------------------------------------
def test_exec_lines_are_written_in_one_piece_at_most_every_refresh():
    clock = FakeClock()
    tally = Tally(JOBS, clock=clock)
    writes: list[str] = []
    lines = ExecLines(writes.append)
    watcher = Watcher(tally, [lines])
    watcher.page([progress(JOBS[0], "a"), progress(JOBS[1], "b")])
    clock.advance(REFRESH_S / 10)
    watcher.page([progress(JOBS[2], "c")])
    assert len(writes) == 1  # the second page came too soon; its line waits
    watcher.close()
    assert len(writes) == 2
    out = [
        json.loads(line.removeprefix("exec: progress ")) for line in "".join(writes).splitlines()
    ]
    assert out == [{"job_id": JOBS[i], "clone_index": i, "summary": s} for i, s in enumerate("abc")]


def test_plain_view_prints_failures_as_they_happen_then_only_counts_them():
    clock = FakeClock()
    stream = io.StringIO()
    jobs = [f"sa_{i:08x}" for i in range(FAILURES_SHOWN + 5)]
    tally = Tally(jobs, clock=clock)
    watcher = Watcher(tally, [PlainView(stream)])
    for i, job in enumerate(jobs):
        rec = {**record(JOBS[0], ok=False), "job_id": job, "clone_index": i}
        watcher.page([env(job, {"type": "result", "record": rec})])
    watcher.close()
    lines = stream.getvalue().splitlines()
    failed = [line for line in lines if line.startswith("clonefleet: failed #")]
    assert len(failed) == FAILURES_SHOWN
    assert failed[0] == f"clonefleet: failed #0 {jobs[0]} failed: Error: subagent run failed"
    assert f"clonefleet: failed {MORE_FAILURES}" in lines
    # One progress line at the start and one at the end: no time passed in between.
    done = [line for line in lines if " done, " in line]
    assert done[-1].startswith(f"clonefleet: {len(jobs)}/{len(jobs)} done, running 0, queued 0")
    assert f"failed {len(jobs)}" in done[-1] and len(done) == 2


def test_plain_view_prints_progress_every_few_seconds():
    clock = FakeClock()
    stream = io.StringIO()
    watcher = Watcher(Tally(JOBS, clock=clock), [PlainView(stream)])
    for _ in range(10):
        watcher.page([])
        clock.advance(PLAIN_EVERY_S / 2)
    assert stream.getvalue().count(" done, ") == 5


# -- the live display -----------------------------------------------------------------------------
def test_live_region_shows_the_latest_progress_lines_and_the_counts():
    clock = FakeClock()
    tally = Tally(JOBS, clock=clock)
    watcher = Watcher(tally, [])
    watcher.page([started(j) for j in JOBS[:4]])
    watcher.page([progress(JOBS[i % 4], f"step {i} [bold]x[/]") for i in range(ROLLING_LINES + 3)])
    clock.advance(4.0)
    watcher.page([result(JOBS[0]), result(JOBS[1], ok=False)])
    console = terminal()
    console.print(render_live(tally))
    text = console.export_text()
    shown = [f"step {i} [bold]x[/]" for i in range(3, ROLLING_LINES + 3)]
    assert all(s in text for s in shown) and "step 2 " not in text  # markup shown as typed
    last = ROLLING_LINES + 2
    assert f"#{last % 4} {JOBS[last % 4]}: step {last} [bold]x[/]" in text
    assert "latest progress" in text
    assert "2/10 done 20%" in text
    assert "running 2 · queued 6 · failed 1 · 0.5/s · ETA 0:16 · elapsed 0:04" in text
    final = terminal()
    final.print(render_live(tally, final=True))
    assert "latest progress" not in final.export_text()


def test_live_region_before_any_progress():
    console = terminal(60)
    console.print(render_live(Tally(JOBS, clock=FakeClock())))
    text = console.export_text()
    assert "waiting for the first progress update" in text and "0/10 done 0%" in text


def test_live_view_prints_failures_above_and_redraws_a_few_times_a_second():
    clock = FakeClock()
    console = terminal()
    tally = Tally(JOBS, clock=clock)
    view = LiveView(console, tally)
    redraws = []
    refresh = view._live.refresh
    view._live.refresh = lambda: (redraws.append(clock()), refresh())  # type: ignore[method-assign]
    watcher = Watcher(tally, [ExecLines(view.console_write), view])
    try:
        for i in range(400):  # 4 s of pages, 100 a second
            job = JOBS[i % 10]
            events = [progress(job, f"p{i}")]
            if i == 150:
                events.append(result(JOBS[3], ok=False))
            watcher.page(events)
            clock.advance(0.01)
    finally:
        watcher.close()
    assert 10 <= len(redraws) <= 4 / REFRESH_S + 2
    text = console.export_text()
    assert f"failed #3 {JOBS[3]} failed: Error: subagent run failed" in text
    assert 'exec: progress {"job_id": "sa_00000009", "clone_index": 9, "summary": "p399"}' in text
    assert text.rstrip().endswith("elapsed 0:04")  # the final frame: the bar alone


class FakeFleet:
    """Pages of events, then nothing left."""

    def __init__(self, pages: list[list[dict[str, Any]]]) -> None:
        self.pages = pages
        self.reads = 0
        self.waits: list[float] = []
        self.remaining_calls = 0

    def events(self, target: str, *, cursor: int, level: str, wait_s: float = 0.0) -> dict:
        assert level == "lifecycle"
        page = self.pages[cursor] if cursor < len(self.pages) else []
        self.reads += 1
        self.waits.append(wait_s)
        return {"events": page, "cursor": min(cursor + 1, len(self.pages))}

    def remaining(self, ids: list[str]) -> int:
        self.remaining_calls += 1
        return 0


class Batch:
    batch_id = "b_00000001"
    job_ids = tuple(JOBS[:3])


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def three_jobs() -> FakeFleet:
    return FakeFleet(
        [
            [started(j) for j in JOBS[:3]],
            [progress(JOBS[1], "reading files"), result(JOBS[0])],
            [result(JOBS[1]), result(JOBS[2], ok=False)],
        ]
    )


def test_watch_off_a_terminal_prints_exec_lines_and_plain_progress(capsys):
    stream = io.StringIO()
    kept: list[dict[str, Any]] = []
    tally = watch(three_jobs(), Batch(), writers=[kept.append], stream=stream)
    assert (tally.done, tally.failed) == (3, 1)
    err = stream.getvalue()
    assert (
        f'exec: progress {{"job_id": "{JOBS[1]}", "clone_index": 1, "summary": "reading files"}}'
        in err
    )
    assert "clonefleet: 3/3 done, running 0, queued 0, failed 1" in err
    assert f"clonefleet: failed #2 {JOBS[2]} failed" in err
    assert [r["job_id"] for r in kept] == [JOBS[0], JOBS[1], JOBS[2]]
    assert capsys.readouterr().out == ""


def test_watch_with_json_prints_records_to_stdout_and_no_plain_lines(capsys):
    stream = io.StringIO()
    watch(three_jobs(), Batch(), as_json=True, stream=stream)
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["clone_index"] for r in out] == [0, 1, 2]
    assert "exec: progress" in stream.getvalue() and " done, " not in stream.getvalue()


def test_watch_ends_without_waiting_once_every_job_has_its_record():
    fleet = three_jobs()
    watch(fleet, Batch(), stream=io.StringIO())
    # Three pages read with a wait, then one drain without: no empty waiting page at the end
    # and no `remaining` call (each would add up to half a second to every run).
    assert fleet.waits == [0.5, 0.5, 0.5, 0.0] and fleet.remaining_calls == 0


def test_watch_counts_only_the_batch_jobs_toward_its_end():
    # A record for a job outside the batch (a child's) does not end the watch early.
    fleet = FakeFleet(
        [
            [started(j) for j in JOBS[:3]],
            [result(JOBS[0]), result(JOBS[1]), result(JOBS[7])],
            [result(JOBS[2])],
        ]
    )
    tally = watch(fleet, Batch(), stream=io.StringIO())
    assert JOBS[2] in tally.records and fleet.waits == [0.5, 0.5, 0.5, 0.0]


@pytest.mark.parametrize("lines", [False, True])
def test_watch_on_a_terminal_shows_the_live_display(lines):
    stream = Tty()
    watch(three_jobs(), Batch(), progress_lines=lines, stream=stream)
    out = stream.getvalue()
    assert "3/3 done 100%" in out and f"failed #2 {JOBS[2]}" in out
    assert ("exec: progress" in out) is lines
