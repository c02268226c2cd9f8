"""What `clonefleet jobs list` and `jobs status` print (no Ray): a page of the table with usage
totals and the command for the next page, and `--json` streamed as one JSON object."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from clonefleet.cli.jobs import _jobs_list, _jobs_status
from clonefleet.config import Config
from clonefleet.journal import Journal
from clonefleet.scheduler import Durable, JournalView, SchedulerCore
from clonefleet.testing import LocalHosts, make_submission

pytestmark = pytest.mark.timeout(30)

PRICED = {
    "sim-small": {
        "provider": "sim",
        "name": "sim-small",
        "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
    }
}


@pytest.fixture
async def view(tmp_path) -> JournalView:
    """The journal of a finished batch of 7 priced jobs with a token budget, read offline."""
    journal, _ = Journal.open(tmp_path / "j")
    journal.start_background(0.01)
    core = SchedulerCore(LocalHosts(), durable=Durable(journal))
    sub = make_submission(core, 7, config=Config(models=PRICED))
    out = await core.submit(replace(sub, budget_tokens=10**6))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    await core.aclose()
    await journal.aclose()
    return JournalView(tmp_path / "j")


def args(**given) -> argparse.Namespace:
    base = {"status": None, "batch": None, "agent": None, "parent": None, "key": None}
    return argparse.Namespace(**{**base, "cursor": None, "limit": None, "json": False, **given})


def test_the_table_shows_a_page_the_totals_and_how_to_get_the_next(view, capsys):
    assert _jobs_list(view, args(limit=5)) == 0
    out = capsys.readouterr().out
    batch = next(iter(view.table.batches))
    assert out.count(" sa_") == 5
    assert f"batch {batch}: 7 jobs, " in out and "cost $" in out
    assert "budget 1,000,000 tokens (not passed)" in out
    assert "fleet: " in out and "slots in use: 0 of unlimited; queued: 0" in out
    assert "more jobs: clonefleet jobs list --cursor j:5 --limit 5" in out
    assert _jobs_list(view, args(limit=5, cursor="j:5")) == 0
    rest = capsys.readouterr().out
    assert rest.count(" sa_") == 2 and "more jobs" not in rest


def test_json_streams_one_object_of_every_job_page_by_page(view, capsys, monkeypatch):
    monkeypatch.setattr("clonefleet.cli.jobs.STREAM_PAGE", 3)  # three replies for 7 jobs
    calls = []
    real = view.list_jobs

    def counted(**filters):
        calls.append(filters)
        return real(**filters)

    monkeypatch.setattr(view, "list_jobs", counted)
    assert _jobs_list(view, args(json=True)) == 0
    listing = json.loads(capsys.readouterr().out)
    assert list(listing) == ["jobs", "capacity", "totals", "next_cursor", "rate_limits"]
    assert listing["rate_limits"] == []  # read from the journal: no limiter
    assert len(listing["jobs"]) == 7 and listing["next_cursor"] is None
    assert [c["limit"] for c in calls] == [3, 3, 3]
    (batch,) = listing["totals"]["batches"].values()
    assert batch["total_tokens"] == sum(j["usage"]["total_tokens"] for j in listing["jobs"])
    assert batch["cost_usd"] == pytest.approx(sum(j["cost_usd"] for j in listing["jobs"]))
    # With --limit, one page and the cursor that goes on.
    assert _jobs_list(view, args(json=True, limit=4)) == 0
    page = json.loads(capsys.readouterr().out)
    assert len(page["jobs"]) == 4 and page["next_cursor"] == "j:4"


def test_status_lines_show_tokens_and_cost(view, capsys):
    job = next(iter(view.table.jobs))
    assert _jobs_status(view, args(ids=[job])) == 0
    line = capsys.readouterr().out
    assert f"{job} " in line and " tokens=" in line and " cost=$0.00" in line


CACHED = Config(
    models={
        "sim-small": {
            "provider": "sim",
            "name": "sim-small",
            "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cached_input_per_mtok": 0.3},
        }
    },
    providers={"sim": {"kind": "simulated", "simulated": {"cache_min_tokens": 1}}},
)
"""A priced model on a simulated provider that caches every prefix."""


@pytest.fixture
async def cached_view(tmp_path) -> JournalView:
    """The journal of a finished batch of 2 jobs of 3 turns each, whose later requests read
    their earlier turns from the simulated provider's cache."""
    journal, _ = Journal.open(tmp_path / "j")
    journal.start_background(0.01)
    core = SchedulerCore(LocalHosts(), durable=Durable(journal))
    steps = [{"tool": "progress_update", "args": {"summary": f"step {i}"}} for i in range(3)]
    out = await core.submit(make_submission(core, 2, config=CACHED, script={"default": steps}))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    await core.aclose()
    await journal.aclose()
    return JournalView(tmp_path / "j")


def test_json_totals_and_the_table_count_the_tokens_read_from_the_cache(cached_view, capsys):
    assert _jobs_list(cached_view, args(json=True)) == 0
    listing = json.loads(capsys.readouterr().out)
    (batch,) = listing["totals"]["batches"].values()
    for key in ("input_tokens", "cache_read_tokens", "cache_write_tokens"):
        assert batch[key] == sum(j["usage"][key] for j in listing["jobs"]) > 0
        assert listing["totals"]["fleet"][key] == batch[key]
    assert batch["cache_read_tokens"] + batch["cache_write_tokens"] <= batch["input_tokens"]
    # Cost at the cached price: plain input, output, reads at a tenth, writes as plain input.
    read, write = batch["cache_read_tokens"], batch["cache_write_tokens"]
    plain = batch["input_tokens"] - read
    expected = (plain * 3.0 + batch["output_tokens"] * 15.0 + read * 0.3) / 1e6
    assert batch["cost_usd"] == pytest.approx(expected)
    assert (
        write > 0
        and batch["cost_usd"] < (batch["input_tokens"] * 3.0 + 15.0 * batch["output_tokens"]) / 1e6
    )
    share = round(100 * read / batch["input_tokens"])
    assert _jobs_list(cached_view, args()) == 0
    out = capsys.readouterr().out
    assert f", cached {share}%, out " in out and out.count(f"cached {share}%") == 2
    job = listing["jobs"][0]
    assert _jobs_status(cached_view, args(ids=[job["job_id"]])) == 0
    assert f" cached={job['usage']['cache_read_tokens']}" in capsys.readouterr().out


@pytest.fixture
async def keyed_view(tmp_path) -> tuple[JournalView, list[str]]:
    """The journal of a finished batch of 3 jobs mapped over rows (keys ``row-0``..``row-2``)
    and a counted batch of 2, read offline."""
    journal, _ = Journal.open(tmp_path / "j")
    journal.start_background(0.01)
    core = SchedulerCore(LocalHosts(), durable=Durable(journal))
    sub = make_submission(core, 3)
    sub = replace(sub, specs=tuple(replace(s, key=f"row {i}") for i, s in enumerate(sub.specs)))
    out = await core.submit(sub)
    counted = await core.submit(make_submission(core, 2))
    ids = [*out["job_ids"], *counted["job_ids"]]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    await core.aclose()
    await journal.aclose()
    return JournalView(tmp_path / "j"), out["job_ids"]


def test_jobs_list_key_parses_and_filters_to_that_rows_job(keyed_view, capsys):
    from clonefleet.cli.program import build_parser

    view, ids = keyed_view
    parsed = build_parser().parse_args(["jobs", "list", "--key", "row 1", "--json"])
    assert parsed.key == "row 1" and parsed.jobs_command == "list"
    assert _jobs_list(view, parsed) == 0
    body = json.loads(capsys.readouterr().out)
    assert [(j["job_id"], j["key"]) for j in body["jobs"]] == [(ids[1], "row 1")]
    assert _jobs_list(view, args(json=True)) == 0
    every = json.loads(capsys.readouterr().out)["jobs"]
    assert [j["key"] for j in every] == ["row 0", "row 1", "row 2", None, None]
    # The next-page hint repeats the filter, quoted for the shell.
    assert _jobs_list(view, args(key="row 2", limit=1, cursor=None)) == 0
    hint = "more jobs: clonefleet jobs list --key 'row 2' --cursor j:3 --limit 1"
    assert hint in capsys.readouterr().out
    assert build_parser().parse_args(["jobs", "list"]).key is None


def test_the_table_has_a_key_column_only_when_a_job_has_a_key(keyed_view):
    from rich.console import Console

    from clonefleet.cli.jobs import jobs_table

    view, _ = keyed_view
    jobs = view.list_jobs()["jobs"]

    def text(rows) -> str:
        console = Console(width=400, record=True)
        console.print(jobs_table(rows))
        return console.export_text()

    keyed = text(jobs)
    assert " key " in keyed.splitlines()[1] and "row 2" in keyed
    counted = text([j for j in jobs if j["key"] is None])
    assert " key " not in counted.splitlines()[1]
    hostile = text([{**jobs[0], "key": "[bold]x\x1b[31m"}])
    assert "[bold]x\\x1b[31m" in hostile
