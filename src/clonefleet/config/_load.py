"""Finding and reading the config file: ``--config FILE``, ``$CLONEFLEET_CONFIG``, the project's
``.clonefleet/config.yaml``, then the user's global file; none is fine.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import yaml
from pydantic import ValidationError

from clonefleet.config._files import (
    MAX_CONFIG_BYTES,
    printable,
    read_regular_file,
    safe_load_yaml,
    yaml_problem,
)
from clonefleet.config._schema import Config, ConfigSource
from clonefleet.config._trust_needs import config_needs
from clonefleet.config._trust_records import read_trust_records
from clonefleet.errors import ConfigError

__all__ = [
    "find_config_path",
    "find_config_source",
    "load_config",
    "load_config_from",
    "user_config",
]


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


def load_config(
    path: str | os.PathLike[str] | None = None,
    cwd: Path | None = None,
    *,
    check_trust: bool = True,
) -> Config:
    """Load and validate the config (defaults when no file is found).

    A project's ``.clonefleet/config.yaml`` whose folder is not trusted may not ask for anything
    only trust allows: a provider's URL or key variable, an MCP server, a simulation script,
    ``web`` or ``durability.journal_dir`` (docs/config.md, :func:`config_needs`).

    Args:
        path: ``--config FILE``; ``None`` finds the file (:func:`find_config_source`).
        cwd: the working directory whose ``.clonefleet/config.yaml`` is the project's.
        check_trust: ``False`` loads an untrusted project's config all the same (its source
            still says it is not trusted), for a report of what it asks (``validate``); never
            for a run.

    Raises:
        ConfigError: the file cannot be read, is not YAML, breaks the schema, or is an untrusted
            project config that asks for what only trust allows; the message names the file
            and the key.
    """
    return load_config_from(find_config_source(path, cwd), check_trust=check_trust)


def load_config_from(source: ConfigSource, *, check_trust: bool = True) -> Config:
    """Load the config ``source`` names (see :func:`find_config_source`), checking trust
    (see :func:`load_config`)."""
    if source.path is None:
        config = Config()
    else:
        config = _read_config(Path(source.path))
        if source.kind == "project":
            source = _check_project(config, source, check_trust)
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


def _check_project(config: Config, source: ConfigSource, check: bool) -> ConfigSource:
    """Mark a project's config trusted or not; refuse an untrusted one that asks for anything
    only trust allows (:func:`config_needs`), naming the first such key."""
    trusted = any(r["dir"] == source.project_dir for r in read_trust_records())
    source = replace(source, trusted=trusted)
    if trusted or not check:
        return source
    config._source = source
    needs = config_needs(config, user_config())
    if needs:
        raise ConfigError(needs[0].message, needs[0].file, needs[0].key)
    return source


def user_config() -> Config:
    """The user's own config, against which a project's is compared: their global file, or the
    built-in defaults without one.

    Raises:
        ConfigError: the global file is unreadable or invalid.
    """
    glob = _global_config_path()
    return _read_config(glob) if glob.is_file() else Config()
