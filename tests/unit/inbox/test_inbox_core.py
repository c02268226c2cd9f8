"""The inbox's delivery table (no Ray): states, order, limits, resend and replay."""

from __future__ import annotations

import pytest

from clonefleet.errors import UsageError
from clonefleet.inbox import InboxCore, InboxLimits
from clonefleet.journal import Journal
from clonefleet.vocab import skill_refs

pytestmark = pytest.mark.timeout(20)


class Recorder:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def append(self, record: dict) -> int:
        self.records.append(record)
        return len(self.records)


def test_deliveries_move_queued_to_delivered_or_undelivered_once():
    rec = Recorder()
    core = InboxCore(journal=rec)
    a, b, c = (core.accept("sa_1", t) for t in ("one", "two", "three"))
    assert [d.state for d in (a, b, c)] == ["queued"] * 3 and core.queued == 3
    assert [d.delivery_id for d in core.acked([a.delivery_id, a.delivery_id])] == [a.delivery_id]
    assert [d.delivery_id for d in core.ended(["sa_1"])] == [b.delivery_id, c.delivery_id]
    assert core.ended(["sa_1"]) == [], "a settled one is not settled again"
    assert core.counts("sa_1") == {"queued": 0, "delivered": 1, "undelivered": 2}
    assert core.queued == 0
    assert [r["k"] for r in rec.records] == ["dq", "dq", "dq", "dd", "du", "du"]


def test_a_late_acknowledgement_turns_an_inferred_undelivered_delivered():
    # After an inbox restart, routing a job's queued deliveries again can tell the inbox that
    # the job ended before the acknowledgements its clone sent while the inbox was down arrive.
    rec = Recorder()
    core = InboxCore(journal=rec)
    took, missed = core.accept("sa_1", "taken"), core.accept("sa_1", "missed")
    assert len(core.ended(["sa_1"])) == 2
    assert [d.delivery_id for d in core.acked([took.delivery_id])] == [took.delivery_id]
    assert core.acked([took.delivery_id]) == []
    assert (took.state, missed.state) == ("delivered", "undelivered")
    assert core.counts("sa_1") == {"queued": 0, "delivered": 1, "undelivered": 1}
    assert core.queued == 0
    assert [r["k"] for r in rec.records] == ["dq", "dq", "du", "du", "dd"]
    rebuilt = InboxCore()
    assert rebuilt.restore(rec.records) == 0
    assert rebuilt.counts("sa_1") == {"queued": 0, "delivered": 1, "undelivered": 1}
    assert rebuilt.get(took.delivery_id).state == "delivered"
    assert rebuilt.restore([{"k": "du", "d": took.delivery_id}]) == 1, "delivered is final"


def test_limits_on_size_per_job_and_fleet_queues():
    core = InboxCore(InboxLimits(max_message_chars=5, max_queued_per_job=2, max_queued=3))
    with pytest.raises(UsageError, match="max_message_chars"):
        core.accept("sa_1", "toolong")
    with pytest.raises(UsageError, match="needs some text"):
        core.accept("sa_1", "  ")
    core.accept("sa_1", "a")
    core.accept("sa_1", "b")
    with pytest.raises(UsageError, match="max_queued_messages_per_job"):
        core.accept("sa_1", "c")
    core.accept("sa_2", "c")
    with pytest.raises(UsageError, match="max_queued_messages\\)"):
        core.accept("sa_3", "d")
    core.acked([core.of_job("sa_1")[0].delivery_id])
    core.accept("sa_1", "e")  # room again once one was taken


def test_resend_gives_what_a_checkpoint_lacks_in_order():
    core = InboxCore()
    ids = [core.accept("sa_1", t).delivery_id for t in "abcd"]
    core.acked(ids[:3])
    again = core.to_resend("sa_1", have=[ids[0]])
    assert [d.text for d in again] == ["b", "c", "d"]


def test_replay_from_the_journal_rebuilds_states_and_order(tmp_path):
    journal = Journal(tmp_path / "inbox")
    core = InboxCore(journal=journal)
    ids = [core.accept("sa_1", f"m{i}").delivery_id for i in range(5)]
    core.acked(ids[:2])
    core.ended(["sa_2"])
    journal.close()
    again, replay = Journal.open(tmp_path / "inbox")
    rebuilt = InboxCore(journal=again)
    assert rebuilt.restore(replay.records) == 0
    assert [d.text for d in rebuilt.waiting()] == ["m2", "m3", "m4"]
    assert rebuilt.counts("sa_1") == {"queued": 3, "delivered": 2, "undelivered": 0}
    later = rebuilt.accept("sa_1", "after")
    assert later.seq > max(d.seq for d in rebuilt.of_job("sa_1")[:-1])
    assert rebuilt.restore([{"k": "dq"}, {"k": "dd", "d": "dl_none"}, {"k": 7}]) == 3
    again.close()


def test_skill_references_are_found_in_order_once():
    assert skill_refs("use @skill:a then @skill:b.c and @skill:a; not a@skill:x") == ["a", "b.c"]


def test_old_settled_deliveries_are_forgotten_and_the_snapshot_replays_the_rest():
    core = InboxCore()
    old, kept, waiting = (core.accept("sa_1", t) for t in ("old", "kept", "waiting"))
    core.acked([old.delivery_id, kept.delivery_id])
    old.settled_at = 10.0
    assert core.evict_settled(before=100.0) == 1
    assert [d.text for d in core.of_job("sa_1")] == ["kept", "waiting"]
    again = InboxCore()
    assert again.restore(core.snapshot()) == 0
    assert again.counts("sa_1") == {"queued": 1, "delivered": 1, "undelivered": 0}
    assert [d.text for d in again.waiting()] == ["waiting"]
