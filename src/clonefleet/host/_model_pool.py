"""Provider pool: one live model client per provider per process, and per-clone failover models.

A clone host builds one :class:`ProviderPool` and shares it across every clone it hosts, so a
thousand clones share one HTTP connection pool instead of opening a thousand. It also holds the
clones' way to the web (:attr:`ProviderPool.web`), for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable

from clonefleet.admission import CandidateGate, HostGates, Limits
from clonefleet.clone import (
    Candidate,
    CloneSpec,
    FailoverModel,
    OnFailover,
    OnRateLimited,
    WebAccess,
)
from clonefleet.config import Config, ModelConfig, ProviderConfig
from clonefleet.providers import Model, SimBrain, SimScript, SimulatedModel

__all__ = ["ProviderPool", "is_gated"]


def is_gated(config: Config) -> bool:
    """Whether any model of ``config`` passes admission (so its batch needs the limiter)."""
    for name in config.models:
        _, model, provider = config.resolve_model(name)
        sim = provider.simulated
        refuses = provider.kind != "simulated" or bool(sim.rpm or sim.tpm or sim.rate_429)
        limited = any(
            v is not None
            for v in (model.rpm, model.tpm, model.max_in_flight, provider.rpm, provider.tpm)
        )
        if (config.admission.learn and refuses) or limited or provider.max_in_flight:
            return True
    return False


class ProviderPool:
    """Builds and caches provider clients for one process; close with :meth:`aclose`."""

    def __init__(
        self,
        config: Config,
        *,
        sim_script: SimScript | None = None,
        gates: HostGates | None = None,
    ) -> None:
        self.config = config
        self.sim_script = sim_script
        self.gates = gates
        """The host's admission gates (``None``: requests go at once)."""
        self._gates: dict[str, CandidateGate | None] = {}
        self._models: dict[str, Model] = {}
        self._closers: list[Callable[[], object]] = []
        self._web: WebAccess | None = None

    @property
    def web(self) -> WebAccess | None:
        """The config's ``web`` section and its shared HTTP client for the clones' web tools;
        ``None`` while the config turns on neither tool."""
        web = self.config.web
        if self._web is None and (web.fetch_enabled or web.search_enabled):
            self._web = WebAccess(web)
        return self._web

    def provider_model(self, provider_name: str) -> Model:
        """The shared :class:`Model` for a provider entry of the config."""
        model = self._models.get(provider_name)
        if model is None:
            model = self._build(provider_name, self.config.providers[provider_name])
            self._models[provider_name] = model
        return model

    def _build(self, name: str, cfg: ProviderConfig) -> Model:
        if cfg.kind == "simulated":
            opts = cfg.simulated
            script = self.sim_script or (SimScript.load(opts.script) if opts.script else None)
            brain = SimBrain(
                script=script, seed=opts.seed, fail_rate=opts.fail_rate, rate_429=opts.rate_429
            )
            return SimulatedModel(
                brain,
                latency_ms=opts.latency_ms,
                rpm=opts.rpm,
                tpm=opts.tpm,
                burst=opts.burst,
                limit_headers=opts.limit_headers,
                cache_ttl_s=opts.cache_ttl_s,
                cache_min_tokens=opts.cache_min_tokens,
            )
        from clonefleet.providers import build_provider

        model, closer = build_provider(name, cfg, config_path=self.config.path)
        self._closers.append(closer)
        return model

    def candidate(self, key: str) -> Candidate:
        model_key, model_cfg, provider_cfg = self.config.resolve_model(key)
        if model_key not in self._gates:
            self._gates[model_key] = self._gate(model_cfg, provider_cfg)
        return Candidate(
            key=model_key,
            wire_name=model_cfg.name,
            model=self.provider_model(model_cfg.provider),
            provider=model_cfg.provider,
            max_retries=provider_cfg.max_retries,
            timeout_s=provider_cfg.timeout_s,
            gate=self._gates[model_key],
            max_tokens=model_cfg.max_tokens,
        )

    def _gate(self, model: ModelConfig, provider: ProviderConfig) -> CandidateGate | None:
        """The scopes a model's requests pass (docs/rate-limits.md): its provider's when that
        has limits configured, then the model's own. ``None`` when nothing can limit them: an
        in-process simulated provider that refuses nothing and no configured limit."""
        if self.gates is None:
            return None
        admission = self.config.admission
        sim = provider.simulated
        refuses = provider.kind != "simulated" or bool(sim.rpm or sim.tpm or sim.rate_429)
        own = Limits(model.rpm, model.tpm, model.max_in_flight)
        shared = Limits(provider.rpm, provider.tpm, provider.max_in_flight)
        learn = admission.learn and refuses
        if not (learn or own.any or shared.any):
            return None
        where = f"{model.provider}@{provider.base_url or 'in-process'}"
        probe = admission.initial_in_flight
        scopes = [
            self.gates.scope(f"{where}/{model.name}", model.provider, model.name, own, learn, probe)
        ]
        if shared.any:
            scopes.insert(0, self.gates.scope(where, model.provider, None, shared, False, probe))
        return CandidateGate(self.gates, tuple(scopes), admission.max_wait_s)

    def failover_for(
        self,
        spec: CloneSpec,
        on_failover: OnFailover | None = None,
        on_rate_limited: OnRateLimited | None = None,
    ) -> FailoverModel:
        """The clone's own failover model, its cursor at ``spec.start``."""
        return FailoverModel(
            [self.candidate(k) for k in spec.candidates],
            start=spec.start,
            fallbacks=[self.candidate(k) for k in spec.fallbacks],
            on_failover=on_failover,
            fail_over_on_rate_limit=spec.fail_over_on_rate_limit,
            on_rate_limited=on_rate_limited,
        )

    async def aclose(self) -> None:
        """Close every client this pool opened; closing twice is harmless."""
        closers, self._closers = self._closers, []
        web, self._web = self._web, None
        if web is not None:
            closers.append(web.aclose)
        for close in closers:
            result = close()
            if hasattr(result, "__await__"):
                await result
        self._models.clear()
