"""Finding and reading the config file: ``--config FILE``, ``$CLONEFLEET_CONFIG``, the project's
``.clonefleet/config.yaml``, then the user's global file; none is fine.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import replace
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import ConfigError
from ._files import MAX_CONFIG_BYTES, printable, read_regular_file, safe_load_yaml, yaml_problem
from ._model import Config, ConfigSource, provider_route, shown_url
from ._trust import mcp_change, needs_trust, provider_change, read_trust_records, web_change

__all__ = ["find_config_path", "find_config_source", "load_config", "load_config_from"]


def find_config_path(
    explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None
) -> Path | None:
    """Return the config file to use, or ``None`` when there is none."""
    source = find_config_source(explicit, cwd)
    return Path(source.path) if source.path else None


def _global_config_path() -> Path:
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return xdg / "clonefleet" / "config.yaml"


def find_config_source(
    explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None
) -> ConfigSource:
    """Which config file applies, and what kind of source it is (``built-in`` when none)."""
    if explicit:
        return ConfigSource("explicit", os.fspath(explicit))
    env = os.environ.get("CLONEFLEET_CONFIG")
    if env:
        return ConfigSource("env", env)
    cwd = cwd or Path.cwd()
    local = cwd / ".clonefleet" / "config.yaml"
    if local.is_file():
        return ConfigSource("project", str(local), trusted=False, project_dir=str(cwd.resolve()))
    glob = _global_config_path()
    return ConfigSource("global", str(glob)) if glob.is_file() else ConfigSource("built-in")


def load_config(path: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Config:
    """Load and validate the config (defaults when no file is found).

    A project's ``.clonefleet/config.yaml`` whose folder is not trusted may not add a network
    provider or change a provider's ``base_url`` or ``api_key_env`` (docs/config.md).

    Raises:
        ConfigError: the file cannot be read, is not YAML, breaks the schema, or is an untrusted
            project config that names providers; the message names the file and the key.
    """
    return load_config_from(find_config_source(path, cwd))


def load_config_from(source: ConfigSource) -> Config:
    """Load the config ``source`` names (see :func:`find_config_source`), checking trust."""
    if source.path is None:
        config = Config()
    else:
        config = _read_config(Path(source.path))
        if source.kind == "project":
            source = _check_project(config, source)
            if (glob := _global_config_path()).is_file():
                # The user's own rules still hold: a project's config can only narrow them.
                config._user_permissions = _read_config(glob).permissions
    config._source = source
    return config


def _read_config(found: Path) -> Config:
    """Read and validate one config file.

    Raises:
        ConfigError: the file cannot be read, is not YAML, or breaks the schema; the message
            names the file and the key.
    """
    where = printable(str(found))
    try:
        raw = read_regular_file(found, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror or exc}", where) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config: not UTF-8 text (byte {exc.start})", where) from None
    try:
        data = safe_load_yaml(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {yaml_problem(exc)}", where) from None
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", where)
    bad = [k for k in data if not isinstance(k, str) or k == "path"]
    if bad:
        raise ConfigError(f"{printable(repr(bad[0]))} is not a config key", where)
    try:
        return Config(**data, path=str(found))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = printable(".".join(str(p) for p in first["loc"])) or None
        raise ConfigError(
            f"{printable(first['msg'])} ({len(exc.errors())} problem(s))", where, key
        ) from None


def _check_project(config: Config, source: ConfigSource) -> ConfigSource:
    """Mark a project's config trusted or not; refuse an untrusted one whose providers are
    not the built-in ones or the very same as in the user's own (global) config."""
    trusted = any(r["dir"] == source.project_dir for r in read_trust_records())
    source = replace(source, trusted=trusted)
    if trusted:
        return source
    if config.durability.journal_dir is not None:
        raise ConfigError(
            "this project's config is not trusted: it sets durability.journal_dir, the folder the "
            "scheduler writes its journal to; a project's config may not choose it until you "
            f"trust its folder: run `clonefleet trust {printable(shlex.quote(source.project_dir or '.'))}`",
            printable(source.path or ""),
            "durability.journal_dir",
        )
    if (web_key := web_change(config)) is not None:
        raise ConfigError(
            f"this project's config is not trusted: it sets {web_key}, which says where web_fetch "
            "may send requests and what web_search runs; a project's config may not set `web` "
            f"until you trust its folder: run `clonefleet trust {printable(shlex.quote(source.project_dir or '.'))}`",
            printable(source.path or ""),
            web_key,
        )
    _check_mcp(config, source)
    own = Config().providers
    names = [n for n in sorted(config.declared_providers) if needs_trust(config, own, n)]
    if names and (glob := _global_config_path()).is_file():
        own = _read_config(glob).providers
        names = [n for n in names if needs_trust(config, own, n)]
    if not names:
        return source
    name = names[0]
    change = provider_change(config.providers[name], own.get(name)) or ""
    url, env = provider_route(config.providers[name]) or ("", None)
    theirs = "has no provider of that name" if not change else f"has another {change} for it"
    more = f" (and {len(names) - 1} more provider(s))" if len(names) > 1 else ""
    raise ConfigError(
        f"this project's config is not trusted: its provider {printable(repr(name))} would send "
        f"requests with {f'the key in ${printable(env)}' if env else 'no key'} to "
        f"'{shown_url(url)}', and your own config {theirs}{more}. A project's config may not add "
        "a provider or change a provider's base_url or api_key_env until you trust its folder; "
        f"if you do, run `clonefleet trust {printable(shlex.quote(source.project_dir or '.'))}`",
        printable(source.path or ""),
        printable(f"providers.{name}" + (f".{change}" if change else "")),
    )


def _check_mcp(config: Config, source: ConfigSource) -> None:
    """Refuse an untrusted project config whose MCP servers are not the very same as in the
    user's own (global) config: a stdio server is a command every clone host would run."""
    if not config.mcp_servers:
        return
    glob = _global_config_path()
    own = _read_config(glob).mcp_servers if glob.is_file() else {}
    name = mcp_change(config, own)
    if name is None:
        return
    entry = config.mcp_servers[name]
    what = (
        f"run the command {shlex.join(entry.argv)!r}"
        if entry.url is None
        else f"send requests to '{shown_url(entry.url)}'"
    )
    raise ConfigError(
        f"this project's config is not trusted: its MCP server {name!r} would make every clone "
        f"host {printable(what)}, and your own config has no such server. A project's config may "
        "not add or change an MCP server until you trust its folder; if you do, run "
        f"`clonefleet trust {printable(shlex.quote(source.project_dir or '.'))}`",
        printable(source.path or ""),
        printable(f"mcp_servers.{name}"),
    )
