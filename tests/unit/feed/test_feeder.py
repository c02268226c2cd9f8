"""The feeder against the in-process scheduler core: rows stream into one growing batch, a
bounded number at a time, and every row's record comes back once (no Ray)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.errors import DefinitionError
from clonefleet.feed import Feeder, InFlight, ahead_for, failed_record, slice_for
from clonefleet.inputs import Row, RowError
from clonefleet.planning import BatchSubmission
from clonefleet.scheduler import SchedulerCore
from clonefleet.testing import InstantHost, make_submission

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


@dataclass(frozen=True)
class Part:
    batch_id: str
    job_ids: tuple[str, ...]


class CoreClient:
    """A synchronous client over a :class:`SchedulerCore` running in a thread's event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.core: SchedulerCore = self._run(self._make())
        self.calls: list[str] = []
        self.firsts: list[int] = []
        self.event_reads = 0

    @staticmethod
    async def _make() -> SchedulerCore:
        return SchedulerCore(InstantHost.factory(1))

    def _run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)  # type: ignore[arg-type]

    def plan(
        self, rows: Sequence[tuple[str, Any]], batch_id: str | None, first: int = 0
    ) -> BatchSubmission:
        self.firsts.append(first)

        async def make() -> BatchSubmission:
            sub = make_submission(self.core, len(rows))
            if batch_id is None:
                specs = tuple(replace(s, key=k) for s, (k, _) in zip(sub.specs, rows, strict=True))
                return replace(sub, specs=specs)
            self.core.table.release_ids([s.job_id for s in sub.specs])
            specs = tuple(
                replace(s, batch_id=batch_id, key=k)
                for s, (k, _) in zip(sub.specs, rows, strict=True)
            )
            return replace(sub, batch_id=batch_id, specs=specs)

        return self._run(make())

    def submit(self, plan: BatchSubmission, open: bool = False) -> Part:
        self.calls.append(f"submit open={open}")
        out = self._run(self.core.submit(plan, open=open))
        return Part(out["batch_id"], tuple(out["job_ids"]))

    def extend(self, plan: BatchSubmission, last: bool = False) -> Part:
        self.calls.append(f"extend last={last}")
        out = self._run(self.core.extend(plan, last=last))
        return Part(out["batch_id"], tuple(out["job_ids"]))

    def close_batch(self, batch_id: str) -> bool:
        self.calls.append("close")
        return self._run(self.core.close_batch(batch_id))

    def job_block(self, job_ids: Sequence[str], wait_seconds: float | None = None) -> Any:
        return self._run(self.core.job_block(job_ids, wait_seconds=wait_seconds))

    def job_result(self, job_id: str) -> dict[str, Any]:
        return self._run(self.core.job_result(job_id))

    def events(self, target: Any = None, **query: Any) -> Any:
        self.event_reads += 1
        return self._run(self.core.events(target, **query))

    def cancel_many(self, ids: Sequence[str]) -> int:
        self.calls.append("cancel")
        return self._run(self.core.cancel_many(ids))

    def close(self) -> None:
        self._run(self.core.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def client() -> Iterator[CoreClient]:
    c = CoreClient()
    yield c
    c.close()


class Counted:
    """A row generator that counts the rows read (to check it is never read far ahead)."""

    def __init__(self, n: int, bad: Callable[[int], bool] = lambda i: False) -> None:
        self.n, self.bad, self.read = n, bad, 0

    def __iter__(self) -> Iterator[Row | RowError]:
        for i in range(1, self.n + 1):
            self.read += 1
            if self.bad(i):
                yield RowError(line=i, key=str(i), reason="not valid JSON: Expecting value")
            else:
                yield Row(line=i, key=str(i), data={"x": i})


def test_twenty_thousand_rows_stream_through_one_batch_with_bounded_rows_held(client):
    rows = Counted(20_000)
    feeder = Feeder(rows, client.plan, client, agent="a", ahead=1000, poll_s=0.02)
    keys = []
    most_read_ahead = 0
    for ended in feeder.run():
        keys.append(ended.record["key"])
        assert ended.ran and ended.record["status"] == "completed"
        assert ended.row == {"x": int(ended.record["key"])}
        most_read_ahead = max(most_read_ahead, rows.read - len(keys))
    assert sorted(keys, key=int) == [str(i) for i in range(1, 20_001)]
    assert feeder.peak_held <= 1000
    assert most_read_ahead <= 1000 + 1  # never more than `ahead` rows (and one read ahead)
    assert feeder.parts == 20_000 // feeder.slice_rows + (20_000 % feeder.slice_rows > 0)
    assert client.calls[0] == "submit open=True" and client.calls[-1] == "extend last=True"
    assert client.calls.count("close") == 0
    assert client.firsts == list(range(0, 20_000, feeder.slice_rows))  # numbered in the batch
    assert client._run(client.core.remaining([feeder.batch_id])) == 0
    assert len(client._run(client.core.expand([feeder.batch_id]))) == 20_000


class Limits:
    """An :class:`InFlight` stand-in whose limit follows a script: one value for each row
    that ends (the last kept)."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.limit, self.ends = script, script[0], 0

    def ended(self, spans: Sequence[tuple[float, float]]) -> None:
        assert all(end >= sent for sent, end in spans)
        self.ends += len(spans)
        self.limit = self.script[min(self.ends, len(self.script) - 1)]


def test_rows_in_flight_follow_the_limiter_below_a_slice_and_up_to_ahead(client):
    rows = Counted(3000)
    # 40 rows in flight (under a slice of 256), then 900, then 100 again.
    limits = Limits([40] * 500 + [900] * 1500 + [100])
    feeder = Feeder(rows, client.plan, client, agent="a", ahead=1000, poll_s=0.02,
                    inflight=limits)  # fmt: skip
    early_most = 0
    keys = []
    for ended in feeder.run():
        keys.append(ended.record["key"])
        if limits.ends < 500:
            early_most = max(early_most, len(feeder._pending))
    assert sorted(keys, key=int) == [str(i) for i in range(1, 3001)]
    assert 0 < early_most <= 40  # never more rows in flight than the limit asked for
    assert client.firsts[0] == 0 and client.firsts[1] <= 40  # the first part fits the limit
    assert 500 < feeder.peak_held <= 900  # the limit of 900 was filled, never passed


def test_an_adaptive_feeder_runs_every_row_and_keeps_its_limit(client):
    limiter = InFlight(500, start=16, floor=8, min_window_s=0.0, warmup=1)
    feeder = Feeder(Counted(4000), client.plan, client, agent="a", ahead=500, poll_s=0.02,
                    inflight=limiter)  # fmt: skip
    keys = [e.record["key"] for e in feeder.run()]
    assert sorted(keys, key=int) == [str(i) for i in range(1, 4001)]
    assert limiter.windows > 0
    assert feeder.peak_held <= limiter.peak <= 500


def test_a_bad_row_or_a_duplicate_key_fails_alone_without_running(client):
    def rows() -> Iterator[Row | RowError]:
        yield Row(line=1, key="a", data={"x": 1})
        yield RowError(line=2, key=None, reason="not valid JSON: Expecting value at column 1")
        yield Row(line=3, key="a", data={"x": 3})
        yield Row(line=4, key="b", data={"x": 4})

    feeder = Feeder(rows(), client.plan, client, agent="rev", source="inputs file d.jsonl")
    out = list(feeder.run())
    failed = [e for e in out if not e.ran]
    assert [e.record["key"] for e in failed] == [None, "a"]
    assert failed[0].record["error"] == (
        "inputs file d.jsonl: line 2: not valid JSON: Expecting value at column 1"
    )
    assert "line 3: the key 'a' was seen before" in failed[1].record["error"]
    assert {e.record["status"] for e in failed} == {"failed"}
    assert failed[1].row == {"x": 3}
    ran = sorted(e.record["key"] for e in out if e.ran)
    assert ran == ["a", "b"]
    assert client.calls == ["submit open=False"]  # everything fit one part: a closed batch


def test_a_row_that_fails_to_render_fails_alone(client):
    def plan(
        rows: Sequence[tuple[str, Any]], batch_id: str | None, first: int = 0
    ) -> BatchSubmission:
        for key, data in rows:
            if "path" not in data:
                raise DefinitionError(f"task prompt: the input row has no field 'path' ({key})")
        return client.plan(rows, batch_id, first)

    rows = [Row(line=i, key=str(i), data={"path": "p"} if i != 2 else {}) for i in (1, 2, 3)]
    out = list(Feeder(rows, plan, client, agent="a").run())
    bad = [e for e in out if not e.ran]
    assert len(bad) == 1 and bad[0].record["key"] == "2"
    assert "the input row has no field 'path'" in bad[0].record["error"]
    assert sorted(e.record["key"] for e in out if e.ran) == ["1", "3"]


def test_cancel_stops_submitting_and_closes_the_batch(client):
    feeder = Feeder(Counted(5000), client.plan, client, agent="a", ahead=300, poll_s=0.02)
    seen = 0
    for _ in feeder.run():
        seen += 1
        if seen == 10:
            feeder.cancel()
    assert seen < 5000 and feeder.submitted < 5000
    assert "cancel" in client.calls
    assert client._run(client.core.remaining([feeder.batch_id])) == 0


def test_an_iterator_dropped_early_closes_the_batch(client):
    feeder = Feeder(Counted(2000), client.plan, client, agent="a", ahead=300, poll_s=0.02)
    run = feeder.run()
    next(run)
    run.close()
    assert client.calls[-1] == "close"
    assert client._run(client.core.close_batch(feeder.batch_id)) is False


@settings(max_examples=60, deadline=None)
@given(capacity=st.none() | st.integers(1, 100_000))
def test_ahead_and_slice_sizes(capacity):
    ahead = ahead_for(capacity)
    assert ahead >= 1000 and (capacity is None or ahead >= 2 * capacity)
    size = slice_for(ahead)
    assert 256 <= size <= 1000 and size <= ahead
    assert 1 <= slice_for(1) == 1


def test_failed_record_has_every_run_record_field():
    rec = failed_record("k", "why", agent="a", batch_id="b_1")
    assert rec["status"] == "failed" and rec["outcome"] == "failure" and rec["error"] == "why"
    assert rec["job_id"] is None and rec["usage"]["total_tokens"] == 0


def test_a_first_slice_that_renders_no_row_is_one_error_and_nothing_starts(client):
    def plan(
        rows: Sequence[tuple[str, Any]], batch_id: str | None, first: int = 0
    ) -> BatchSubmission:
        raise DefinitionError("unknown definition 'nope'")

    feeder = Feeder(Counted(10), plan, client, agent="nope")
    with pytest.raises(DefinitionError, match="unknown definition 'nope'"):
        feeder.start()
    assert client.calls == [] and feeder.batch_id is None


def test_start_submits_the_first_slice_and_keeps_its_failed_rows(client):
    feeder = Feeder(Counted(600, bad=lambda i: i == 3), client.plan, client, agent="a", ahead=300)
    feeder.start()
    assert feeder.batch_id is not None and feeder.submitted == feeder.slice_rows - 1 == 255
    out = list(feeder.run())
    assert [e.record["key"] for e in out if not e.ran] == ["3"]
    assert len(out) == 600


class DeafClient(CoreClient):
    """A client whose event pages are always empty: ends are learnt from the jobs' states."""

    def events(self, target: Any = None, **query: Any) -> Any:
        return {"events": [], "cursor": query.get("cursor", 0)}


def test_ends_whose_events_are_missed_are_found_by_the_jobs_states():
    deaf = DeafClient()
    try:
        feeder = Feeder(
            Counted(700), deaf.plan, deaf, agent="a", ahead=300, poll_s=0.01, sweep_s=0.0
        )
        keys = sorted(int(e.record["key"]) for e in feeder.run())
        assert keys == list(range(1, 701))
    finally:
        deaf.close()


def test_records_come_from_the_batch_events(client):
    feeder = Feeder(Counted(50), client.plan, client, agent="a", poll_s=0.02, sweep_s=3600)
    records = [e.record for e in feeder.run()]
    assert sorted(int(r["key"]) for r in records) == list(range(1, 51))
    assert {r["batch_id"] for r in records} == {feeder.batch_id} and client.event_reads >= 1


@pytest.fixture(scope="module")
def shared() -> Iterator[CoreClient]:
    c = CoreClient()
    yield c
    c.close()


ITEMS = st.lists(
    st.one_of(
        st.tuples(st.just("row"), st.integers(0, 40)),  # a row keyed k<n> (repeats happen)
        st.tuples(st.just("bad"), st.integers(0, 40)),  # a row that could not be read
    ),
    max_size=120,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(items=ITEMS, ahead=st.integers(1, 50), slice_rows=st.none() | st.integers(1, 20))
def test_every_row_ends_once_and_at_most_ahead_rows_are_held(shared, items, ahead, slice_rows):
    rows: list[Row | RowError] = []
    for line, (kind, n) in enumerate(items, 1):
        if kind == "row":
            rows.append(Row(line=line, key=f"k{n}", data={"n": n}))
        else:
            rows.append(RowError(line=line, key=None, reason="not valid JSON"))
    feeder = Feeder(
        rows, shared.plan, shared, agent="a", ahead=ahead, slice_rows=slice_rows, poll_s=0.01
    )
    out = list(feeder.run())
    assert len(out) == len(rows)  # one end per row, whatever it was
    ran = [e.record["key"] for e in out if e.ran]
    first_seen = {r.key for r in rows if isinstance(r, Row)}
    assert sorted(ran) == sorted(first_seen)  # a repeated key runs once, for its first row
    assert feeder.peak_held <= ahead
    assert feeder.submitted == len(ran)


@dataclass(frozen=True)
class Failure:
    key: str
    index: int
    reason: str


@dataclass(frozen=True)
class RowsPlanLike:
    plan: BatchSubmission | None
    failures: tuple[Failure, ...]


def test_a_plan_of_rows_that_fail_alone_submits_the_others(client):
    firsts: list[int] = []

    def plan(rows: Sequence[tuple[str, Any]], batch_id: str | None, first: int) -> RowsPlanLike:
        firsts.append(first)
        bad = tuple(
            Failure(
                k, first + i, f"task prompt (clone {first + i}): the input row has no field 'x'"
            )
            for i, (k, d) in enumerate(rows)
            if "x" not in d
        )
        good = [(k, d) for k, d in rows if "x" in d]
        return RowsPlanLike(client.plan(good, batch_id, first) if good else None, bad)

    rows = [Row(line=i + 1, key=f"k{i}", data={"x": i} if i % 3 else {}) for i in range(9)]
    feeder = Feeder(rows, plan, client, agent="a", ahead=4, slice_rows=3, poll_s=0.02)
    out = list(feeder.run())
    bad = {e.record["key"]: e.record["error"] for e in out if not e.ran}
    assert sorted(bad) == ["k0", "k3", "k6"]
    assert bad["k3"] == "input: line 4: task prompt (clone 3): the input row has no field 'x'"
    assert sorted(e.record["key"] for e in out if e.ran) == ["k1", "k2", "k4", "k5", "k7", "k8"]
    assert firsts == [0, 3, 6]  # the next part starts after every row handed to the planner


def test_a_first_slice_whose_rows_all_fail_alone_is_one_error(client):
    def plan(rows: Sequence[tuple[str, Any]], batch_id: str | None, first: int) -> RowsPlanLike:
        return RowsPlanLike(
            None, tuple(Failure(k, i, "no field 'x'") for i, (k, _) in enumerate(rows))
        )

    feeder = Feeder([Row(line=1, key="a", data={})], plan, client, agent="a")
    with pytest.raises(DefinitionError, match="no row of the first 1 renders: no field 'x'"):
        feeder.start()
    assert client.calls == []


class ColdClient:
    """Parts go in at once; the events say ``queued`` for the first ``cold_reads`` reads (the
    hosts are starting), then every pending job starts and ends."""

    def __init__(self, cold_reads: int) -> None:
        self.cold_reads, self.reads = cold_reads, 0
        self.parts_while_cold = 0
        self.jobs: list[str] = []
        self.seq = 0

    def _part(self, plan: Any) -> Part:
        ids = tuple(f"j{len(self.jobs) + n}" for n in range(len(plan)))
        self.jobs += ids
        if self.reads < self.cold_reads:
            self.parts_while_cold += 1
        return Part("b_cold", ids)

    def submit(self, plan: Any, open: bool = False) -> Part:
        return self._part(plan)

    def extend(self, plan: Any, last: bool = False) -> Part:
        return self._part(plan)

    def close_batch(self, batch_id: str) -> bool:
        return True

    def events(self, target: Any = None, **query: Any) -> Any:
        self.reads += 1
        kinds = ["queued"] if self.reads <= self.cold_reads else ["started", "result"]
        events = [
            {"subagent_run_id": j, "event": {"type": k, "record": {"key": j}}}
            for j in self.jobs[query["cursor"] :]
            for k in kinds
        ]
        if self.reads <= self.cold_reads:
            return {"events": events, "cursor": query["cursor"]}
        return {"events": events, "cursor": len(self.jobs)}

    def job_block(self, job_ids: Sequence[str], wait_seconds: float | None = None) -> Any:
        return {"done": False, "jobs": []}

    def job_result(self, job_id: str) -> dict[str, Any]:
        raise AssertionError("every end came with its event")

    def cancel_many(self, ids: Sequence[str]) -> int:
        return 0


def test_only_the_first_part_goes_in_until_a_job_has_begun_on_a_host():
    cold = ColdClient(cold_reads=4)
    plan = lambda rows, batch_id, first: [k for k, _ in rows]  # noqa: E731
    feeder = Feeder(Counted(3000), plan, cold, agent="a", ahead=1000, poll_s=0, sweep_s=3600)
    ended = [e.record["key"] for e in feeder.run()]
    assert cold.parts_while_cold == 1  # planning more would only slow the hosts' start
    assert len(ended) == 3000 and feeder.parts == 3000 // feeder.slice_rows + 1
