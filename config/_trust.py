"""Trust of project configs: a project's ``.clonefleet/config.yaml`` may not add a network
provider or change a provider's ``base_url`` or ``api_key_env`` unless its folder is in the
trust records (``clonefleet trust``); base URL checks (``docs/config.md``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError
from ._files import MAX_CONFIG_BYTES, printable, read_regular_file
from ._mcp import McpServerConfig
from ._model import Config, ProviderConfig, provider_route

# -- trust: the project folders whose config may name providers (``clonefleet trust``) -------

__all__ = [
    "mcp_change",
    "needs_trust",
    "provider_change",
    "read_trust_records",
    "trust_file",
    "web_change",
]


def trust_file() -> Path:
    """The trust records, ``$XDG_STATE_HOME/clonefleet/trusted.json`` (default
    ``~/.local/state/clonefleet/trusted.json``); ``trust.py`` writes them."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "clonefleet" / "trusted.json"


def read_trust_records(file: Path | None = None) -> list[dict[str, str]]:
    """The trusted project folders, ``[{dir, since}]``; empty when there is no file.

    Raises:
        ConfigError: the file cannot be read or is not a trust-record file.
    """
    file = file or trust_file()
    where = printable(str(file))
    try:
        data = json.loads(read_regular_file(file, MAX_CONFIG_BYTES))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read trust records: {exc.strerror or exc}", where) from None
    except ValueError:
        data = None
    records = data.get("trusted") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and isinstance(r.get("dir"), str) for r in records
    ):
        raise ConfigError("not a clonefleet trust-record file; fix or delete it", where)
    return [{"dir": r["dir"], "since": str(r.get("since", ""))} for r in records]


def provider_change(entry: ProviderConfig, mine: ProviderConfig | None) -> str | None:
    """What in ``entry`` needs trust, against the user's own provider of its name: ``None``
    (nothing), ``""`` (a new provider), ``kind``, ``base_url`` or ``api_key_env``."""
    new = provider_route(entry)
    old = provider_route(mine) if mine is not None else None
    if new is None:
        return None
    if old is None:
        return "" if mine is None else "kind"
    if new[0].rstrip("/") != old[0].rstrip("/"):
        return "base_url"
    return "api_key_env" if new[1] != old[1] else None


def needs_trust(config: Config, own: dict[str, ProviderConfig], name: str) -> bool:
    return provider_change(config.providers[name], own.get(name)) is not None


def mcp_change(config: Config, own: Mapping[str, McpServerConfig]) -> str | None:
    """The first MCP server the config adds or changes against the user's own servers of
    ``own`` (its global config's), or ``None``. A stdio server is a command the clone hosts run
    and a URL server is where they send requests, so either needs trust."""
    return next((n for n, s in sorted(config.mcp_servers.items()) if own.get(n) != s), None)


def web_change(config: Config) -> str | None:
    """The first ``web.*`` key the config's file sets (``web.allow_domains``, ...), or ``None``.

    Any of them needs trust: the section says where ``web_fetch`` may send requests and which
    search API or Python function ``web_search`` runs."""
    if "web" not in config.model_fields_set:
        return None
    keys = sorted(config.web.model_fields_set)
    return f"web.{keys[0]}" if keys else "web"
