"""`cluster down` and `cluster up` on the same journal: finished results are read from disk while
no cluster runs, and the jobs that had not ended resume when the cluster comes back."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.timeout(300)


def test_results_outlive_the_cluster_and_unfinished_jobs_resume_after_up(cli):
    run, work = cli
    assert run("cluster", "up", "--json").returncode == 0
    slow = [{"tool": "progress_update", "args": {"summary": "s"}, "latency_ms": 400}]
    (work / "mixed.yaml").write_text(json.dumps({"clones": {"2": slow * 40, "3": slow * 40}}))
    started = run(
        "run",
        "general-purpose",
        "--prompt",
        "keep",
        "--count",
        "4",
        "--detach",
        "--address",
        "auto",
        "--json",
        "--sim-script",
        "mixed.yaml",
    )
    assert started.returncode == 0, started.stderr
    batch = json.loads(started.stdout)
    quick, slow_ids = batch["job_ids"][:2], batch["job_ids"][2:]
    assert run("jobs", "wait", *quick, "--timeout", "60").returncode == 0
    results = {j: json.loads(run("jobs", "result", j, "--json").stdout) for j in quick}

    t0 = time.monotonic()
    down = run("cluster", "down", "--json")
    assert time.monotonic() - t0 < 8  # the command, Python start included; the stop itself < 5 s
    assert json.loads(down.stdout) == {
        "stopped": True,
        "running_jobs_ended": 2,
        "daemon_had_died": False,
    }

    listed = run("jobs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "read from the journal" in listed.stderr
    jobs = {j["job_id"]: j for j in json.loads(listed.stdout)["jobs"]}
    assert {jobs[j]["status"] for j in quick} == {"completed"}
    assert {jobs[j]["status"] for j in slow_ids} == {"running"}
    assert {j: json.loads(run("jobs", "result", j, "--json").stdout) for j in quick} == results
    unfinished = run("jobs", "result", slow_ids[0])
    assert unfinished.returncode == 2 and "cluster up" in unfinished.stderr

    again = run("cluster", "up")
    assert again.returncode == 0 and "resuming 2 unfinished job(s)" in again.stderr
    # Messages through the CLI: queued (0), unknown or finished jobs refused (2).
    sent = run("message", slow_ids[0], "keep going", "--json")
    assert sent.returncode == 0, sent.stderr
    delivery = json.loads(sent.stdout)
    assert delivery["status"] == "queued"
    assert run("message", "sa_00000000", "anyone?").returncode == 2
    finished = run("message", quick[0], "too late")
    assert finished.returncode == 2 and "ended" in finished.stderr
    status = run("message", "--status", delivery["delivery_id"], "--json")
    assert json.loads(status.stdout)["job_id"] == slow_ids[0]
    waited = run("jobs", "wait", batch["batch_id"], "--timeout", "120")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    after = {j["job_id"]: j for j in json.loads(run("jobs", "list", "--json").stdout)["jobs"]}
    assert {after[j]["status"] for j in batch["job_ids"]} == {"completed"}
    assert {after[j]["restarts"] for j in slow_ids} == {1}
    assert all(after[j]["detail"] is None or "resumed" in after[j]["detail"] for j in slow_ids)
    assert {j: json.loads(run("jobs", "result", j, "--json").stdout) for j in quick} == results
    assert json.loads(run("message", "--status", delivery["delivery_id"], "--json").stdout)[
        "status"
    ] in ("delivered", "undelivered")


def test_message_without_a_cluster_exits_1_naming_cluster_up(cli):
    run, _ = cli
    out = run("message", "sa_12345678", "hello")
    assert out.returncode == 1 and "clonefleet cluster up" in out.stderr
