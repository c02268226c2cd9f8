"""Shared fixtures of the definitions tests: an isolated XDG config home and a file writer."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clonefleet.definitions import registered, unregister

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "definitions"


@pytest.fixture(autouse=True)
def _isolated_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point XDG_CONFIG_HOME at an empty folder so a developer's own definitions never leak in."""
    home = tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    yield home
    for defn in registered():
        unregister(defn.name)


@pytest.fixture
def xdg_home(_isolated_config_home: Path) -> Path:
    return _isolated_config_home


@pytest.fixture
def write_md() -> Callable[..., Path]:
    """``write_md(folder, "name.md", text)`` writes dedented text (folders are created)."""

    def write(folder: Path, filename: str, text: str, *, dedent: bool = True) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / filename
        path.write_text(
            textwrap.dedent(text).lstrip("\n") if dedent else text, encoding="utf-8", newline=""
        )
        return path

    return write


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
