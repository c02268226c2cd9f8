"""Fixtures shared by the unit tests of more than one folder."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from clonefleet.clone import WebAccess


@pytest.fixture
async def access() -> AsyncIterator[list[WebAccess]]:
    """Collects the test's :class:`WebAccess` objects and closes them at the end."""
    made: list[WebAccess] = []
    try:
        yield made
    finally:
        for web_access in made:
            await web_access.aclose()
