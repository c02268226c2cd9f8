"""The live-request guard: tests and benchmarks turn off requests to anything but loopback.

Real providers call :func:`ensure_live_requests_allowed` before every request; it refuses a
non-loopback URL while ``CLONEFLEET_BLOCK_LIVE=1`` or :func:`set_live_requests_allowed` says so.
"""

from __future__ import annotations

import ipaddress
import os

import httpx

from clonefleet.errors import (
    UsageError,
)

__all__ = [
    "BLOCK_LIVE_ENV",
    "ensure_live_requests_allowed",
    "is_loopback_url",
    "live_requests_allowed",
    "set_live_requests_allowed",
]

BLOCK_LIVE_ENV = "CLONEFLEET_BLOCK_LIVE"

# ---------------------------------------------------------------------------------------------
# The live-request guard: tests turn it off; loopback hosts are always allowed, so the
# local simulated server (`clonefleet provider serve`) stays reachable from tests.

_live_override: bool | None = None


def set_live_requests_allowed(allowed: bool | None) -> bool | None:
    """Allow or block requests to non-loopback hosts in this process.

    Args:
        allowed: ``True``/``False`` overrides the environment; ``None`` follows
            ``CLONEFLEET_BLOCK_LIVE`` again (the default: allowed unless it is ``1``).

    Returns:
        The previous setting, so a fixture can restore it.
    """
    global _live_override
    previous, _live_override = _live_override, allowed
    return previous


def live_requests_allowed() -> bool:
    """Whether requests to non-loopback hosts are allowed right now."""
    if _live_override is not None:
        return _live_override
    return os.environ.get(BLOCK_LIVE_ENV, "").strip().lower() not in ("1", "true", "yes")


def is_loopback_url(url: str | httpx.URL) -> bool:
    """Whether ``url`` points at this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    host = httpx.URL(str(url)).host
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_live_requests_allowed(url: str | httpx.URL) -> None:
    """Refuse a request to a non-loopback host while live requests are blocked.

    Raises:
        UsageError: live requests are blocked and ``url`` is not a loopback address.
    """
    if live_requests_allowed() or is_loopback_url(url):
        return
    host = httpx.URL(str(url)).host
    raise UsageError(
        f"live model request to {host} refused: live requests are blocked in this process "
        f"({BLOCK_LIVE_ENV}=1 or set_live_requests_allowed(False)); use the live_llm marker to allow them"
    )
