"""An ``--inputs`` run with ``--out`` checkpoints after every turn unless the config says
otherwise (a killed run is resumed from its journal)."""

from __future__ import annotations

import argparse

import pytest

from clonefleet.cli.run import _checkpoint_every_turn
from clonefleet.config import Config

pytestmark = pytest.mark.timeout(10)


def args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"out": "results.jsonl", "detach": False, **kw})


def test_a_run_with_out_ships_every_checkpoint():
    config = _checkpoint_every_turn(args(), Config())
    assert config.durability.checkpoint_interval_s == 0.0
    assert Config().durability.checkpoint_interval_s == 1.0  # the default elsewhere


@pytest.mark.parametrize(
    ("kw", "durability"),
    [
        ({"out": None}, {}),  # nothing to resume into
        ({"detach": True}, {}),  # the cluster's batch, its own config
        ({}, {"checkpoint_interval_s": 2.5}),  # the config said so
        ({}, {"checkpoint_interval_s": 1.0}),  # even when it says the default
        ({}, {"enabled": False}),  # no journal to resume from
    ],
)
def test_otherwise_the_interval_is_left_alone(kw, durability):
    config = Config.model_validate({"durability": durability})
    out = _checkpoint_every_turn(args(**kw), config)
    assert out.durability.checkpoint_interval_s == config.durability.checkpoint_interval_s
    assert out is config


def test_the_rest_of_the_config_is_kept():
    config = Config.model_validate({"durability": {"retention_s": 60}, "limits": {"max_count": 7}})
    out = _checkpoint_every_turn(args(), config)
    assert out.durability.retention_s == 60 and out.limits.max_count == 7
    assert out.source == config.source
