"""SIGINT, SIGTERM and SIGHUP while ``clonefleet run`` runs: one line of its own saying what
became of the batch, and exit status 128 + the signal's number, at any moment. A stand-in
Fleet (no Ray); the end-to-end checks are in ``tests/ray/test_signals.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from clonefleet import fleet as _fleet
from clonefleet.cli import program as cli
from clonefleet.cli import run
from clonefleet.cli.signals import Interrupted, as_interrupted, stop_signals_raise

pytestmark = pytest.mark.timeout(20)


def _deliver(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    for _ in range(200):  # the handler runs between two bytecodes of the main thread
        time.sleep(0.001)


def test_the_first_stop_signal_raises_and_later_ones_wait_for_the_stop():
    before = signal.getsignal(signal.SIGHUP)
    with stop_signals_raise():
        with pytest.raises(Interrupted) as caught:
            _deliver(signal.SIGHUP)
        _deliver(signal.SIGTERM)  # ignored: already stopping
    assert caught.value.name == "SIGHUP" and caught.value.exit_status == 129
    assert isinstance(caught.value, KeyboardInterrupt)  # what handles Ctrl-C handles it
    assert signal.getsignal(signal.SIGHUP) is before


def test_rays_own_keyboard_interrupt_is_the_signal_that_arrived():
    # Ray turns an exception raised by a handler while it waits (ray.get) into a plain
    # KeyboardInterrupt of its own.
    with stop_signals_raise():
        assert as_interrupted(KeyboardInterrupt()).name == "SIGINT"  # Ctrl-C's, by default
        with pytest.raises(Interrupted):
            _deliver(signal.SIGTERM)
        assert as_interrupted(KeyboardInterrupt()).exit_status == 143


@dataclass
class FakeBatch:
    batch_id: str = "b_0000beef"
    job_ids: tuple[str, ...] = ("sa_00000001",)


@dataclass
class FakeFleet:
    """Stands in for :class:`clonefleet.Fleet`; ``stop_at`` names the step a signal hits."""

    address: Any = None
    embedded: bool = True
    closed: list[bool] = field(default_factory=list)
    wait_margin_s: float = 2.0

    def submit(self, plan: Any) -> FakeBatch:
        return FakeBatch()

    def close(self) -> None:
        self.closed.append(True)


@dataclass
class FakeTally:
    records: list[dict[str, Any]] = field(default_factory=list)

    def ordered_records(self) -> list[dict[str, Any]]:
        return self.records


CASES = {
    "starting": "no batch was submitted, and the embedded cluster stopped",
    "watching": "batch b_0000beef cancelled: the embedded cluster stopped, and its jobs",
    "summary": "batch b_0000beef had ended",
    "watching-cluster": (
        "batch b_0000beef keeps running on the cluster (`clonefleet jobs cancel b_0000beef`"
        " stops it)"
    ),
}


@pytest.mark.parametrize("moment", list(CASES))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=str)
def test_a_run_interrupted_at_any_moment_says_what_became_of_its_batch(
    monkeypatch, tmp_path, capsys, moment, sig
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLONEFLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fleets: list[FakeFleet] = []

    def make_fleet(address: Any, **_: Any) -> FakeFleet:
        if moment == "starting":
            _deliver(sig)  # while Ray starts
        fleets.append(FakeFleet(address, embedded=moment != "watching-cluster"))
        return fleets[-1]

    def watch(*_: Any) -> FakeTally:
        if moment.startswith("watching"):
            _deliver(sig)
        return FakeTally()

    def summary(*_: Any) -> None:
        _deliver(sig)

    monkeypatch.setattr(_fleet, "Fleet", make_fleet)
    monkeypatch.setattr(run, "_plan", lambda args, config: None)
    monkeypatch.setattr(run, "_watch", watch)
    monkeypatch.setattr(run, "_summary", summary)
    status = cli.main(["run", "general-purpose", "--prompt", "x"])
    assert status == 128 + sig
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == f"clonefleet: interrupted ({sig.name}); {CASES[moment]}"
    assert all(f.closed for f in fleets)


_STUCK = """
import time
from clonefleet.cli import signals
signals.HARD_STOP_S = 0.3
with signals.stop_signals_raise():
    signals.say_outcome(lambda: "batch b_0000beef cancelled")
    try:
        print("ready", flush=True)
        time.sleep(30)
    except KeyboardInterrupt:
        time.sleep(30)  # a stop that does not end (inside a C call of Ray's, say)
"""


def test_a_command_that_does_not_stop_in_time_ends_at_once_with_the_same_line():
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stderr
    assert stderr == "clonefleet: interrupted (SIGTERM); batch b_0000beef cancelled\n"
    assert time.monotonic() - started < 5


class _Finalised:
    def __del__(self) -> None:
        _deliver(signal.SIGTERM)  # the handler runs where Python ignores what it raises


def test_a_signal_whose_exception_python_ignored_is_raised_again():
    with stop_signals_raise():
        with pytest.raises(Interrupted) as caught:
            _Finalised()  # dropped at once: Ray's at-fork hooks are such places too
            for _ in range(200):
                time.sleep(0.001)
    assert caught.value.name == "SIGTERM"
