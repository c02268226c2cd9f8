"""What a project's config asks for that only trust allows: a project's ``.clonefleet/config.yaml``
may not add a network provider, change a provider's ``base_url`` or ``api_key_env``, add an MCP
server, set a simulation script, ``web``, ``cluster`` or ``durability.journal_dir`` unless its folder
is in the trust records (``clonefleet trust``, :mod:`._trust_records`; docs/config.md).

:func:`config_needs` lists what a project's config asks for that only trust allows, as
:class:`TrustNeed` rows; the loader refuses an untrusted file with the first one, and
``clonefleet validate`` shows them all.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from clonefleet.config._files import printable
from clonefleet.config._mcp import McpServerConfig
from clonefleet.config._schema import Config, ProviderConfig, provider_route
from clonefleet.config._urls import shown_url

__all__ = [
    "TrustKind",
    "TrustNeed",
    "config_needs",
    "mcp_change",
    "mcp_need",
    "needs_trust",
    "provider_change",
    "trust_command",
    "web_change",
]


class TrustKind(StrEnum):
    """What a project's file asks for that only ``clonefleet trust`` allows."""

    COMMAND = "command"
    """A process every clone host would start (an MCP server's ``command``)."""
    URL = "url"
    """Where the clone hosts would send requests (an MCP server's ``url``)."""
    KEY = "key"
    """Where a provider sends the clones' messages, with which key variable."""
    SCRIPT = "script"
    """A simulation script: it plays the model, so it picks every tool call (``shell`` too)."""
    SETTING = "setting"
    """``web.*`` (where ``web_fetch`` goes, what ``web_search`` runs), ``cluster`` (what clone
    hosts ask the cluster for) or ``durability.journal_dir`` (where the scheduler writes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustNeed:
    """One thing a project's file asks for that only ``clonefleet trust`` allows."""

    file: str
    """The file that asks (a config, or a definition file; ``<config>:subagents.<name>`` for an
    inline definition)."""
    key: str
    """Its key: ``providers.gh``, ``mcp_servers.x``, ``mcpServers.helper``, ..."""
    kind: TrustKind
    target: str
    """What would run or be reached, for people: a command line, a URL (passwords masked) and
    its key variable's name, a script's path or a setting's value. Never a key's value."""
    message: str
    """The refusal: what it would do, and the ``clonefleet trust`` line that allows it."""

    def to_json(self) -> dict[str, str]:
        return {"file": self.file, "key": self.key, "kind": str(self.kind), "target": self.target}


def trust_command(project_dir: str | None) -> str:
    """``clonefleet trust DIR``, quoted for a shell and safe to print."""
    return f"clonefleet trust {printable(shlex.quote(project_dir or '.'))}"


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


def mcp_need(
    server: str, entry: McpServerConfig, *, file: str, key: str, whose: str, trust: str
) -> TrustNeed:
    """The need of one MCP server a project's file asks for: its command or its URL (with the
    names of its headers, which are sent as written). ``whose`` says what asks (``this
    project's config``); ``trust`` is the ``clonefleet trust`` line."""
    if entry.url is None:
        kind, target = TrustKind.COMMAND, printable(shlex.join(entry.argv))
        what = f"run the command {target!r}"
    else:
        kind, target = TrustKind.URL, shown_url(entry.url)
        if entry.headers:
            target += f" (headers {printable(', '.join(sorted(entry.headers)))})"
        what = f"send requests to {target!r}"
    message = (
        f"{whose} is not trusted: its MCP server {printable(repr(server))} would make every "
        f"clone host {what}. A project's files may not start or reach an MCP server until you "
        f"trust its folder; if you do, run `{trust}`"
    )
    return TrustNeed(file=file, key=key, kind=kind, target=target, message=message)


def config_needs(config: Config, own: Config | None = None) -> list[TrustNeed]:
    """Everything a project's config asks for that only trust allows, in the order the loader
    checks them: ``durability.journal_dir``, ``web``, ``cluster``, MCP servers, providers, simulation
    scripts.

    Pure: ``own`` is the user's own config (the built-in defaults plus their global file; default
    the built-in defaults), against which providers, MCP servers and scripts are compared. The
    config's source says which folder ``clonefleet trust`` would trust; its trust is not looked
    at (a trusted project's config has the same needs, already granted).
    """
    own = own or Config()
    file = printable(config.path or "")
    trust = trust_command(config.source.project_dir)
    whose = "this project's config"
    needs: list[TrustNeed] = []
    if (journal := config.durability.journal_dir) is not None:
        needs.append(
            TrustNeed(
                file=file,
                key="durability.journal_dir",
                kind=TrustKind.SETTING,
                target=printable(journal),
                message=(
                    f"{whose} is not trusted: it sets durability.journal_dir, the folder the "
                    "scheduler writes its journal to; a project's config may not choose it until "
                    f"you trust its folder: run `{trust}`"
                ),
            )
        )
    if (web_key := web_change(config)) is not None:
        needs.append(
            TrustNeed(
                file=file,
                key=web_key,
                kind=TrustKind.SETTING,
                target=web_key,
                message=(
                    f"{whose} is not trusted: it sets {web_key}, which says where web_fetch may "
                    "send requests and what web_search runs; a project's config may not set "
                    f"`web` until you trust its folder: run `{trust}`"
                ),
            )
        )
    if config.cluster != own.cluster:
        needs.append(
            TrustNeed(
                file=file,
                key="cluster",
                kind=TrustKind.SETTING,
                target="cluster",
                message=(
                    f"{whose} is not trusted: it sets `cluster`, which says what each clone "
                    "host asks the Ray cluster for (an autoscaler adds nodes for it); a "
                    f"project's config may not set it until you trust its folder: run `{trust}`"
                ),
            )
        )
    for name, entry in sorted(config.mcp_servers.items()):
        if own.mcp_servers.get(name) != entry:
            need = mcp_need(
                name, entry, file=file, key=f"mcp_servers.{name}", whose=whose, trust=trust
            )
            needs.append(need)
    names = sorted(config.declared_providers)
    found = (f(config, own, n, trust) for f in (_provider_need, _script_need) for n in names)
    return needs + [n for n in found if n is not None]


def _provider_need(config: Config, own: Config, name: str, trust: str) -> TrustNeed | None:
    change = provider_change(config.providers[name], own.providers.get(name))
    if change is None:
        return None
    url, env = provider_route(config.providers[name]) or ("", None)
    theirs = "has no provider of that name" if not change else f"has another {change} for it"
    key = f"the key in ${printable(env)}" if env else "no key"
    return TrustNeed(
        file=printable(config.path or ""),
        key=printable(f"providers.{name}" + (f".{change}" if change else "")),
        kind=TrustKind.KEY,
        target=f"{shown_url(url)} with {key}",
        message=(
            f"this project's config is not trusted: its provider {printable(repr(name))} would "
            f"send requests with {key} to '{shown_url(url)}', and your own config {theirs}. A "
            "project's config may not add a provider or change a provider's base_url or "
            f"api_key_env until you trust its folder; if you do, run `{trust}`"
        ),
    )


def _script_need(config: Config, own: Config, name: str, trust: str) -> TrustNeed | None:
    entry = config.providers[name]
    script = entry.simulated.script if entry.kind == "simulated" else None
    mine = own.providers.get(name)
    if script is None or (
        mine is not None and mine.kind == entry.kind and mine.simulated.script == script
    ):
        return None
    shown = printable(script)
    return TrustNeed(
        file=printable(config.path or ""),
        key=printable(f"providers.{name}.simulated.script"),
        kind=TrustKind.SCRIPT,
        target=shown,
        message=(
            f"this project's config is not trusted: its provider {printable(repr(name))} would "
            f"answer for the model from the script {shown!r}, which chooses every tool call of "
            "the clones (a `shell` command included). A project's config may not set a "
            f"simulation script until you trust its folder; if you do, run `{trust}`"
        ),
    )
