"""The clonefleet configuration file: providers, models, model groups, limits, discovery.

This module owns parsing and validating the YAML config and the embedded defaults used when no
file exists (provider ``sim``, models ``sim-small``/``sim-large``, group ``default``). It does
not reach any provider; ``clonefleet.actors`` turns a resolved model into a live client.

The file is found, in order: ``--config FILE``, ``$CLONEFLEET_CONFIG``, ``.clonefleet/config.yaml``
in the working directory, ``$XDG_CONFIG_HOME/clonefleet/config.yaml``. None is fine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError

__all__ = [
    "Config",
    "DiscoveryConfig",
    "LimitsConfig",
    "ModelConfig",
    "ProviderConfig",
    "SimulatedOptions",
    "find_config_path",
    "load_config",
]

_STRICT = ConfigDict(frozen=True, extra="forbid")


class SimulatedOptions(BaseModel):
    """Knobs of the simulated provider (``docs/config.md``)."""

    model_config = _STRICT
    latency_ms: float = 0.0
    """Added delay per model request, in milliseconds."""
    fail_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that a request fails with HTTP 503 (deterministic per seed)."""
    rate_429: float = Field(default=0.0, ge=0.0, le=1.0)
    """Probability that a request fails with HTTP 429 and ``Retry-After: 0``."""
    seed: int = 0
    """Seed mixed with batch id and clone index for deterministic behaviour."""
    script: str | None = None
    """Path of a script file (per-clone steps); see ``clonefleet.actors.SimScript``."""


class ProviderConfig(BaseModel):
    """One provider entry: how to reach a family of models."""

    model_config = _STRICT
    kind: Literal["openai", "anthropic", "simulated"]
    base_url: str | None = None
    """Root URL, e.g. ``http://127.0.0.1:8000/v1``; required for ``openai``."""
    api_key_env: str | None = None
    """Name of the environment variable holding the key; the key itself never goes in config."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Overall deadline of one request, in seconds (a slow drip cannot exceed it)."""
    max_retries: int = Field(default=2, ge=0, le=10)
    """Retries of a transient failure on the same candidate before moving on."""
    max_connections: int = Field(default=1000, ge=1)
    """Connection-pool size per clone host process."""
    simulated: SimulatedOptions = SimulatedOptions()

    @model_validator(mode="after")
    def _check_url(self) -> ProviderConfig:
        if self.kind == "openai" and not self.base_url:
            raise ValueError("an openai provider needs base_url")
        return self


class ModelConfig(BaseModel):
    """A named model: which provider serves it and under which wire name."""

    model_config = _STRICT
    provider: str
    name: str
    max_tokens: int | None = None


class LimitsConfig(BaseModel):
    """Fleet limits."""

    model_config = _STRICT
    max_count: int = Field(default=10_000, ge=1)
    """Largest accepted ``--count`` of one batch."""
    max_depth: int = Field(default=3, ge=0)
    """Deepest allowed nesting of subagent spawns."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Fleet-wide number of jobs running at once; ``None`` = no cap."""
    clones_per_actor: int | None = Field(default=None, ge=1)
    """Clones hosted per Ray actor; ``None`` = chosen from batch size and cluster."""


class DiscoveryConfig(BaseModel):
    """Where definitions and skills are looked up besides the built-in places."""

    model_config = _STRICT
    extra_subagents_dirs: tuple[str, ...] = ()
    follow_symlinks_for_configs: bool = False


class Config(BaseModel):
    """The whole validated configuration."""

    model_config = _STRICT
    version: Literal[1] = 1
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    model_groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    aliases: dict[str, str] = Field(default_factory=dict)
    limits: LimitsConfig = LimitsConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    subagents: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Inline definitions: ``subagents.<name>`` beats every file of that name."""
    path: str | None = None
    """The file this config came from (``None`` for built-in defaults)."""

    @model_validator(mode="after")
    def _with_defaults(self) -> Config:
        # The embedded simulated provider is always there, so a config that only adds an
        # openai provider still runs definitions that name no model.
        providers = {"sim": ProviderConfig(kind="simulated"), **self.providers}
        models = {
            "sim-small": ModelConfig(provider="sim", name="sim-small"),
            "sim-large": ModelConfig(provider="sim", name="sim-large"),
            **self.models,
        }
        groups = {"default": ("sim-small", "sim-large"), **self.model_groups}
        aliases = {"sonnet": "sim-large", "opus": "sim-large", "haiku": "sim-small", **self.aliases}
        object.__setattr__(self, "providers", providers)
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "model_groups", groups)
        object.__setattr__(self, "aliases", aliases)
        for name, model in models.items():
            if model.provider not in providers:
                raise ValueError(
                    f"models.{name}.provider names unknown provider {model.provider!r}"
                )
        for group, members in groups.items():
            if not members:
                raise ValueError(f"model_groups.{group} is empty")
            for member in members:
                if member not in models and member not in aliases:
                    raise ValueError(f"model_groups.{group} names unknown model {member!r}")
        return self

    def resolve_model(self, name: str) -> tuple[str, ModelConfig, ProviderConfig]:
        """Resolve a model or alias name to ``(model key, model, provider)``.

        Raises:
            ConfigError: the name is neither a model nor an alias of one.
        """
        seen: set[str] = set()
        key = name
        while key in self.aliases and key not in seen and key not in self.models:
            seen.add(key)
            key = self.aliases[key]
        if key in self.models:
            model = self.models[key]
            return key, model, self.providers[model.provider]
        raise ConfigError(
            f"unknown model {name!r}; known: {', '.join(sorted(self.models))}", self.path, "models"
        )

    def model_candidates(self, spec: str | None) -> tuple[str, ...]:
        """Turn a definition's ``model`` into its candidate model names, in failover order.

        ``None`` and ``inherit`` mean the ``default`` group; ``@mg:NAME`` names a group.
        """
        if spec is None or spec == "inherit":
            return self.model_groups["default"]
        if spec.startswith("@mg:"):
            group = spec[4:]
            if group not in self.model_groups:
                raise ConfigError(
                    f"unknown model group {group!r}; known: {', '.join(sorted(self.model_groups))}",
                    self.path,
                    "model_groups",
                )
            return self.model_groups[group]
        return (spec,)


def find_config_path(
    explicit: str | os.PathLike[str] | None = None, cwd: Path | None = None
) -> Path | None:
    """Return the config file to use, or ``None`` when there is none."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("CLONEFLEET_CONFIG")
    if env:
        return Path(env)
    cwd = cwd or Path.cwd()
    local = cwd / ".clonefleet" / "config.yaml"
    if local.is_file():
        return local
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    glob = xdg / "clonefleet" / "config.yaml"
    return glob if glob.is_file() else None


def load_config(path: str | os.PathLike[str] | None = None, cwd: Path | None = None) -> Config:
    """Load and validate the config (defaults when no file is found).

    Raises:
        ConfigError: the file cannot be read, is not YAML, or breaks the schema; the message
            names the file and the key.
    """
    found = find_config_path(path, cwd)
    if found is None:
        return Config()
    try:
        text = found.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror or exc}", str(found)) from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", str(found)) from exc
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", str(found))
    try:
        return Config(**data, path=str(found))
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or None
        raise ConfigError(
            f"{first['msg']} ({len(exc.errors())} problem(s))", str(found), key
        ) from None
