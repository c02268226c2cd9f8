"""`run --inputs FILE --detach --address auto` on a persistent cluster: every row submitted and
the command returns; the same command again adds nothing; after `cluster down` and `cluster up`
the unfinished rows resume from the journal; the same command with `--out` and without
`--detach` then collects every row's record from that batch, running nothing again."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(400)

ROWS = 6


def test_a_detached_inputs_batch_survives_down_and_up_and_is_collected(cli):
    run, work = cli
    assert run("cluster", "up", "--json").returncode == 0
    (work / "rows.jsonl").write_text(
        "".join(json.dumps({"id": f"r{i}", "n": i}) + "\n" for i in range(ROWS))
    )
    slow = [{"tool": "progress_update", "args": {"summary": "s"}, "latency_ms": 400}]
    (work / "slow.yaml").write_text(json.dumps({"clones": {"4": slow * 40, "5": slow * 40}}))
    cmd = ["run", "general-purpose", "--prompt", "Row {{ input.n }}", "--inputs", "rows.jsonl"]
    cmd += ["--key", "id", "--address", "auto", "--sim-script", "slow.yaml"]

    first = run(*cmd, "--detach", "--json")
    assert first.returncode == 0, first.stderr
    sent = json.loads(first.stdout)
    batch = sent["batch_id"]
    assert sent == {"batch_id": batch, "submitted": ROWS, "adopted": 0, "failed": 0}

    again = run(*cmd, "--detach", "--json")  # the same command adds nothing
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {
        "batch_id": batch, "submitted": 0, "adopted": ROWS, "failed": 0,
    }  # fmt: skip

    quick = [f"r{i}" for i in range(4)]
    listed = json.loads(run("jobs", "list", "--batch", batch, "--json").stdout)["jobs"]
    by_key = {j["key"]: j["job_id"] for j in listed}
    assert sorted(by_key) == [f"r{i}" for i in range(ROWS)]
    assert run("jobs", "wait", *(by_key[k] for k in quick), "--timeout", "60").returncode == 0
    assert run("cluster", "down").returncode == 0
    up = run("cluster", "up")
    assert up.returncode == 0 and "resuming 2 unfinished job(s)" in up.stderr

    collect = run(*cmd, "--out", "out.jsonl", timeout=200)
    assert collect.returncode == 0, collect.stderr
    assert f"resuming batch {batch}" in collect.stderr
    records = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in records) == sorted(by_key)  # each row once
    assert {r["batch_id"] for r in records} == {batch}  # nothing ran in a new batch
    assert {r["status"] for r in records} == {"completed"}
    after = {j["job_id"]: j for j in json.loads(run("jobs", "list", "--json").stdout)["jobs"]}
    assert len(after) == ROWS  # no job was submitted twice
    assert {after[by_key[k]]["restarts"] for k in ("r4", "r5")} == {1}
    assert not list((work.parent / "state" / "inputs").glob("*.json"))  # collected: forgotten
