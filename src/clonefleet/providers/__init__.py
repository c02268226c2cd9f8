"""Model providers: the model protocol, the real HTTP providers and the simulated model.

One protocol, :class:`Model` (a :class:`ModelRequest` in, a :class:`ModelResponse` out), and its
implementations: :class:`OpenAIModel` and :class:`AnthropicModel` over a shared
:class:`HTTPProvider`, and :class:`SimulatedModel`, which the same :class:`SimBrain` also serves
over HTTP (``clonefleet provider serve``). Retrying and failing over are not here: the clone's
failover model in :mod:`clonefleet.clone` does that from the errors raised here.

The HTTP parts (httpx, aiohttp: about 0.2 s to import) load on first use, so a command that only
reads definitions does not pay for them. See ``docs/architecture.md``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from clonefleet.providers._identity_cache import IdentityCache as IdentityCache
from clonefleet.providers._protocol import Message as Message
from clonefleet.providers._protocol import Model as Model
from clonefleet.providers._protocol import ModelRequest as ModelRequest
from clonefleet.providers._protocol import ModelResponse as ModelResponse
from clonefleet.providers._protocol import Role as Role
from clonefleet.providers._protocol import ToolCall as ToolCall
from clonefleet.providers._protocol import ToolSpec as ToolSpec
from clonefleet.providers._protocol import Usage as Usage
from clonefleet.providers._rate_headers import MAX_RETRY_AFTER_S as MAX_RETRY_AFTER_S
from clonefleet.providers._rate_headers import AdaptiveRate as AdaptiveRate
from clonefleet.providers._rate_headers import LimitReport as LimitReport
from clonefleet.providers._rate_headers import LimitWindow as LimitWindow
from clonefleet.providers._rate_headers import RateLimitKind as RateLimitKind
from clonefleet.providers._rate_headers import is_rate_limited as is_rate_limited
from clonefleet.providers._rate_headers import rate_limit_kind as rate_limit_kind
from clonefleet.providers._rate_headers import read_limits as read_limits
from clonefleet.providers._rate_headers import retry_after_s as retry_after_s
from clonefleet.providers.sim._limits import SimLimits as SimLimits
from clonefleet.providers.sim._model import SimBrain as SimBrain
from clonefleet.providers.sim._model import SimScript as SimScript
from clonefleet.providers.sim._model import SimStep as SimStep
from clonefleet.providers.sim._model import SimulatedModel as SimulatedModel

if TYPE_CHECKING:
    from clonefleet.providers._anthropic import AnthropicModel as AnthropicModel
    from clonefleet.providers._anthropic import anthropic_payload as anthropic_payload
    from clonefleet.providers._anthropic import anthropic_response as anthropic_response
    from clonefleet.providers._config import build_provider as build_provider
    from clonefleet.providers._guard import BLOCK_LIVE_ENV as BLOCK_LIVE_ENV
    from clonefleet.providers._guard import (
        ensure_live_requests_allowed as ensure_live_requests_allowed,
    )
    from clonefleet.providers._guard import is_loopback_url as is_loopback_url
    from clonefleet.providers._guard import live_requests_allowed as live_requests_allowed
    from clonefleet.providers._guard import set_live_requests_allowed as set_live_requests_allowed
    from clonefleet.providers._openai import OpenAIModel as OpenAIModel
    from clonefleet.providers._openai import openai_payload as openai_payload
    from clonefleet.providers._openai import openai_response as openai_response
    from clonefleet.providers._transport import HTTPProvider as HTTPProvider
    from clonefleet.providers._transport import error_type as error_type
    from clonefleet.providers._transport import make_client as make_client
    from clonefleet.providers.sim._server import SIM_SERVER as SIM_SERVER
    from clonefleet.providers.sim._server import SimServer as SimServer
    from clonefleet.providers.sim._server import serve_main as serve_main
    from clonefleet.providers.sim._server import start_server as start_server

_LAZY = {
    "AnthropicModel": "_anthropic",
    "anthropic_payload": "_anthropic",
    "anthropic_response": "_anthropic",
    "build_provider": "_config",
    "BLOCK_LIVE_ENV": "_guard",
    "ensure_live_requests_allowed": "_guard",
    "is_loopback_url": "_guard",
    "live_requests_allowed": "_guard",
    "set_live_requests_allowed": "_guard",
    "OpenAIModel": "_openai",
    "openai_payload": "_openai",
    "openai_response": "_openai",
    "SIM_SERVER": "sim._server",
    "SimServer": "sim._server",
    "serve_main": "sim._server",
    "start_server": "sim._server",
    "HTTPProvider": "_transport",
    "error_type": "_transport",
    "make_client": "_transport",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def preload() -> None:
    """Import the HTTP providers now (a warming clone host calls this before its first batch)."""
    for module in set(_LAZY.values()):
        import_module(f"{__name__}.{module}")


__all__ = [
    "AdaptiveRate",
    "anthropic_payload",
    "anthropic_response",
    "AnthropicModel",
    "BLOCK_LIVE_ENV",
    "build_provider",
    "ensure_live_requests_allowed",
    "error_type",
    "HTTPProvider",
    "IdentityCache",
    "is_loopback_url",
    "is_rate_limited",
    "LimitReport",
    "LimitWindow",
    "live_requests_allowed",
    "make_client",
    "MAX_RETRY_AFTER_S",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "openai_payload",
    "openai_response",
    "OpenAIModel",
    "preload",
    "rate_limit_kind",
    "RateLimitKind",
    "read_limits",
    "retry_after_s",
    "Role",
    "serve_main",
    "set_live_requests_allowed",
    "SIM_SERVER",
    "SimBrain",
    "SimLimits",
    "SimScript",
    "SimServer",
    "SimStep",
    "SimulatedModel",
    "start_server",
    "ToolCall",
    "ToolSpec",
    "Usage",
]
