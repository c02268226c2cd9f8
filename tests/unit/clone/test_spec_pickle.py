"""A clone spec pickled by an older release (fewer fields, all at the front) still loads."""

from __future__ import annotations

import pickle

import pytest

from clonefleet.clone import CloneSpec
from clonefleet.testing import make_spec

pytestmark = pytest.mark.timeout(30)


def test_a_round_trip_keeps_every_field() -> None:
    spec = make_spec(instructions="SHARED", instructions_own="OWN", subagent_provider="fork")
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.instructions_own == "OWN"


def test_a_state_without_the_newest_fields_gets_their_defaults() -> None:
    spec = make_spec(instructions="SHARED", task="TASK")
    state = spec.__getstate__()
    older = CloneSpec.__new__(CloneSpec)
    older.__setstate__(state[:-3])  # as pickled before seed_messages and instructions_own
    assert older.task == "TASK" and older.instructions == "SHARED"
    assert (older.subagent_provider, older.seed_messages, older.instructions_own) == (
        "spawn",
        (),
        "",
    )
    assert older == spec
