"""Clones: the agent loop, its tools, model providers and the clone-host actor shell.

Importing this package does not import Ray; ``clonefleet.actors.remote`` holds the Ray shells.
"""

from ._exit import ExitDecision as ExitDecision
from ._exit import ExitJudge as ExitJudge
from ._exit import Outcome as Outcome
from ._exit import Verdict as Verdict
from ._exit import classify as classify
from ._failover import Candidate as Candidate
from ._failover import FailoverModel as FailoverModel
from ._host import HostCore as HostCore
from ._loop import BASE_PROMPT as BASE_PROMPT
from ._loop import Clone as Clone
from ._providers import ProviderPool as ProviderPool
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

__all__ = [
    "BASE_PROMPT", "BUILTIN_TOOLS", "CLAUDE_ALIASES", "Candidate", "Clone", "CloneSpec", "ExitDecision",
    "ExitJudge", "FailoverModel", "HostCore", "Message", "Model", "ModelRequest", "ModelResponse",
    "Outcome", "ProviderPool", "Role", "RunResult", "SimBrain", "SimScript", "SimStep", "SimulatedModel",
    "StopReason", "Tool", "ToolCall", "ToolContext", "ToolSpec", "Usage", "Verdict", "classify",
    "resolve_inside", "stop_error", "tool_from_function",
]
