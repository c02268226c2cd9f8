"""Every public error survives a pickle round trip with its fields (Ray pickles errors)."""

from __future__ import annotations

import inspect
import pickle

import pytest

from clonefleet import errors

SAMPLES = [
    errors.ClonefleetError("boom"),
    errors.UsageError("bad argument"),
    errors.UnknownJobError("sa_12345678"),
    errors.IdCollision("sa_12345678"),
    errors.DefinitionError(
        "tools_deny may not contain exit_tool", "invalid-definition", "/x/a.md", "tools_deny"
    ),
    errors.TemplateError("undefined name 'x'", "render-error", "/x/a.md", "body"),
    errors.ConfigError("bad key", "/x/config.yaml", "providers.local"),
    errors.ModelError("provider failed"),
    errors.ModelHTTPError(429, "slow down", 1.5, False),
    errors.ModelTimeout("deadline passed"),
    errors.CapacityTimeout("no capacity within 900s"),
    errors.ModelBehaviorError("not json"),
    errors.AllModelsFailed({"a": "HTTP 503", "b": "timeout"}),
    errors.ClusterError("no ray"),
    errors.JournalError("journal folder /x is held by another writer"),
    errors.SchedulerUnavailable("ActorUnavailableError"),
]


def test_samples_cover_every_public_error_class():
    public = {
        obj
        for name in errors.__all__
        if inspect.isclass(obj := getattr(errors, name)) and issubclass(obj, errors.ClonefleetError)
    }
    assert public == {type(e) for e in SAMPLES}


@pytest.mark.parametrize("error", SAMPLES, ids=lambda e: type(e).__name__)
def test_error_round_trips_through_pickle(error):
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error)
    assert str(clone) == str(error)
    assert vars(clone) == vars(error)
    assert isinstance(clone, errors.ClonefleetError)


def test_http_error_retryability_follows_status():
    assert errors.ModelHTTPError(503).retryable
    assert errors.ModelHTTPError(429, retry_after_s=2).retryable
    assert not errors.ModelHTTPError(429, spend_cap=True).retryable
    assert not errors.ModelHTTPError(401).retryable
    assert not errors.ModelHTTPError(400).retryable
