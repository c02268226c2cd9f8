"""AdmissionCore learning limits: from headers (announced), by probing, and from refusals; and
the rows of its snapshot (docs/rate-limits.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clonefleet.admission import OPEN_WINDOW, AdmissionCore, Announced, Demand, Grant, Limits, Meter

pytestmark = pytest.mark.timeout(60)

SNAPSHOT_FIELDS = {
    "scope",
    "provider",
    "model",
    "source",
    "rpm_limit",
    "tpm_limit",
    "max_in_flight",
    "rpm_now",
    "tpm_now",
    "in_flight",
    "waiting",
    "rate_limited",
    "rate_limited_last_min",
    "paused_s",
}


def sync(core: AdmissionCore, now: float, who: str = "a", **fields: object) -> Grant:
    fields.setdefault("model", "m")
    (grant,) = core.sync(who, [Demand(scope="s", provider="p", **fields)], now)  # type: ignore[arg-type]
    return grant


def row(core: AdmissionCore, now: float) -> dict[str, object]:
    (only,) = core.snapshot(now)
    return only


# -- announced limits --------------------------------------------------------------------------


def test_an_announced_rpm_is_followed_at_its_safety_share_and_ends_probing() -> None:
    core = AdmissionCore(safety=0.95)
    assert row_after(core, Announced(rpm=1200))["rpm_limit"] == 1140.0
    seen = row(core, 0.0)
    assert seen["source"] == "headers" and seen["max_in_flight"] is None
    other = AdmissionCore(safety=0.8)
    assert row_after(other, Announced(rpm=1200, tpm=100_000))["tpm_limit"] == 80_000.0


def row_after(core: AdmissionCore, told: Announced) -> dict[str, object]:
    sync(core, 0.0, probe=4, want=(1,) * 4)
    assert row(core, 0.0)["source"] == "probing"
    sync(core, 0.0, answered=1, release=1, announced=told)
    return row(core, 0.0)


def test_the_first_announce_caps_the_bucket_at_what_was_left_less_what_is_in_flight() -> None:
    core = AdmissionCore()
    told = Announced(rpm=1200, requests_left=5)
    grant = sync(core, 0.0, announced=told, answered=1, in_flight=3, want=(1,) * 10)
    assert grant.admitted == 2  # 5 left, 3 of them already on their way
    assert grant.retry_in_s == pytest.approx(1 / (1140 / 60))
    # Later announces' "left" is a round trip old: it no longer cuts the bucket.
    later = Announced(rpm=1200, requests_left=0)
    assert sync(core, 1.0, announced=later, answered=1, want=(1,) * 10).admitted > 2


def test_an_announced_limit_is_ignored_when_the_scope_does_not_learn() -> None:
    core = AdmissionCore()
    sync(core, 0.0, learn=False, configured=Limits(rpm=60), announced=Announced(rpm=1200))
    assert row(core, 0.0)["rpm_limit"] == 60 and row(core, 0.0)["source"] == "config"


# -- probing -----------------------------------------------------------------------------------


def test_a_new_model_scope_probes_with_a_window_that_grows_by_one_per_answer() -> None:
    core = AdmissionCore()
    grant = sync(core, 0.0, probe=4, want=(1,) * 10)
    first = grant.admitted
    assert 1 <= first <= 4 and grant.slots and not grant.open  # no more than the probe at first
    assert row(core, 0.0)["max_in_flight"] == first and row(core, 0.0)["source"] == "probing"
    assert sync(core, 0.1, probe=4, want=(1,) * 10).admitted == 0  # every slot of the window held
    # Answers without limit headers: the window is the probe at least, and one more per answer.
    grant = sync(
        core, 0.2, probe=4, answered=first, headerless=first, release=first, want=(1,) * 10
    )
    assert row(core, 0.2)["max_in_flight"] == 4 + first and grant.admitted == 4 + first
    grant = sync(core, 0.3, probe=4, answered=3, headerless=3, release=3, want=(1,) * 10)
    assert row(core, 0.3)["max_in_flight"] == 7 + first
    assert grant.admitted == 6  # 3 more slots, and the 3 given back


def test_the_window_opens_the_scope_past_open_window_without_refusal_or_headers() -> None:
    core = AdmissionCore()
    now, held, grant = 0.0, 0, sync(core, 0.0, probe=16)
    while not grant.open:
        assert now < 60.0, "the window never opened"
        grant = sync(
            core, now, probe=16, answered=held, headerless=held, release=held, want=(1,) * 2048
        )
        held = grant.admitted
        now += 0.5
    seen = row(core, now)
    assert seen["max_in_flight"] is None and seen["source"] == "none"
    assert OPEN_WINDOW == 1024 and grant.admitted == 2048  # open: everything goes


def test_a_provider_wide_scope_never_probes() -> None:
    core = AdmissionCore()
    grant = sync(core, 0.0, model=None, learn=True, want=(1,) * 100)
    assert grant.open and grant.admitted == 100
    assert row(core, 0.0)["source"] == "none"


# -- refusals ----------------------------------------------------------------------------------


def test_retry_after_pauses_the_scope_until_then() -> None:
    core = AdmissionCore()
    limits = Limits(rpm=600)
    sync(core, 0.0, learn=False, configured=limits)
    grant = sync(core, 1.0, learn=False, configured=limits, refused=1, retry_after_s=5.0, want=(1,))
    assert grant.admitted == 0 and grant.retry_in_s == pytest.approx(5.0)
    assert row(core, 1.0)["paused_s"] == 5.0
    for now in (2.0, 4.0, 5.99):
        assert sync(core, now, learn=False, configured=limits, want=(1,)).admitted == 0
    assert sync(core, 6.0, learn=False, configured=limits, want=(1,)).admitted == 1
    assert row(core, 6.0)["paused_s"] == 0.0


def test_a_pause_is_bounded() -> None:
    core = AdmissionCore()
    sync(core, 0.0, learn=False, refused=1, retry_after_s=1e9, want=(1,))
    assert row(core, 0.0)["paused_s"] == 600.0


def test_refusals_without_headers_set_a_learned_rate_from_the_answers_measured() -> None:
    core, answers = AdmissionCore(), Meter()
    sync(core, 100.0, probe=64, want=(1,) * 30)
    for now in (100.2, 101.0, 101.4):
        sync(core, now, probe=64, answered=10, headerless=10, release=10, want=(1,) * 10)
        answers.add(now, 10)
    sync(core, 101.5, probe=64, refused=1, release=1)
    measured = answers.recent_per_minute(101.5, 2)
    seen = row(core, 101.5)
    assert seen["source"] == "learned" and seen["max_in_flight"] is None  # probing ended
    assert seen["rpm_limit"] == pytest.approx(round(measured * 0.97, 1))
    # A second refusal within a second answers the old rate: nothing more is cut.
    sync(core, 102.2, probe=64, refused=1)
    assert row(core, 102.2)["rpm_limit"] == seen["rpm_limit"]
    sync(core, 103.0, probe=64, refused=1)
    assert row(core, 103.0)["rpm_limit"] != seen["rpm_limit"]
    assert row(core, 103.0)["rate_limited"] == 3


def test_with_headers_a_refusal_cuts_the_share_followed_but_not_below_half() -> None:
    core = AdmissionCore(safety=0.95)
    sync(core, 0.0, announced=Announced(rpm=1200), answered=1)
    assert row(core, 0.0)["rpm_limit"] == 1140.0
    sync(core, 2.0, refused=1)
    assert row(core, 2.0)["rpm_limit"] == pytest.approx(1140 * 0.85, abs=0.05)
    sync(core, 2.5, refused=1)  # within a second: no further cut
    assert row(core, 2.5)["rpm_limit"] == pytest.approx(1140 * 0.85, abs=0.05)
    for k in range(10):
        sync(core, 4.0 + 1.5 * k, refused=1)
    assert row(core, 20.0)["rpm_limit"] == 570.0  # half of what is followed, no lower
    assert row(core, 20.0)["source"] == "headers"


# -- snapshot ----------------------------------------------------------------------------------


def test_snapshot_rows_carry_every_field() -> None:
    core = AdmissionCore()
    limits = Limits(rpm=600, tpm=60_000, max_in_flight=8)
    for who, flying in (("a", 2), ("b", 1)):
        core.sync(
            who,
            [
                Demand(
                    scope="p@x/m",
                    provider="p",
                    model="m",
                    configured=limits,
                    want=(10,) * 3,
                    tokens=300,
                    answered=2,
                    waiting=4,
                    in_flight=flying,
                )
            ],
            0.0,
        )
    sync(core, 0.5, learn=False, refused=2, model=None)
    rows = core.snapshot(1.0)
    assert [r["scope"] for r in rows] == ["p@x/m", "s"]
    for each in rows:
        assert set(each) == SNAPSHOT_FIELDS
    first = rows[0]
    assert first == {
        "scope": "p@x/m",
        "provider": "p",
        "model": "m",
        "source": "config",
        "rpm_limit": 600.0,
        "tpm_limit": 60_000.0,
        "max_in_flight": 8,
        "rpm_now": 5.0,  # a burst of 600 rpm is 5: a got 3, b 2
        "tpm_now": 600.0,
        "in_flight": 3,
        "waiting": 8,
        "rate_limited": 0,
        "rate_limited_last_min": 0,
        "paused_s": 0.0,
    }
    assert rows[1]["rate_limited"] == 2 and rows[1]["rate_limited_last_min"] == 2
    assert rows[1]["model"] is None


def test_the_first_announce_caps_the_token_bucket_by_the_tokens_answers_used() -> None:
    core = AdmissionCore()
    sync(core, 0.0, probe=8, want=(100,) * 4)
    # 2 answers used 200 tokens each; 2 requests still in flight; 1000 tokens left.
    told = Announced(rpm=10_000, tpm=600_000, tokens_left=1000)
    grant = sync(
        core, 0.0, announced=told, answered=2, tokens=400, release=2, in_flight=2, want=(100,) * 20
    )
    assert grant.admitted == 6  # (1000 - 2 * 200) / 100


def test_a_refusal_when_the_scope_does_not_learn_pauses_but_cuts_nothing() -> None:
    core = AdmissionCore()
    limits = Limits(rpm=600)
    sync(core, 0.0, learn=False, configured=limits)
    sync(core, 1.0, learn=False, configured=limits, refused=3)
    seen = row(core, 1.0)
    assert seen["rpm_limit"] == 600 and seen["source"] == "config" and seen["rate_limited"] == 3


def test_a_learned_rate_grows_with_each_answer() -> None:
    core = AdmissionCore()
    sync(core, 10.0, probe=8, want=(1,) * 8)
    sync(core, 10.5, answered=8, headerless=8, release=8)
    sync(core, 11.0, refused=1)
    learned = row(core, 11.0)["rpm_limit"]
    assert isinstance(learned, float)
    sync(core, 11.5, answered=10)  # while first sought the rate grows 5% an answer
    assert row(core, 11.5)["rpm_limit"] == pytest.approx(learned * 1.05**10, rel=1e-3)


def test_a_scope_unused_for_long_is_forgotten_and_learned_again() -> None:
    core = AdmissionCore()
    sync(core, 0.0, announced=Announced(rpm=1200), answered=1)
    assert row(core, 0.0)["source"] == "headers"
    core.sync("b", [], 100.0)
    assert len(core.snapshot(100.0)) == 1  # the host's lease ran out, the scope is kept
    core.sync("b", [], 311.0)
    assert core.snapshot(311.0) == []
    sync(core, 312.0, probe=4)
    assert row(core, 312.0)["source"] == "probing"  # nothing known: it probes again


def test_one_request_asks_first_and_an_answer_with_headers_skips_the_probe() -> None:
    core = AdmissionCore()
    assert sync(core, 0.0, probe=8, want=(1,) * 10).admitted == 1
    assert sync(core, 0.1, probe=8, want=(1,) * 10).admitted == 0  # it waits for its answer
    told = Announced(rpm=600, requests_left=599)
    grant = sync(core, 0.2, probe=8, answered=1, release=1, announced=told, want=(1,) * 10)
    seen = row(core, 0.2)
    assert seen["source"] == "headers" and seen["max_in_flight"] is None
    assert grant.admitted == 4  # a burst of 570 rpm, not a probe's window


def test_refusals_just_after_the_first_announce_answer_the_probe_and_cut_nothing() -> None:
    core = AdmissionCore(safety=0.95)
    sync(core, 0.0, answered=1, announced=Announced(rpm=1200))
    sync(core, 0.5, refused=2)  # requests the probe sent before the limit was known
    assert row(core, 0.5)["rpm_limit"] == 1140.0
    sync(core, 1.5, refused=1)
    assert row(core, 1.5)["rpm_limit"] == pytest.approx(1140 * 0.85, abs=0.05)


def test_a_cut_share_recovers_while_no_refusal_comes_but_not_beyond_the_limit() -> None:
    core = AdmissionCore(safety=0.95)
    sync(core, 0.0, answered=1, announced=Announced(rpm=1200))
    sync(core, 2.0, refused=1)
    cut = 1140 * 0.85
    sync(core, 4.0, answered=100)  # too soon after the refusal: nothing comes back
    assert row(core, 4.0)["rpm_limit"] == pytest.approx(cut, abs=0.05)
    sync(core, 8.0, answered=100)
    assert row(core, 8.0)["rpm_limit"] == pytest.approx(cut * 1.001**100, abs=0.05)
    for k in range(10):
        sync(core, 9.0 + k, answered=1000)
    assert row(core, 20.0)["rpm_limit"] == 1140.0


def test_the_snapshot_fields_are_those_docs_json_md_documents() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "json.md").read_text(encoding="utf-8")
    table = doc[doc.index("| `scope` |") :]
    table = table[: table.index("\n\n")]
    documented = set()
    for line in table.splitlines():
        documented.update(re.findall(r"`(\w+)`", line.split(" | ")[0]))
    assert documented == SNAPSHOT_FIELDS
