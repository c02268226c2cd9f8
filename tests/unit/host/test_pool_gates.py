"""ProviderPool: which admission scopes each candidate's requests pass (docs/rate-limits.md)."""

from __future__ import annotations

from typing import Any

import pytest

from clonefleet.admission import HostGates, Limits
from clonefleet.config import Config
from clonefleet.host import ProviderPool

pytestmark = pytest.mark.timeout(30)

URL = "http://127.0.0.1:9/v1"


def config(**sections: Any) -> Config:
    data: dict[str, Any] = {
        "providers": {
            "real": {"kind": "openai", "base_url": URL},
            "capped": {"kind": "openai", "base_url": URL, "rpm": 600, "max_in_flight": 50},
            "sim": {"kind": "simulated"},
            "sim-limited": {"kind": "simulated", "simulated": {"rpm": 120}},
        },
        "models": {
            "a": {"provider": "real", "name": "wire-a"},
            "b": {"provider": "capped", "name": "wire-b", "tpm": 9000},
            "c": {"provider": "capped", "name": "wire-c"},
            "s": {"provider": "sim", "name": "sim-s"},
            "sc": {"provider": "sim", "name": "sim-sc", "max_in_flight": 4},
            "sl": {"provider": "sim-limited", "name": "sim-sl"},
        },
    }
    data.update(sections)
    return Config(**data)


async def test_a_real_provider_s_model_gets_a_learning_scope_of_its_own() -> None:
    gates = HostGates("h", None)
    pool = ProviderPool(config(admission={"initial_in_flight": 8, "max_wait_s": 30}), gates=gates)
    gate = pool.candidate("a").gate
    assert gate is not None and gate.max_wait_s == 30 and gate.gates is gates
    (scope,) = gate.scopes
    assert (scope.name, scope.provider, scope.model) == (f"real@{URL}/wire-a", "real", "wire-a")
    assert scope.limits == Limits() and scope.learn and scope.probe == 8
    await pool.aclose()


async def test_a_provider_with_limits_adds_its_scope_first_shared_by_its_models() -> None:
    gates = HostGates("h", None)
    pool = ProviderPool(config(), gates=gates)
    gate_b, gate_c = pool.candidate("b").gate, pool.candidate("c").gate
    assert gate_b is not None and gate_c is not None
    provider, model = gate_b.scopes
    assert provider.name == f"capped@{URL}" and provider.model is None and not provider.learn
    assert provider.limits == Limits(rpm=600, max_in_flight=50)
    assert model.name == f"capped@{URL}/wire-b" and model.limits == Limits(tpm=9000)
    assert gate_c.scopes[0] is provider and gate_c.scopes[1] is not model
    assert pool.candidate("b").gate is gate_b  # one gate per model, made once
    await pool.aclose()


async def test_a_simulated_provider_that_refuses_nothing_needs_no_gate() -> None:
    pool = ProviderPool(config(), gates=HostGates("h", None))
    assert pool.candidate("s").gate is None
    configured = pool.candidate("sc").gate  # unless the config limits the model
    assert configured is not None and not configured.scopes[0].learn
    assert configured.scopes[0].limits == Limits(max_in_flight=4)
    assert configured.scopes[0].name == "sim@in-process/sim-sc"
    limited = pool.candidate("sl").gate  # or the simulated provider has limits to learn
    assert limited is not None and limited.scopes[0].learn
    await pool.aclose()


async def test_without_learning_only_configured_limits_make_a_gate() -> None:
    pool = ProviderPool(config(admission={"learn": False}), gates=HostGates("h", None))
    assert pool.candidate("a").gate is None and pool.candidate("sl").gate is None
    gate = pool.candidate("b").gate
    assert gate is not None and not any(scope.learn for scope in gate.scopes)
    await pool.aclose()


async def test_a_pool_without_gates_gives_no_candidate_a_gate() -> None:
    pool = ProviderPool(config())
    assert all(pool.candidate(key).gate is None for key in ("a", "b", "s", "sl"))
    await pool.aclose()
