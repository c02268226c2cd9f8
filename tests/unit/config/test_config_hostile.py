"""Hostile config files: alias bombs, devices, FIFOs, huge or deep YAML, bad tags.

Each ends in one ConfigError (the CLI: `clonefleet: error: ...`, exit 2), fast and in bounded
memory; anchors and merge keys within the bounds still work.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from clonefleet.cli import program as cli
from clonefleet.config import MAX_CONFIG_BYTES, load_config
from clonefleet.errors import ConfigError

pytestmark = pytest.mark.timeout(20)

BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def refused(path: Path | str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


def test_a_billion_laughs_is_refused_at_once(tmp_path: Path):
    started = time.monotonic()
    message = refused(write(tmp_path, BOMB))
    assert "aliases expand it to more than 1,000,000 values" in message
    assert time.monotonic() - started < 5


def test_an_alias_inside_itself_is_refused(tmp_path: Path):
    assert "refers to a collection that contains it" in refused(write(tmp_path, "x: &a [*a]\n"))


def test_anchors_and_merge_keys_within_the_bounds_still_work(tmp_path: Path):
    text = (
        "providers:\n"
        "  one: &base {kind: simulated, timeout_s: 5}\n"
        "  two: {<<: *base, timeout_s: 9}\n"
        "limits: {max_prompt_chars: 10}\n"
    )
    config = load_config(write(tmp_path, text))
    assert config.providers["one"].timeout_s == 5 and config.providers["two"].timeout_s == 9
    assert config.limits.max_prompt_chars == 10


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_dev_zero_is_refused_unread():
    started = time.monotonic()
    assert "not a regular file (a character device)" in refused("/dev/zero")
    assert time.monotonic() - started < 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_blocking(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe.yaml")
    assert "not a regular file (a FIFO)" in refused(tmp_path / "pipe.yaml")


def test_more_values_than_the_cap_are_refused_while_composing(tmp_path: Path):
    path = write(tmp_path, "aliases: [" + "a," * 100_001 + "]\n")
    assert "more than 100,000 values" in refused(path)


def test_a_path_with_a_nul_byte_is_a_config_error():
    assert "not a valid path" in refused("config\0.yaml")


def test_a_file_over_the_cap_is_refused_unparsed(tmp_path: Path):
    path = write(tmp_path, "# " + "x" * MAX_CONFIG_BYTES + "\n")
    assert "larger than 1 MiB" in refused(path)


def test_a_file_at_the_cap_loads(tmp_path: Path):
    path = write(tmp_path, "version: 1\n#" + "x" * (MAX_CONFIG_BYTES - 13) + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert load_config(path).version == 1


@pytest.mark.parametrize(
    "value",
    [
        "!!int not-a-number",
        "!!float x",
        "!!timestamp 2024-02-31",
        "!!bool maybe",
        "9" * 5000,
        "!!binary '@@'",
        "!!set {a: null}",
    ],
)
def test_a_bad_tagged_value_is_one_config_error_naming_the_line(tmp_path: Path, value: str):
    message = refused(write(tmp_path, f"version: 1\nlimits:\n  max_count: {value}\n"))
    assert "not valid YAML" in message and "(line 3)" in message and len(message) < 300


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000, "a: " + "{b: " * 3000])
def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path: Path, text: str):
    assert "nested too deeply" in refused(write(tmp_path, text))


@pytest.mark.parametrize("text", ["1: x\n", "path: /etc\n", "? [a]\n: b\n"])
def test_keys_that_cannot_be_config_keys_are_refused(tmp_path: Path, text: str):
    refused(write(tmp_path, text))


def test_a_date_stays_a_string(tmp_path: Path):
    config = load_config(write(tmp_path, "aliases: {2024-01-01: sim-small}\n"))
    assert config.resolve_model("2024-01-01")[0] == "sim-small"


def test_control_characters_in_a_key_are_escaped_in_the_error(tmp_path: Path):
    message = refused(write(tmp_path, 'limits: {"max\\e[2J\\u202e": 1}\n'))
    assert "\x1b" not in message and "\u202e" not in message
    assert "max\\x1b[2J\\u202e" in message


@pytest.mark.parametrize("command", ["validate", "agents"])
def test_the_cli_prints_one_error_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
):
    assert cli.main([command, "--config", str(write(tmp_path, BOMB))]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("clonefleet: error: ")
