"""The config file's schema: providers, models, model groups, aliases, limits, discovery, inline
subagents, and the embedded defaults used when no file exists (provider ``sim``, models
``sim-small``/``sim-large``, group ``default``). Pydantic models, no file access.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from clonefleet.config._files import printable
from clonefleet.config._mcp import McpServers
from clonefleet.config._permissions import PermissionsConfig
from clonefleet.config._urls import check_base_url
from clonefleet.config._web import WebConfig
from clonefleet.errors import ConfigError
from clonefleet.permissions import RuleSet

_STRICT = ConfigDict(frozen=True, extra="forbid")

__all__ = [
    "AdmissionConfig",
    "ANTHROPIC_BASE_URL",
    "ClusterConfig",
    "ANTHROPIC_KEY_ENV",
    "Config",
    "ConfigSource",
    "DiscoveryConfig",
    "LimitsConfig",
    "ModelConfig",
    "ProviderConfig",
    "SimulatedOptions",
    "provider_route",
]


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
    """Path of a script file (per-clone steps); see ``clonefleet.clone.SimScript``."""
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute each model allows; past it, HTTP 429 (``None``: no limit)."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute each model allows (input words plus ``max_tokens``)."""
    burst: int | None = Field(default=None, ge=1)
    """Requests let through at once after an idle spell (needs ``rpm``)."""
    limit_headers: bool = True
    """Whether a 429 says when to come back (``retry_after_s``)."""
    cache_ttl_s: float = Field(default=300.0, ge=0)
    """Seconds a prompt-cache entry lives after its last write or read (0: no prompt cache;
    docs/prompt-cache.md)."""
    cache_min_tokens: int = Field(default=1024, ge=1)
    """The shortest prefix, in tokens, the prompt cache writes."""

    @model_validator(mode="after")
    def _check_burst(self) -> SimulatedOptions:
        if self.burst is not None and self.rpm is None:
            raise ValueError("burst needs rpm: it counts requests")
        return self


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
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute to all of this provider's models together, fleet-wide (``None``:
    only what the provider announces; docs/rate-limits.md)."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute (input plus output) to all of its models together, fleet-wide."""
    max_in_flight: int | None = Field(default=None, ge=1)
    """Requests waiting for an answer at once, fleet-wide."""
    prompt_cache: bool = True
    """Whether requests ask for the provider's prompt cache: ``cache_control`` breakpoints on
    the Anthropic wire, ``prompt_cache_key`` on the OpenAI one (docs/prompt-cache.md)."""
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    """The OpenAI-wire field that carries a model's ``max_tokens`` (answer cap)."""
    simulated: SimulatedOptions = SimulatedOptions()

    @model_validator(mode="after")
    def _check_url(self) -> ProviderConfig:
        if self.kind == "openai" and not self.base_url:
            raise ValueError("an openai provider needs base_url")
        return self


class PriceConfig(BaseModel):
    """What a model's tokens cost, in US dollars per million tokens."""

    model_config = _STRICT
    input_per_mtok: float = Field(ge=0.0, allow_inf_nan=False)
    output_per_mtok: float = Field(ge=0.0, allow_inf_nan=False)
    cached_input_per_mtok: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    """Input tokens read from the provider's prompt cache; unset: ``input_per_mtok``."""
    cache_write_per_mtok: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    """Input tokens written to the provider's prompt cache; unset: ``input_per_mtok``."""


class ModelConfig(BaseModel):
    """A named model: which provider serves it and under which wire name."""

    model_config = _STRICT
    provider: str
    name: str
    max_tokens: int | None = Field(default=None, ge=1)
    """The cap on each answer's tokens, sent on the wire (``None``: the wire's default)."""
    price: PriceConfig | None = None
    rpm: int | None = Field(default=None, ge=1)
    """Requests per minute to this model, fleet-wide, within its provider's ``rpm``."""
    tpm: int | None = Field(default=None, ge=1)
    """Tokens per minute to this model, fleet-wide, within its provider's ``tpm``."""
    max_in_flight: int | None = Field(default=None, ge=1)
    """Requests to this model waiting for an answer at once, fleet-wide."""
    """Gives the cost of its usage; without it, cost is unknown (``None``)."""


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
    max_prompt_chars: int = Field(default=1_000_000, ge=1)
    """Longest accepted task prompt of one batch (top-level or nested), in characters."""
    max_message_chars: int = Field(default=100_000, ge=1)
    """Longest message to a running clone (``clonefleet message``, ``message_subagent``)."""
    max_queued_messages_per_job: int = Field(default=1_000, ge=1)
    """Messages waiting for one clone to take them."""
    max_queued_messages: int = Field(default=100_000, ge=1)
    """Messages waiting fleet-wide."""
    max_restarts: int = Field(default=2, ge=0)
    """How many times a clone whose host died is restarted from its last checkpoint before it
    ends ``failed``."""


class AdmissionConfig(BaseModel):
    """How requests are admitted against providers' rate limits (docs/rate-limits.md)."""

    model_config = _STRICT
    learn: bool = True
    """Follow the limits providers announce in their headers, and back off on refusals when
    they announce none (``False``: only configured limits apply)."""
    initial_in_flight: int = Field(default=8, ge=1)
    """Requests in flight fleet-wide to a model nothing is known about yet; the window doubles
    with each round of answers until the provider announces a limit or refuses one."""
    fail_over_groups: tuple[str, ...] = ()
    """Model groups whose clones move to their next candidate when refused for rate (the
    others wait for capacity on the same model)."""
    max_wait_s: float = Field(default=900.0, gt=0.0)
    """Longest one request waits for capacity, refusals included, before it fails."""
    safety: float = Field(default=0.95, gt=0.0, le=1.0)
    """Share of a limit learned from headers that is used (configured limits are used whole)."""


class DurabilityConfig(BaseModel):
    """The journal and clone checkpoints (docs/durability.md)."""

    model_config = _STRICT
    enabled: bool = True
    """Keep the journal (off: the job table lives only in the scheduler's memory, as a
    benchmark's baseline; nothing survives the scheduler's process)."""
    journal_dir: str | None = None
    """Where the scheduler keeps its journal; ``None`` = the cluster's state folder for
    ``cluster up``, a per-run folder for an embedded run."""
    checkpoint_interval_s: float = Field(default=1.0, ge=0.0, le=3600.0, allow_inf_nan=False)
    """How often a clone host ships its clones' latest checkpoints to the scheduler (0 = after
    every turn)."""
    segment_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    """Size at which the journal starts a new segment file."""
    compact_bytes: int = Field(default=256 * 1024 * 1024, ge=64 * 1024)
    """Journal size past which it is compacted into one snapshot."""
    retention_s: float | None = Field(default=7 * 24 * 3600.0, ge=0.0, allow_inf_nan=False)
    """How long finished batches stay in the job table (and the journal); ``None`` = forever."""
    max_events: int = Field(default=200_000, ge=1000)
    """Events the scheduler keeps in memory; older ones are read from the journal."""


class ClusterConfig(BaseModel):
    """How clone hosts ask a Ray cluster for room, so an autoscaler grows it for a big batch
    and shrinks it after (docs/cluster.md, "Capacity"). Read when the scheduler is created."""

    model_config = _STRICT
    autoscale: Literal["auto", "on", "off"] = "auto"
    """Whether busy clone hosts ask Ray for ``host_resources``: ``auto`` when a node of the
    cluster was started by an autoscaler's node type (it carries Ray's ``ray.io/node-group``
    label: the cluster launcher, KubeRay), ``on`` always, ``off`` never (each host then asks for
    nothing and goes to a node that exists, round-robin)."""
    host_resources: dict[str, float] = Field(default_factory=lambda: {"CPU": 1.0})
    """What each busy clone host asks Ray for (``CPU``, ``GPU``, ``memory`` in bytes, or a
    custom resource of the node types), when it asks."""
    max_clones_per_host: int = Field(default=500, ge=1)
    """Most clones a host asking for resources holds (unless ``clones_per_actor`` says): a
    batch of N clones wants at least N / this many hosts, which is what makes it grow the
    cluster."""
    host_wait_s: float = Field(default=600.0, gt=0.0, le=86_400.0, allow_inf_nan=False)
    """How long a host asking for resources may wait for Ray to place it; then its clones go
    to the hosts that run, and new hosts ask for nothing for as long again."""

    @model_validator(mode="after")
    def _check_resources(self) -> ClusterConfig:
        for name, amount in self.host_resources.items():
            if not name or not name.strip():
                raise ValueError("cluster.host_resources: a resource needs a name")
            if not math.isfinite(amount) or amount <= 0:
                raise ValueError(
                    f"cluster.host_resources.{name} must be a number above 0, got {amount!r}"
                )
        return self


class DiscoveryConfig(BaseModel):
    """Where definitions and skills are looked up besides the built-in places."""

    model_config = _STRICT
    extra_subagents_dirs: tuple[str, ...] = ()
    follow_symlinks_for_configs: bool = False


ANTHROPIC_BASE_URL = "https://api.anthropic.com/v1"
"""Where an ``anthropic`` provider without ``base_url`` sends its requests."""
ANTHROPIC_KEY_ENV = "ANTHROPIC_API_KEY"
"""The key variable of an ``anthropic`` provider without ``api_key_env``."""


@dataclass(frozen=True)
class ConfigSource:
    """Where a config came from. ``kind``: ``built-in`` (no file), ``code`` (made in code),
    ``explicit`` (``--config``, ``Fleet(config=PATH)``), ``env`` (``$CLONEFLEET_CONFIG``),
    ``project`` (``.clonefleet/config.yaml`` of the working directory) or ``global``. Only a
    project file can be untrusted: ``trusted`` says whether ``project_dir`` is in the trust
    records."""

    kind: Literal["built-in", "code", "explicit", "env", "project", "global"] = "code"
    path: str | None = None
    trusted: bool = True
    project_dir: str | None = None


class Config(BaseModel):
    """The whole validated configuration."""

    model_config = _STRICT
    version: Literal[1] = 1
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    model_groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    aliases: dict[str, str] = Field(default_factory=dict)
    limits: LimitsConfig = LimitsConfig()
    admission: AdmissionConfig = AdmissionConfig()
    """Fleet-wide admission against providers' rate limits (docs/rate-limits.md)."""
    discovery: DiscoveryConfig = DiscoveryConfig()
    durability: DurabilityConfig = DurabilityConfig()
    cluster: ClusterConfig = ClusterConfig()
    """How clone hosts ask the Ray cluster for room (docs/cluster.md, "Capacity")."""
    permissions: PermissionsConfig = PermissionsConfig()
    """Allow and deny rules for every clone and its subagents (docs/permissions.md)."""
    web: WebConfig = WebConfig()
    """The ``web_fetch`` and ``web_search`` tools; both off by default (``_web``)."""
    subagents: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Inline definitions: ``subagents.<name>`` beats every file of that name."""
    subagent_provider: Literal["spawn", "fork"] = "spawn"
    """How a spawning clone's ``subagent`` tool starts children when its definition does not say:
    ``spawn`` (a fresh context) or ``fork`` (inheriting its turns; docs/prompt-cache.md)."""
    mcp_servers: McpServers = Field(default_factory=dict)
    """MCP servers every clone may use, by name (``docs/mcp.md``); a project's file may not
    add or change one until its folder is trusted."""
    path: str | None = None
    """The file this config came from (``None`` for built-in defaults)."""
    _declared: frozenset[str] = PrivateAttr(default=frozenset())
    _source: ConfigSource = PrivateAttr(default=ConfigSource())
    _user_permissions: PermissionsConfig | None = PrivateAttr(default=None)
    """The user's own (global) config's ``permissions`` while a project's config is in use."""

    def permission_layers(self) -> tuple[RuleSet, ...]:
        """The config layers of every clone's policy, outermost first: the user's own config's
        rules when a project's config is in use (a project's config can only narrow them), then
        this config's."""
        own = self.permissions.rule_set()
        if self._user_permissions is None:
            return (own,)
        return (self._user_permissions.rule_set("your config"), own)

    @property
    def source(self) -> ConfigSource:
        """Where this config came from (set by :func:`load_config`)."""
        return self._source

    @property
    def declared_providers(self) -> frozenset[str]:
        """The providers the file itself names (the rest are built in)."""
        return self._declared

    @model_validator(mode="after")
    def _with_defaults(self) -> Config:
        self._declared = frozenset(self.providers)
        for name, entry in self.providers.items():
            if entry.base_url is not None:  # checked here, so a bad one never reaches Ray
                where = printable(self.path) if self.path else None
                check_base_url(entry.base_url, where, f"providers.{printable(name)}.base_url")
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
        for group in self.admission.fail_over_groups:
            if group not in groups:
                raise ValueError(
                    f"admission.fail_over_groups names unknown model group {group!r}; "
                    f"known: {', '.join(sorted(groups))}"
                )
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


def provider_route(entry: ProviderConfig) -> tuple[str, str | None] | None:
    """``(base_url, api_key_env)`` as the provider will use them (an ``anthropic`` provider's
    defaults filled in): where its requests go and which variable's key goes with them.
    ``None`` for a simulated provider, which reaches no network and reads no key."""
    if entry.kind == "simulated":
        return None
    if entry.kind == "anthropic":
        return entry.base_url or ANTHROPIC_BASE_URL, entry.api_key_env or ANTHROPIC_KEY_ENV
    return entry.base_url or "", entry.api_key_env or None


Price = tuple[float, float, float, float]
"""Dollars per token: plain input, output, input read from the prompt cache, input written to it."""


def price_per_token(config: Config, model: str | None) -> Price | None:
    """Dollars per token of ``model`` (a model key or alias), or ``None`` when the config does not
    know the model or gives it no ``price``. Cache reads and writes cost as plain input unless
    their own prices are set."""
    if model is None:
        return None
    try:
        _, entry, _ = config.resolve_model(model)
    except ConfigError:
        return None
    price = entry.price
    if price is None:
        return None
    plain = price.input_per_mtok / 1e6
    read = price.cached_input_per_mtok
    write = price.cache_write_per_mtok
    return (
        plain,
        price.output_per_mtok / 1e6,
        plain if read is None else read / 1e6,
        plain if write is None else write / 1e6,
    )


def token_cost(price: Price, tin: int, tout: int, read: int = 0, write: int = 0) -> float:
    """What ``tin`` input tokens (``read`` of them read from the prompt cache, ``write`` of them
    written to it) and ``tout`` output tokens cost at ``price``."""
    plain = max(tin - read - write, 0)
    return plain * price[0] + tout * price[1] + read * price[2] + write * price[3]


def usage_cost(config: Config, model: str | None, usage: Mapping[str, int]) -> float | None:
    """What ``usage`` (``input_tokens``, ``output_tokens``, ``cache_read_tokens``,
    ``cache_write_tokens``) on ``model`` cost in US dollars.

    ``model`` is a model key or alias, as a run record's ``model`` field names it. ``None`` when
    the model is unknown or has no ``price`` in config.
    """
    price = price_per_token(config, model)
    if price is None:
        return None
    return token_cost(
        price,
        usage.get("input_tokens", 0),
        usage.get("output_tokens", 0),
        usage.get("cache_read_tokens", 0),
        usage.get("cache_write_tokens", 0),
    )
