"""Hostile simulation scripts: deep nesting, devices, FIFOs, alias bombs, bad numbers.

Each is one ConfigError naming the file (and the key, for a bad step); `run --sim-script` and
`provider serve --script` turn it into exit status 2 before anything starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from clonefleet import fleet as _fleet
from clonefleet.cli import program as cli
from clonefleet.config import Config
from clonefleet.errors import ConfigError
from clonefleet.providers import SimScript, serve_main

pytestmark = pytest.mark.timeout(20)


def script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "script.yaml"
    path.write_text(text)
    return path


def refused(path: Path | str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        SimScript.load(path)
    return info.value


@pytest.mark.parametrize(
    "text",
    [
        "default: " + "[" * 5000 + "]" * 5000,
        "default:\n  - {tool: t, args: " + "{a: " * 3000 + "}",
        "default:\n" + "".join("  " * i + "-\n" for i in range(1, 400)),
    ],
)
def test_deep_nesting_is_one_config_error_not_a_recursion_error(tmp_path: Path, text: str):
    assert "nested too deeply" in str(refused(script(tmp_path, text)))


def test_an_alias_bomb_in_step_arguments_is_refused_at_once(tmp_path: Path):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = "\n".join(["default:", "  - tool: t", "    args:"] + [f"      {ln}" for ln in lines])
    started = time.monotonic()
    assert "aliases expand" in str(refused(script(tmp_path, bomb)))
    assert time.monotonic() - started < 5


def test_anchors_that_reuse_steps_still_work(tmp_path: Path):
    loaded = SimScript.load(
        script(
            tmp_path,
            "default: &steps\n  - {error: 503}\n  - {text: done}\nclones:\n  4: *steps\n",
        )
    )
    assert loaded.steps_for(4) == loaded.steps_for(0) and loaded.steps_for(4)[1].text == "done"


def test_ten_thousand_clones_may_share_one_anchored_list(tmp_path: Path):
    steps = "default: &s\n" + "".join(f"  - {{text: step {i}}}\n" for i in range(12))
    clones = "clones:\n" + "".join(f"  {i}: *s\n" for i in range(10_000))
    loaded = SimScript.load(script(tmp_path, steps + clones))  # 130,000 values once expanded
    assert loaded.steps_for(9_999) == loaded.steps_for(0) and len(loaded.clones) == 10_000


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_dev_zero_is_refused_unread():
    started = time.monotonic()
    assert "not a regular file (a character device)" in str(refused("/dev/zero"))
    assert time.monotonic() - started < 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_blocking(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe.yaml")
    assert "not a regular file (a FIFO)" in str(refused(tmp_path / "pipe.yaml"))


def test_a_script_over_8_mib_is_refused_unparsed(tmp_path: Path):
    path = script(tmp_path, "# " + "x" * (8 * 1024 * 1024) + "\n")
    assert "larger than 8 MiB" in str(refused(path))


@pytest.mark.parametrize(
    "value", ["!!int x", "!!float x", "!!timestamp 2024-02-31", "!!bool maybe", "9" * 5000]
)
def test_a_bad_tagged_value_is_a_config_error(tmp_path: Path, value: str):
    error = refused(script(tmp_path, f"default:\n  - {{error: {value}}}\n"))
    assert "not valid YAML" in str(error) and "(line 2)" in str(error)


@pytest.mark.parametrize(
    ("step", "key"),
    [
        ("{retry_after: .inf}", "default.0.retry_after"),
        ("{retry_after: .nan}", "default.0.retry_after"),
        ("{latency_ms: -5}", "default.0.latency_ms"),
        ("{latency_ms: .inf}", "default.0.latency_ms"),
    ],
)
def test_delays_must_be_finite_and_not_negative(tmp_path: Path, step: str, key: str):
    assert refused(script(tmp_path, f"default:\n  - {step}\n")).key == key


@pytest.mark.parametrize(
    ("index", "key"), [(".inf", "clones.inf"), (".nan", "clones.nan"), ("-.inf", "clones.-inf")]
)
def test_a_clone_index_that_is_no_number_is_a_config_error(tmp_path: Path, index: str, key: str):
    assert refused(script(tmp_path, f"clones:\n  {index}: []\n")).key == key


def test_run_refuses_a_device_script_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    class NoFleet:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("planning should have failed before Ray starts")

    monkeypatch.setattr(_fleet, "Fleet", NoFleet)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    os.mkfifo(tmp_path / "pipe.yaml")
    code = cli.main(["run", "general-purpose", "--prompt", "p", "--sim-script", "pipe.yaml"])
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert code == 2 and last.startswith("clonefleet: error: ") and "FIFO" in last
    with pytest.raises(ConfigError):
        _fleet.plan_batch(
            "general-purpose", "p", config=Config(), caller_cwd=tmp_path, sim_script="pipe.yaml"
        )


def test_provider_serve_refuses_a_deep_script_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    path = script(tmp_path, "default: " + "[" * 5000 + "]" * 5000)
    assert serve_main(0, script=str(path)) == 2
    assert "nested too deeply" in capsys.readouterr().err
