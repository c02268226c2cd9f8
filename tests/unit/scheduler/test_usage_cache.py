"""Tokens read from and written to the provider's prompt cache in the scheduler's totals: what
they cost, what budgets count, and journals written before they were counted (no Ray)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from clonefleet.config import Config, price_per_token, token_cost
from clonefleet.journal import Journal, read_journal
from clonefleet.scheduler import JobRecord, JournalView
from clonefleet.scheduler._recovery import restore
from clonefleet.scheduler._usage import Totals, UsageBook, resume_usage
from clonefleet.testing import LocalHosts, crash_core, make_submission, open_journaled_core
from clonefleet.vocab import JobState

pytestmark = pytest.mark.timeout(30)

CACHE_KEYS = ("cache_read_tokens", "cache_write_tokens")
PRICE = {
    "input_per_mtok": 3.0,
    "output_per_mtok": 15.0,
    "cached_input_per_mtok": 0.3,
    "cache_write_per_mtok": 3.75,
}


def config(price: dict[str, float]) -> Config:
    return Config(models={"m": {"provider": "sim", "name": "sim-small", "price": price}})


def job(job_id: str = "sa_00000001", batch_id: str = "b_00000001") -> JobRecord:
    return JobRecord(
        job_id=job_id, batch_id=batch_id, agent="a", clone_index=0, clone_count=1, model="m"
    )


def usage_event(tin: int, tout: int, read: int = 0, write: int = 0) -> dict[str, Any]:
    return {
        "type": "usage",
        "model": "m",
        "input_tokens": tin,
        "output_tokens": tout,
        "total_tokens": tin + tout,
        "cache_read_tokens": read,
        "cache_write_tokens": write,
    }


def by_hand(tin: int, tout: int, read: int, write: int) -> float:
    """The price list applied by hand: plain input, output, cache reads, cache writes."""
    plain = tin - read - write
    return (plain * 3.0 + tout * 15.0 + read * 0.3 + write * 3.75) / 1e6


def test_cache_reads_at_a_discount_keep_a_dollar_budget_that_full_price_would_pass():
    # Ten responses of 20,000 input tokens, 18,000 read from the cache and 1,000 written to it:
    # $0.1965 at the cached prices, $0.675 at the plain input price; the budget is $0.25.
    responses = [usage_event(20_000, 500, read=18_000, write=1_000)] * 10
    book = UsageBook({})
    book.add_batch("b_00000001", config(PRICE), budget_usd=0.25)
    rec = job()
    passed = [b for event in responses for b in book.count(rec, event)]
    assert passed == [] and not book.budgets["b_00000001"].passed
    expected = 10 * by_hand(20_000, 500, 18_000, 1_000)
    assert expected == pytest.approx(0.1965)
    assert rec.cost_usd == pytest.approx(expected)
    view = book.batch_view("b_00000001", 1)
    assert view is not None and view["cost_usd"] == pytest.approx(expected)
    assert view["budget"]["spent_usd"] == pytest.approx(expected)
    assert (view["cache_read_tokens"], view["cache_write_tokens"]) == (180_000, 10_000)
    assert view["input_tokens"] == 200_000 and view["total_tokens"] == 205_000
    assert rec.usage == {
        "input_tokens": 200_000,
        "output_tokens": 5_000,
        "total_tokens": 205_000,
        "cache_read_tokens": 180_000,
        "cache_write_tokens": 10_000,
    }
    assert {k: book.fleet().view()[k] for k in CACHE_KEYS} == {k: view[k] for k in CACHE_KEYS}

    # The same responses where cached input costs as plain input pass the budget at the 4th.
    plain = {"input_per_mtok": 3.0, "output_per_mtok": 15.0}
    full = UsageBook({})
    full.add_batch("b_00000001", config(plain), budget_usd=0.25)
    rec = job()
    passed_at = [i for i, event in enumerate(responses) if full.count(rec, event)]
    assert passed_at == [3] and full.budgets["b_00000001"].passed
    assert rec.cost_usd == pytest.approx(10 * (20_000 * 3.0 + 500 * 15.0) / 1e6)


def test_the_token_budget_counts_total_tokens_cached_or_not():
    book = UsageBook({})
    book.add_batch("b_00000001", config(PRICE), budget_tokens=30_000)
    rec = job()
    assert book.count(rec, usage_event(20_000, 0, read=20_000)) == []
    assert book.count(rec, usage_event(20_000, 0, read=20_000)) == ["b_00000001"]


def test_a_usage_event_without_the_cache_counters_read_and_wrote_nothing():
    book = UsageBook({})
    book.add_batch("b_00000001", config(PRICE))
    rec = job()
    event = usage_event(1_000, 100)
    for key in CACHE_KEYS:
        del event[key]
    book.count(rec, event)
    assert rec.cost_usd == pytest.approx(by_hand(1_000, 100, 0, 0))
    assert [rec.usage[k] for k in CACHE_KEYS] == [0, 0]
    view = book.batch_view("b_00000001", 1)
    assert view is not None and [view[k] for k in CACHE_KEYS] == [0, 0]


def test_settle_counts_cache_reads_the_events_missed_at_the_cached_price():
    book = UsageBook({})
    book.add_batch("b_00000001", config(PRICE))
    rec = job()
    book.count(rec, usage_event(1_000, 10, read=800))
    final = {
        "input_tokens": 3_000,
        "output_tokens": 20,
        "total_tokens": 3_020,
        "cache_read_tokens": 2_600,
        "cache_write_tokens": 100,
    }
    book.settle(rec, final)
    # What the final count has beyond the events: 2,000 in (1,800 read, 100 written), 10 out.
    expected = by_hand(1_000, 10, 800, 0) + by_hand(2_000, 10, 1_800, 100)
    assert rec.cost_usd == pytest.approx(expected)
    view = book.batch_view("b_00000001", 1)
    assert view is not None
    assert [view[k] for k in CACHE_KEYS] == [2_600, 100] and view["input_tokens"] == 3_000
    rec.move(JobState.RUNNING)
    rec.finish({"status": "completed", "usage": final})
    assert rec.usage == final


def test_a_final_usage_without_the_cache_counters_keeps_what_the_events_counted():
    book = UsageBook({})
    book.add_batch("b_00000001", config(PRICE))
    rec = job()
    book.count(rec, usage_event(1_000, 10, read=800, write=100))
    rec.move(JobState.RUNNING)
    rec.finish({"status": "completed", "usage": {"input_tokens": 1_000, "output_tokens": 10}})
    assert [rec.usage[k] for k in CACHE_KEYS] == [800, 100]


def test_a_resumed_job_takes_its_checkpoints_cache_counters_and_their_price():
    rec = job()
    state = {"usage": {"input_tokens": 5_000, "output_tokens": 50, "cache_read_tokens": 4_000}}
    resume_usage(rec, state, config(PRICE))
    assert rec.usage["cache_read_tokens"] == 4_000 and rec.usage["cache_write_tokens"] == 0
    assert rec.cost_usd == pytest.approx(by_hand(5_000, 50, 4_000, 0))


def test_totals_journaled_without_the_cache_counters_read_as_zero():
    old = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10, "cost_usd": 0.5}
    totals = Totals.from_view(old)
    assert totals is not None and totals.view() == {
        **old,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "unpriced_tokens": 0,
    }


def _without_cache_keys(value: Any) -> Any:
    """``value`` as a version that did not count the prompt cache would have written it."""
    if isinstance(value, dict):
        return {k: _without_cache_keys(v) for k, v in value.items() if k not in CACHE_KEYS}
    if isinstance(value, list):
        return [_without_cache_keys(v) for v in value]
    return value


async def test_a_journal_written_before_the_cache_was_counted_restores_and_reads_offline(
    tmp_path,
):
    hosts = LocalHosts()
    core, journal, _ = open_journaled_core(tmp_path / "new", hosts)
    models = {"sim-small": {"provider": "sim", "name": "sim-small", "price": PRICE}}
    out = await core.submit(make_submission(core, 3, models=models, checkpoint_s=0.0))
    assert (await core.job_block(out["job_ids"], timeout_seconds=10))["done"]
    before = (await core.list_jobs(batch=out["batch_id"]))["totals"]
    await journal.commit()
    crash_core(core, journal, hosts)
    old, _ = Journal.open(tmp_path / "old")
    records = read_journal(tmp_path / "new").records
    for record in records:
        old.append(_without_cache_keys(record))
    old.close()
    rows = [r for r in read_journal(tmp_path / "old").records if r["k"] in ("batch", "end")]
    assert rows and "cache_read_tokens" not in repr(rows)

    core2, journal2, table = open_journaled_core(tmp_path / "old", LocalHosts())
    restore(core2, table)
    offline = JournalView(tmp_path / "old")
    for source in (await core2.list_jobs(batch=out["batch_id"]), offline.list_jobs()):
        for totals in (source["totals"]["batches"][out["batch_id"]], source["totals"]["fleet"]):
            kept = partial(_same_but_cache, before["batches"][out["batch_id"]])
            kept(totals)
        for row in source["jobs"]:
            assert [row["usage"][k] for k in CACHE_KEYS] == [0, 0]
    record = offline.job_result(out["job_ids"][0])
    assert [record["usage"][k] for k in CACHE_KEYS] == [0, 0]
    await core2.aclose()
    await journal2.aclose()


def _same_but_cache(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in ("input_tokens", "output_tokens", "total_tokens", "cost_usd", "unpriced_tokens"):
        assert after[key] == pytest.approx(before[key]), key
    assert [after[k] for k in CACHE_KEYS] == [0, 0]


@pytest.mark.parametrize(
    ("tin", "tout", "read", "write"),
    [
        (1_000, 10, 0, 0),
        (1_000, 10, 900, 0),
        (1_000, 10, 0, 1_000),
        (1_000, 10, 600, 300),
        (100, 10, 90, 50),
    ],  # the last: more cached than sent (no plain input is paid back)
)
def test_each_response_costs_what_config_token_cost_says(tin, tout, read, write):
    book = UsageBook({})
    book.add_batch("b_00000001", config(PRICE))
    rec = job()
    book.count(rec, usage_event(tin, tout, read, write))
    price = price_per_token(config(PRICE), "m")
    assert price is not None
    assert rec.cost_usd == pytest.approx(token_cost(price, tin, tout, read, write), abs=1e-15)
