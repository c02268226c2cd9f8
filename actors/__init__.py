"""Clones: the agent loop, its tools, model providers and the clone-host actor shell.

Importing this package does not import Ray; ``clonefleet.actors.remote`` holds the Ray shells.
The HTTP providers and the simulated server (``AnthropicModel``, ``HTTPProvider``, ``OpenAIModel``,
``build_provider``, ``make_client``, ``ensure_live_requests_allowed``,
``set_live_requests_allowed``, ``start_server``, ``serve_main``, ``SimServer``) are re-exported
too, but imported on first use: httpx and aiohttp cost ~0.2 s to import, which a command that
only reads definitions should not pay.
"""

from typing import Any

from ._exit import ExitDecision as ExitDecision
from ._exit import ExitJudge as ExitJudge
from ._exit import Outcome as Outcome
from ._exit import Verdict as Verdict
from ._exit import classify as classify
from ._failover import Candidate as Candidate
from ._failover import FailoverModel as FailoverModel
from ._failover import backoff_s as backoff_s
from ._host import HostCore as HostCore
from ._loop import BASE_PROMPT as BASE_PROMPT
from ._loop import Clone as Clone
from ._providers import ProviderPool as ProviderPool
from ._sandbox import open_inside as open_inside
from ._sim import SimBrain as SimBrain
from ._sim import SimScript as SimScript
from ._sim import SimStep as SimStep
from ._sim import SimulatedModel as SimulatedModel
from ._spec import CloneSpec as CloneSpec
from ._spec import RunResult as RunResult
from ._spec import StopReason as StopReason
from ._spec import stop_error as stop_error
from ._tools import BUILTIN_TOOLS as BUILTIN_TOOLS
from ._tools import CLAUDE_ALIASES as CLAUDE_ALIASES
from ._tools import Tool as Tool
from ._tools import ToolContext as ToolContext
from ._tools import resolve_inside as resolve_inside
from ._tools import tool_from_function as tool_from_function
from ._types import Message as Message
from ._types import Model as Model
from ._types import ModelRequest as ModelRequest
from ._types import ModelResponse as ModelResponse
from ._types import Role as Role
from ._types import ToolCall as ToolCall
from ._types import ToolSpec as ToolSpec
from ._types import Usage as Usage

_LAZY = {
    "AnthropicModel": "_http",
    "HTTPProvider": "_http",
    "OpenAIModel": "_http",
    "build_provider": "_http",
    "ensure_live_requests_allowed": "_http",
    "make_client": "_http",
    "set_live_requests_allowed": "_http",
    "SimServer": "_simserver",
    "serve_main": "_simserver",
    "start_server": "_simserver",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    *sorted(_LAZY),
    "BASE_PROMPT",
    "BUILTIN_TOOLS",
    "CLAUDE_ALIASES",
    "Candidate",
    "Clone",
    "CloneSpec",
    "ExitDecision",
    "ExitJudge",
    "FailoverModel",
    "HostCore",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Outcome",
    "ProviderPool",
    "Role",
    "RunResult",
    "SimBrain",
    "SimScript",
    "SimStep",
    "SimulatedModel",
    "StopReason",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolSpec",
    "Usage",
    "Verdict",
    "classify",
    "backoff_s",
    "open_inside",
    "resolve_inside",
    "stop_error",
    "tool_from_function",
]
