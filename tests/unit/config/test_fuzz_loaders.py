"""Fuzzing the loaders of user files with hypothesis, a bounded number of examples each.

Whatever the text or bytes, the definition loader ends in a definition or its own reported
failure (``DefinitionError``), the config loader in a config or a ``ConfigError``, and the
simulation-script loader in a script or a ``ConfigError``: never another exception type.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.config import Config, load_config, printable
from clonefleet.definitions import load_catalog, load_file
from clonefleet.errors import ConfigError, DefinitionError
from clonefleet.providers import SimScript

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,  # nothing is written into the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Fragments that have broken YAML loaders: bad tags, huge numbers, anchors, odd scalars.
TRICKY = [
    "!!int not-a-number",
    "!!float x",
    "!!timestamp 2024-02-31",
    "!!timestamp x",
    "!!bool maybe",
    "!!binary '@@'",
    "!!set {a: null}",
    "!!omap [a]",
    "!!pairs [1]",
    "!!null x",
    "!!str [a]",
    "!!map x",
    "!!python/object:os.system x",
    "!custom x",
    "9" * 5000,
    "0x" + "f" * 200,
    "0b" + "1" * 100,
    "190:20:30",
    "1_000",
    "1e999",
    "-.inf",
    ".nan",
    "&a [1, *a]",
    "&a x",
    "*a",
    "*undefined",
    "<<: *a",
    "<<: [1]",
    "? [a]\n: b",
    '"\\x1b[2J\\u202e\\x07"',
    "'",
    '"',
    "[",
    "{",
    "- - - x",
    "|\n  block",
    ">-\n  folded",
    "2024-01-01",
    "~",
    "Read, Grep",
    "tag!ALL",
    "@mg:",
    "sim-small",
    "\t",
    "%YAML 1.1",
    "---",
    "...",
]
KEYS = [
    "name",
    "description",
    "tools",
    "disallowedTools",
    "model",
    "maxTurns",
    "skills",
    "color",
    "mcpServers",
    "clonefleet",
    "polytoken",
    "tools_deny",
    "undeferred_tools",
    "exit_tool_schema",
    "inherit_tools",
    "allow_subagent_spawn",
    "max_turns",
    "max_tokens",
    "fallback_models",
    "skills_allow",
    "type",
    "properties",
    "enum",
    "$ref",
    "$defs",
    "default",
    "clones",
    "agents",
    "tool",
    "args",
    "text",
    "error",
    "retry_after",
    "latency_ms",
    "hang",
    "providers",
    "models",
    "model_groups",
    "aliases",
    "limits",
    "discovery",
    "subagents",
    "version",
    "kind",
    "base_url",
    "simulated",
    "script",
    "max_count",
    "max_prompt_chars",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["Read", "file_read", "exit_tool", "tag!ALL", "@mg:x", "inherit", "object"]),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=8), st.integers(-3, 3), st.none())
data = st.recursive(
    scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(keys, kids, max_size=5)),
    max_leaves=25,
)


@st.composite
def yaml_ish(draw: st.DrawFn) -> str:
    """A YAML document: dumped data, fragments glued into lines, or plain text, then mangled."""
    kind = draw(st.sampled_from(["data", "lines", "text"]))
    if kind == "data":
        text = yaml.safe_dump(draw(data), allow_unicode=draw(st.booleans()))
    elif kind == "lines":
        lines = [
            f"{'  ' * draw(st.integers(0, 3))}{draw(st.sampled_from(KEYS))}: "
            f"{draw(st.one_of(st.sampled_from(TRICKY), st.text(max_size=15)))}"
            for _ in range(draw(st.integers(1, 6)))
        ]
        text = "\n".join(lines) + "\n"
    else:
        text = draw(st.text(max_size=200))
    if draw(st.booleans()):  # splice a tricky fragment somewhere
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(TRICKY)) + text[at:]
    return text


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder for the fuzzed files, with XDG_CONFIG_HOME pointed inside it."""
    folder = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(folder / "xdg"))
        yield folder


def _no_belt(failures: list[Any]) -> None:
    # The catalog turns unexpected exceptions into reports too; the fuzz wants none of those.
    assert not [f for f in failures if "could not be loaded (" in f.message], failures


@FUZZ
@given(front=yaml_ish(), body=st.text(max_size=50), native=st.booleans())
def test_any_definition_text_loads_or_is_reported(
    scratch: Path, front: str, body: str, native: bool
) -> None:
    prefix = "clonefleet:\n  tools: [file_read]\n" if native else ""
    path = scratch / "fuzzed.md"
    path.write_text(f"---\n{prefix}{front}\n---\n{body}", encoding="utf-8", errors="surrogatepass")
    try:
        load_file(path)
    except DefinitionError as exc:
        assert exc.reason in {
            "missing-frontmatter",
            "invalid-frontmatter",
            "name-mismatch",
            "io-error",
            "invalid-definition",
        }


@FUZZ
@given(raw=st.binary(max_size=300))
def test_any_definition_bytes_load_or_are_reported(scratch: Path, raw: bytes) -> None:
    path = scratch / "bytes.md"
    path.write_bytes(raw if raw.startswith(b"---") else b"---\n" + raw)
    try:
        load_file(path)
    except DefinitionError:
        pass


@FUZZ
@given(entry=st.dictionaries(st.sampled_from(KEYS), data, max_size=6))
def test_any_config_subagent_entry_is_reported_per_entry(scratch: Path, entry: Any) -> None:
    try:
        config = Config(subagents={"fuzzed": entry})
    except Exception:  # pydantic refuses it: the config loader reports that as a ConfigError
        return
    catalog = load_catalog(scratch, (), config)
    assert "general-purpose" in catalog.definitions
    _no_belt(catalog.errors)


@FUZZ
@given(text=yaml_ish())
def test_any_config_text_loads_or_is_a_config_error(scratch: Path, text: str) -> None:
    path = scratch / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        config = load_config(path)
    except ConfigError as exc:
        assert printable(str(exc)) == str(exc)  # nothing left to escape
        return
    _no_belt(load_catalog(scratch, (), config).errors)


@FUZZ
@given(text=yaml_ish())
def test_any_sim_script_text_loads_or_is_a_config_error(scratch: Path, text: str) -> None:
    path = scratch / "script.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        SimScript.load(path)
    except ConfigError as exc:
        assert printable(str(exc)) == str(exc)  # nothing left to escape


@FUZZ
@given(
    steps=st.lists(
        st.dictionaries(
            st.sampled_from(
                [
                    "tool",
                    "args",
                    "text",
                    "error",
                    "retry_after",
                    "latency_ms",
                    "hang",
                    "drip",
                    "malformed",
                    "refuse",
                    "html",
                ]
            ),
            data,
            max_size=4,
        ),
        max_size=4,
    ),
    index=scalars,
)
def test_any_sim_script_data_builds_or_is_a_config_error(steps: list[Any], index: Any) -> None:
    try:
        loaded = SimScript.from_data({"default": steps, "clones": {index: steps}})
    except ConfigError:
        return
    for step in loaded.default:
        for delay in (step.retry_after, step.latency_ms):
            assert delay is None or (math.isfinite(delay) and delay >= 0)
    assert os.sep  # the script built: every step passed its checks
