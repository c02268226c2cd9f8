"""Usage totals per job, batch and fleet, their cost from model prices, and batch budgets, in the
in-process scheduler core (no Ray)."""

from __future__ import annotations

import math
from functools import partial

import pytest

from clonefleet.config import Config
from clonefleet.errors import UsageError
from clonefleet.planning import check_batch_budget
from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import LocalHost, make_submission, wait_until
from clonefleet.vocab import EventType, JobState, StopReason

pytestmark = pytest.mark.timeout(30)

STEP_THEN_HANG = {
    "default": [{"tool": "progress_update", "args": {"summary": "step"}}, {"hang": True}]
}
PRICES = {
    "sim-small": {
        "provider": "sim",
        "name": "sim-small",
        "price": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
    },
    "sim-large": {
        "provider": "sim",
        "name": "sim-large",
        "price": {"input_per_mtok": 10.0, "output_per_mtok": 50.0},
    },
}


def config(priced: bool = False) -> Config:
    return Config(models=PRICES if priced else {}, durability={"checkpoint_interval_s": 0.0})


submission = partial(make_submission, models={}, checkpoint_s=0.0)
"""A test batch (see ``make_submission``) of unpriced models that checkpoints every turn."""


def usage_event(model: str, tokens_in: int, tokens_out: int) -> dict:
    return {
        "type": "usage",
        "ts": 0.0,
        "turn": 1,
        "model": model,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "total_tokens": tokens_in + tokens_out,
    }


def cost(model: str, tokens_in: int, tokens_out: int) -> float:
    price = PRICES[model]["price"]
    return (tokens_in * price["input_per_mtok"] + tokens_out * price["output_per_mtok"]) / 1e6


async def test_batch_and_fleet_totals_are_the_sums_of_their_jobs_usage():
    core = SchedulerCore(LocalHost)
    first = await core.submit(submission(core, 3))
    second = await core.submit(submission(core, 2))
    ids = first["job_ids"] + second["job_ids"]
    assert (await core.job_block(ids, timeout_seconds=10))["done"]
    listing = await core.list_jobs()
    totals = listing["totals"]
    for out in (first, second):
        view = totals["batches"][out["batch_id"]]
        assert view["jobs"] == len(out["job_ids"]) and view["budget"] is None
        for key in ("input_tokens", "output_tokens", "total_tokens"):
            assert view[key] == sum(core.jobs[j].usage[key] for j in out["job_ids"]) > 0
    assert totals["fleet"]["total_tokens"] == sum(core.jobs[j].usage["total_tokens"] for j in ids)
    # No model of the built-in config has a price: the cost is unknown, every token unpriced.
    assert totals["fleet"]["cost_usd"] is None
    assert totals["fleet"]["unpriced_tokens"] == totals["fleet"]["total_tokens"]
    assert all(j["cost_usd"] is None for j in listing["jobs"])
    await core.aclose()


async def test_cost_per_job_comes_from_the_prices_of_the_models_each_response_used():
    core = SchedulerCore(LocalHost)
    out = await core.submit(submission(core, 2, models=PRICES, script=STEP_THEN_HANG))
    job, other = out["job_ids"]
    await wait_until(
        lambda: core.jobs[job].usage["total_tokens"] and core.jobs[other].usage["total_tokens"]
    )
    before = core.jobs[job].cost_usd
    assert before == pytest.approx(cost("sim-small", 48, 8))  # the clone's own first turn
    # A failover: the next responses come from the other model, at its price.
    core.apply_event(job, usage_event("sim-large", 1000, 100))
    core.apply_event(job, usage_event("sim-small", 200, 20))
    status = await core.job_status(job)
    expected = before + cost("sim-large", 1000, 100) + cost("sim-small", 200, 20)
    assert status["cost_usd"] == pytest.approx(expected)
    batch = (await core.list_jobs(batch=out["batch_id"]))["totals"]["batches"][out["batch_id"]]
    assert batch["cost_usd"] == pytest.approx(expected + core.jobs[other].cost_usd)
    assert batch["unpriced_tokens"] == 0
    # A model without a price: its tokens are counted apart, the cost stays the priced part.
    core.apply_event(job, usage_event("mystery-model", 5, 5))
    batch = (await core.list_jobs(batch=out["batch_id"]))["totals"]["batches"][out["batch_id"]]
    assert batch["unpriced_tokens"] == 10 and batch["cost_usd"] == pytest.approx(
        expected + core.jobs[other].cost_usd
    )
    await core.cancel_many([out["batch_id"]])
    await core.job_block(out["job_ids"], timeout_seconds=10)
    page = await core.events(out["batch_id"])
    results = [e["event"] for e in page["events"] if e["event"]["type"] == "result"]
    assert {r["cost_usd"] is not None for r in results} == {True}
    await core.aclose()


async def test_passing_a_token_budget_cancels_running_jobs_and_starts_no_queued_one():
    core = SchedulerCore(LocalHost)
    out = await core.submit(submission(core, 6, script=STEP_THEN_HANG, cap=2, budget_tokens=60))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    records = [await core.job_result(j) for j in out["job_ids"]]
    assert {(r["status"], r["stop_reason"], r["outcome"]) for r in records} == {
        ("cancelled", "budget", "cancelled")
    }
    assert {r["error"] for r in records} == {
        "Error: subagent run was cancelled: its batch passed its budget"
    }
    # Two ran (the cap) and spent 56 tokens each: the second response passed 60. The four
    # queued ones never started.
    started = [j for j in out["job_ids"] if core.jobs[j].started_at is not None]
    assert len(started) == 2
    assert core.capacity() == {"running": 0, "max_concurrency": None, "queued": 0}
    page = await core.events(out["batch_id"], level="all")
    kinds = [e["event"]["type"] for e in page["events"]]
    assert kinds.count(str(EventType.BUDGET)) == 1 and kinds.count("started") == 2
    budget = next(e["event"] for e in page["events"] if e["event"]["type"] == "budget")
    assert budget["budget_tokens"] == 60 and budget["spent_tokens"] == 112 and budget["passed"]
    view = (await core.list_jobs(batch=out["batch_id"]))["totals"]["batches"][out["batch_id"]]
    assert view["budget"]["passed"] and view["total_tokens"] == 112
    await core.aclose()


async def test_a_budget_counts_the_subagents_of_the_batch_and_stops_them_too():
    core = SchedulerCore(LocalHost)
    top = await core.submit(submission(core, 1, script=STEP_THEN_HANG, budget_tokens=500))
    lead = top["job_ids"][0]
    await wait_until(lambda: core.jobs[lead].state is JobState.RUNNING)
    kids = (await core.submit(submission(core, 2, script=STEP_THEN_HANG, parent=lead)))["job_ids"]
    await wait_until(lambda: all(core.jobs[k].usage["total_tokens"] for k in kids))
    core.apply_event(
        kids[0], usage_event("sim-small", 400, 0)
    )  # the child's usage passes the parent's budget
    assert (await core.job_block([lead, *kids], timeout_seconds=10))["done"]
    for job_id in (lead, *kids):
        assert core.jobs[job_id].stop_reason == StopReason.BUDGET
    # A subagent batch its clone spawned just as the budget passed never starts.
    late = await core.submit(submission(core, 2, script=STEP_THEN_HANG, parent=lead))
    assert all(core.jobs[j].stop_reason == StopReason.BUDGET for j in late["job_ids"])
    assert all(core.jobs[j].started_at is None for j in late["job_ids"])
    await core.aclose()


async def test_a_job_that_completed_before_the_budget_passed_keeps_its_result():
    core = SchedulerCore(LocalHost)
    out = await core.submit(submission(core, 3, cap=1, budget_tokens=150))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    first, second, third = [await core.job_result(j) for j in out["job_ids"]]
    # One at a time, 114 tokens each: the first completes within the budget, the second's
    # responses pass it (its clone is cancelled, or finished first), the third never starts.
    assert (first["status"], first["stop_reason"]) == ("completed", "completed")
    assert (third["status"], third["stop_reason"]) == ("cancelled", "budget")
    assert core.jobs[out["job_ids"][2]].started_at is None
    assert second["stop_reason"] in ("budget", "completed")
    await core.aclose()


@pytest.mark.parametrize(
    ("tokens", "usd", "match"),
    [
        (0, None, "--budget-tokens"),
        (-5, None, "--budget-tokens"),
        (True, None, "--budget-tokens"),
        (1.5, None, "--budget-tokens"),
        (None, 0.0, "--budget-usd"),
        (None, -1.0, "--budget-usd"),
        (None, math.nan, "--budget-usd"),
        (None, math.inf, "--budget-usd"),
        (None, "1", "--budget-usd"),
    ],
)
def test_a_budget_must_be_positive_and_finite(tokens, usd, match):
    with pytest.raises(UsageError, match=match):
        check_batch_budget(tokens, usd, config(priced=True), ("sim-small",))


def test_a_dollar_budget_needs_a_price_for_every_model_the_batch_may_use():
    check_batch_budget(None, 0.5, config(priced=True), ("sim-small", "sim-large"))
    check_batch_budget(100, None, config(), ("sim-small",))  # a token budget needs no price
    with pytest.raises(UsageError, match="sim-large has none"):
        check_batch_budget(
            None, 0.5, Config(models={"sim-small": PRICES["sim-small"]}), ("sim-small", "sim-large")
        )
