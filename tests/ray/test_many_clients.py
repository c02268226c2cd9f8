"""Many clients on one `cluster up` cluster at once: eight `run --address auto` (attached and
detached) while other processes message, cancel and wait on jobs. Every job of every batch
ends exactly once, and each client's output and exit status are the truth about its own batch."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

COUNTS = (20, 24, 28, 32, 36, 40, 22, 30)
DETACHED = {1, 4, 6}
"""Which of the eight runs are ``--detach``."""

RESULTS = """
import json, sys
from clonefleet import Fleet
out = {}
with Fleet("auto") as fleet:
    for batch in sys.argv[1:]:
        seen, cursor = {}, 0
        while True:
            page = fleet.events(batch, cursor=cursor, limit=5000)
            for env in page["events"]:
                if env["event"]["type"] == "result":
                    job = env["subagent_run_id"]
                    seen[job] = seen.get(job, 0) + 1
            if not page["events"]:
                break
            cursor = page["cursor"]
        listing = fleet.list_jobs(batch=batch, limit=1000)
        states = {j["job_id"]: j["status"] for j in listing["jobs"]}
        out[batch] = {"results": seen, "states": states}
print(json.dumps(out))
"""


def cli_process(work: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "clonefleet", *args],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 150) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


def finish_retrying(work: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """Run one command to its end; a command the scheduler did not answer in time (this test
    loads a 2-core machine with nine clients and their Ray drivers at once) runs once more."""
    result = finish(cli_process(work, env, *args))
    if result[0] != 0 and "did not answer within" in result[2]:
        result = finish(cli_process(work, env, *args))
    return result


def close_all(procs: list[subprocess.Popen[str]]) -> None:
    """Kill what still runs and close every pipe, so a failed assertion leaves nothing open
    for a later test to trip over."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ValueError, OSError, subprocess.TimeoutExpired):
            proc.communicate(timeout=30)


def ray_notice(line: str) -> bool:
    """A warning Ray's driver prints on stdout itself, whatever the program asked (the
    raylet's ``N PYTHON worker processes have been started``): not a line of clonefleet's."""
    return re.sub(r"\x1b\[[0-9;]*m", "", line).startswith("(raylet)")


def json_lines(out: str, who: str) -> list[dict]:
    """The JSON lines a command printed (Ray's own notices left out)."""
    lines = [line for line in out.splitlines() if line.strip() and not ray_notice(line)]
    try:
        return [dict(json.loads(line)) for line in lines]
    except ValueError:
        raise AssertionError(f"{who}: not JSON lines on stdout: {out[:600]!r}") from None


def test_eight_clients_at_once_each_get_the_truth_about_their_own_batch(cli, tmp_path):
    run, work = cli
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "CLONEFLEET_STATE_DIR": str(tmp_path / "state"),  # the `cli` fixture's state folder
    }
    env.pop("RAY_ADDRESS", None)
    up = run("cluster", "up", "--json")
    assert up.returncode == 0, up.stderr
    # Each step waits for the provider's timeout: the held jobs run until cancelled.
    (work / "hang.yaml").write_text("default:\n" + "  - {hang: true}\n" * 6)
    held = run(
        "run", "general-purpose", "--prompt", "hold", "--count", "4", "--detach",
        "--address", "auto", "--json", "--sim-script", "hang.yaml",
    )  # fmt: skip
    assert held.returncode == 0, held.stderr
    [victim] = json_lines(held.stdout, "held run")

    runs = []
    for i, count in enumerate(COUNTS):
        args = ["run", "general-purpose", "--prompt", f"c{i} {{{{ clone.index }}}}"]
        args += ["--count", str(count), "--address", "auto", "--json"]
        runs.append(cli_process(work, env, *args, *(["--detach"] if i in DETACHED else [])))
    waiter = cli_process(work, env, "jobs", "wait", victim["batch_id"], "--timeout", "120")
    try:
        # Message, then cancel, the held batch while the eight clients submit and run.
        message = finish_retrying(work, env, "message", victim["job_ids"][0], "hello", "--json")
        assert message[0] == 0, message[2]
        assert [m["status"] for m in json_lines(message[1], "message")] == ["queued"]
        cancel = finish_retrying(work, env, "jobs", "cancel", victim["batch_id"])
        assert cancel[0] == 0, cancel[2]

        batches: dict[str, int] = {}
        detached: dict[str, int] = {}
        for i, proc in enumerate(runs):
            code, out, err = finish(proc)
            assert code == 0, f"run {i}: {err[-2000:]}"
            if i in DETACHED:
                [ids] = json_lines(out, f"run {i}")
                assert len(ids["job_ids"]) == COUNTS[i]
                detached[ids["batch_id"]] = COUNTS[i]
                batches[ids["batch_id"]] = COUNTS[i]
                continue
            records = json_lines(out, f"run {i}")
            assert len(records) == COUNTS[i], f"run {i}: {len(records)} records"
            assert len({r["batch_id"] for r in records}) == 1, "one client, one batch"
            assert len({r["job_id"] for r in records}) == COUNTS[i]
            assert {r["status"] for r in records} == {"completed"}
            batches[records[0]["batch_id"]] = COUNTS[i]
        assert len(batches) == len(COUNTS), "every client got a batch of its own"

        waited = finish(
            cli_process(work, env, "jobs", "wait", *detached, "--timeout", "120", "--json")
        )
        assert waited[0] == 0, waited[2]
        statuses = [j["status"] for j in json_lines(waited[1], "jobs wait")]
        assert statuses == ["completed"] * sum(detached.values())
        code, _, err = finish(waiter)
        assert code == 1, err  # the held batch ended cancelled, and `jobs wait` says so
    finally:
        close_all([*runs, waiter])

    checked = subprocess.run(
        [sys.executable, "-c", RESULTS, *batches, victim["batch_id"]],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    [table] = json_lines(checked.stdout, "results")
    for batch_id, count in batches.items():
        seen = table[batch_id]
        assert len(seen["states"]) == count and set(seen["states"].values()) == {"completed"}
        assert seen["results"] == dict.fromkeys(seen["states"], 1), f"{batch_id}: one result each"
    held_jobs = table[victim["batch_id"]]
    assert set(held_jobs["states"].values()) == {"cancelled"}
    assert held_jobs["results"] == dict.fromkeys(victim["job_ids"], 1)
