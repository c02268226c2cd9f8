"""`clonefleet run AGENT --inputs FILE` end to end in a subprocess (its own embedded Ray): one
clone per row, keyed records in --out, a rerun that skips the rows done, and a run killed
mid-way that a rerun completes with exactly one success per key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

ROWS = 12


def _rows(tmp_path: Path) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": f"k{i}", "x": i}) + "\n" for i in range(ROWS)))
    return data


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_inputs_run_keys_every_record_and_a_rerun_skips_them_all(cli_run, tmp_path):
    data = _rows(tmp_path)
    out = tmp_path / "out.jsonl"
    args = ("run", "general-purpose", "--prompt", "Say {{ input.x }}", "--inputs", str(data))
    first = cli_run(*args, "--key", "id", "--out", str(out), "--include-input", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    records = _records(out)
    assert sorted(r["key"] for r in records) == sorted(f"k{i}" for i in range(ROWS))
    assert {r["status"] for r in records} == {"completed"}
    assert len({r["batch_id"] for r in records}) == 1
    assert sorted(r["clone_index"] for r in records) == list(range(ROWS))
    assert all(r["input"] == {"id": r["key"], "x": int(r["key"][1:])} for r in records)
    # The summary of a counted run, counted as the rows ended, with the per-row table (keyed).
    assert f"{ROWS} rows in " in first.stdout and f"status       {ROWS} completed" in first.stdout
    assert f"records      in {out}" in first.stdout and "failures: none" in first.stdout
    assert first.stdout.count("│ k") == ROWS
    assert f"clonefleet: {ROWS}/{ROWS} done, failed 0" in first.stderr  # plain lines: no terminal

    again = cli_run(*args, "--key", "id", "--out", str(out), "--include-input", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"{ROWS} of {ROWS} rows already have a record in {out}: skipped" in again.stderr
    assert "nothing to run" in again.stderr
    assert len(_records(out)) == ROWS


def test_a_bad_row_fails_alone_and_the_exit_status_is_1(cli_run, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"x": 1}\nnot json\n{"x": 3}\n{"y": 4}\n')
    run = cli_run(
        "run", "general-purpose", "--prompt", "Say {{ input.x }}", "--inputs", str(data),
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    records = [json.loads(line) for line in run.stdout.splitlines()]
    by_key = {r["key"]: r for r in records}
    assert sorted(by_key) == ["1", "2", "3", "4"]
    assert by_key["2"]["status"] == "failed" and by_key["2"]["job_id"] is None
    assert by_key["2"]["error"].startswith(f"inputs file {data}: line 2: not valid JSON")
    assert by_key["1"]["status"] == by_key["3"]["status"] == "completed"
    assert by_key["4"]["status"] == "failed" and by_key["4"]["job_id"] is None
    assert by_key["4"]["error"].startswith(f"inputs file {data}: line 4: ")
    assert "'x'" in by_key["4"]["error"]  # the field the template names and the row lacks


def test_count_and_inputs_are_refused_together(cli_run, tmp_path):
    data = _rows(tmp_path)
    run = cli_run(
        "run", "general-purpose", "--prompt", "x", "--inputs", str(data), "--count", "2",
        cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "--count and --inputs do not go together" in run.stderr


def test_a_killed_run_then_a_rerun_leaves_one_success_per_key(cli_run, tmp_path):
    data = _rows(tmp_path)
    out = tmp_path / "out.jsonl"
    script = tmp_path / "slow.yaml"
    script.write_text("default: [{text: done, latency_ms: 1500}]\n")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env["CLONEFLEET_STATE_DIR"] = str(tmp_path / "state")
    env.pop("RAY_ADDRESS", None)
    args = ["run", "general-purpose", "--prompt", "Say {{ input.x }}", "--inputs", str(data)]
    args += ["--key", "id", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "clonefleet", *args, "--sim-script", str(script)]
        + ["--max-concurrency", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 150
        while not (out.exists() and len(out.read_text().splitlines()) >= 2):
            assert proc.poll() is None, "the run ended before it was killed"
            assert time.monotonic() < deadline, "no records in time"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    killed = _records(out)
    assert 2 <= len(killed) < ROWS

    state = {"CLONEFLEET_STATE_DIR": env["CLONEFLEET_STATE_DIR"]}
    rerun = cli_run(*args, "--sim-script", str(script), cwd=tmp_path, env=state)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(killed)} of {ROWS} rows already have a record" in rerun.stderr
    # The rerun reopened the killed run's journal and collected its batch: the rows that were
    # running went on there (not submitted again), the rest were added to it as parts.
    batch = killed[0]["batch_id"]
    assert f"resuming batch {batch}" in rerun.stderr
    records = _records(out)
    successes = [r["key"] for r in records if r["status"] == "completed"]
    assert sorted(successes) == sorted(f"k{i}" for i in range(ROWS))  # each key once
    assert {r["batch_id"] for r in records} == {batch}
    assert not list((tmp_path / "state" / "inputs").glob("*.json"))  # the run ended: forgotten


def test_file_names_on_standard_input_reviewed_into_a_csv(tmp_path):
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).write_text("x = 1\n")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env["CLONEFLEET_STATE_DIR"] = str(tmp_path / "state")
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "clonefleet", "run", "general-purpose", "--inputs", "-"]
    cmd += ["--prompt", "Review {{ input }}", "--out", "reviews.csv"]
    run = subprocess.run(
        cmd, input="a.py\nb.py\nc.py\n", cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=150,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = (tmp_path / "reviews.csv").read_text().splitlines()
    assert lines[0].startswith("key,status,outcome,")
    assert sorted(line.split(",")[0] for line in lines[1:]) == ["1", "2", "3"]
    assert all(",completed,success," in line for line in lines[1:])


def test_sigterm_mid_run_keeps_the_records_written_and_exits_143(tmp_path):
    data = _rows(tmp_path)
    out = tmp_path / "out.jsonl"
    script = tmp_path / "slow.yaml"
    script.write_text("default: [{text: done, latency_ms: 1500}]\n")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env["CLONEFLEET_STATE_DIR"] = str(tmp_path / "state")
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "clonefleet", "run", "general-purpose", "--prompt", "x"]
    cmd += ["--inputs", str(data), "--out", str(out), "--sim-script", str(script)]
    proc = subprocess.Popen(
        [*cmd, "--max-concurrency", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 150
        while not (out.exists() and len(out.read_text().splitlines()) >= 1):
            assert proc.poll() is None, "the run ended before it was stopped"
            assert time.monotonic() < deadline, "no records in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 143, stderr
    assert "clonefleet: interrupted (SIGTERM)" in stderr
    kept = _records(out)
    assert 1 <= len(kept) < ROWS and len({r["key"] for r in kept}) == len(kept)


def test_whole_file_problems_stop_the_run_before_ray_starts(cli_run, tmp_path):
    base = ("run", "general-purpose", "--prompt", "x", "--inputs")
    missing = cli_run(*base, "nope.jsonl", cwd=tmp_path, timeout=60)
    assert missing.returncode == 2 and "inputs file nope.jsonl" in missing.stderr
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "a"}\n')
    twice = cli_run(*base, str(dup), "--key", "id", cwd=tmp_path, timeout=60)
    assert twice.returncode == 2
    assert "lines 1 and 3 have the same key 'a'" in twice.stderr
    assert "batch b_" not in twice.stderr  # counted while Ray started: nothing was submitted
    late = cli_run(*base, str(dup), "--prompt", "{{ input.nope }}", cwd=tmp_path, timeout=60)
    assert late.returncode == 2 and "nope" in late.stderr
    assert "Ray" not in missing.stderr + twice.stderr


def test_detach_with_inputs_needs_a_cluster_and_takes_no_follow_options(cli_run, tmp_path):
    data = _rows(tmp_path)
    base = ("run", "general-purpose", "--prompt", "x", "--inputs", str(data), "--detach")
    env = {"CLONEFLEET_STATE_DIR": str(tmp_path / "state")}
    embedded = cli_run(*base, cwd=tmp_path, timeout=60, env=env)
    assert embedded.returncode == 2 and "needs a persistent cluster" in embedded.stderr
    for extra in (["--out", "o.jsonl"], ["--resume"], ["--table"], ["--progress-lines"]):
        refused = cli_run(*base, *extra, "--address", "auto", cwd=tmp_path, timeout=60, env=env)
        assert refused.returncode == 2, refused.stderr
        assert "not with --detach" in refused.stderr
    assert not (tmp_path / "o.jsonl").exists()
