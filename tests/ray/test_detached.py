"""A persistent local cluster: `cluster up`, `run --detach`, later `jobs`/`events`, `cluster down`."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(300)


def test_detached_batch_outlives_its_command_and_is_controlled_later(cli):
    run, work = cli
    assert run("jobs", "list").returncode == 2  # no cluster yet: clear usage error
    up = run("cluster", "up", "--json")
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    assert state["address"].startswith("127.0.0.1:")
    assert run("cluster", "status").returncode == 0

    (work / "hang.yaml").write_text("clones:\n  2:\n    - {hang: true}\n")
    detached = run(
        "run",
        "general-purpose",
        "--prompt",
        "later",
        "--count",
        "3",
        "--detach",
        "--address",
        "auto",
        "--json",
        "--sim-script",
        "hang.yaml",
    )
    assert detached.returncode == 0, detached.stderr
    ids = json.loads(detached.stdout)
    quick, slow = ids["job_ids"][:2], ids["job_ids"][2]

    waited = run("jobs", "wait", *quick, "--timeout", "60", "--json")
    assert waited.returncode == 0, waited.stderr
    assert [json.loads(line)["status"] for line in waited.stdout.splitlines()] == [
        "completed",
        "completed",
    ]
    result = run("jobs", "result", quick[0], "--json")
    assert json.loads(result.stdout)["result"]["success"] is True

    running = run("jobs", "result", slow)
    assert running.returncode == 2 and "still running" in running.stderr
    listing = json.loads(run("jobs", "list", "--batch", ids["batch_id"], "--json").stdout)
    assert sorted(j["status"] for j in listing["jobs"]) == ["completed", "completed", "running"]
    assert listing["capacity"]["running"] == 1

    assert run("jobs", "cancel", ids["batch_id"]).returncode == 0
    final = run("jobs", "wait", slow, "--timeout", "60", "--json")
    assert final.returncode == 1 and json.loads(final.stdout)["status"] == "cancelled"

    events = run("events", ids["batch_id"], "--json")
    kinds = [json.loads(line)["event"]["type"] for line in events.stdout.splitlines()]
    assert kinds.count("result") == 3 and kinds.count("started") == 3

    down = run("cluster", "down")
    assert down.returncode == 0 and "stopped" in down.stdout
    assert run("cluster", "status").returncode == 1
