"""Simulation script files: per-clone steps, consumed one per request attempt; bad files name the key."""

from __future__ import annotations

import pytest

from clonefleet.errors import ConfigError, ModelBehaviorError, ModelHTTPError
from clonefleet.providers import ModelRequest, SimBrain, SimScript, SimulatedModel

pytestmark = pytest.mark.timeout(20)


def req(clone_index: int) -> ModelRequest:
    return ModelRequest(
        model="sim-small", messages=(), metadata={"batch_id": "b", "clone_index": clone_index}
    )


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"clones": {"three": []}}, "clones.three"),
        ({"clones": {-1: []}}, "clones.-1"),
        ({"default": [{"error": "503"}]}, "default.0.error"),
        ({"default": [{"error": 200}]}, "default.0.error"),
        ({"default": [{"hang": "yes"}]}, "default.0.hang"),
        ({"default": [{"args": ["x"]}]}, "default.0.args"),
        ({"default": [{"retry_after": True}]}, "default.0.retry_after"),
        ({"default": [{"tool": "exit_tool", "argz": {}}]}, "default.0"),
        ({"default": {"tool": "exit_tool"}}, "default"),
    ],
)
def test_bad_scripts_are_config_errors_naming_the_key(data, key):
    with pytest.raises(ConfigError) as info:
        SimScript.from_data(data, "s.yaml")
    assert info.value.key == key and info.value.path == "s.yaml"


async def test_steps_are_consumed_per_request_attempt_and_per_clone():
    script = SimScript.from_data(
        {
            "default": [{"text": "default answer"}],
            "clones": {
                1: [{"error": 503, "retry_after": 0.5}, {"malformed": True}, {"text": "one"}]
            },
        }
    )
    model = SimulatedModel(SimBrain(script=script))
    with pytest.raises(ModelHTTPError) as info:
        await model.request(req(1))
    assert (info.value.status, info.value.retry_after_s, info.value.retryable) == (503, 0.5, True)
    with pytest.raises(ModelBehaviorError):
        await model.request(req(1))
    assert (await model.request(req(1))).text == "one"
    assert (await model.request(req(1))).text == "script exhausted"
    assert (await model.request(req(0))).text == "default answer"
    assert (await model.request(req(7))).text == "default answer"
