"""Clones: the agent loop, its tools, the exit judge, failover and the clone-host core.

Importing this package does not import Ray; ``clonefleet.actors.remote`` holds the Ray shells.
Model providers (the model protocol, HTTP providers, the simulated model) live in
:mod:`clonefleet.providers`. See ``docs/architecture.md``.
"""

from ._checkpoint import state_of as state_of
from ._exit import ExitDecision as ExitDecision
from ._exit import ExitJudge as ExitJudge
from ._exit import Verdict as Verdict
from ._exit import classify as classify
from ._exit import schema_errors as schema_errors
from ._failover import Candidate as Candidate
from ._failover import FailoverModel as FailoverModel
from ._failover import backoff_s as backoff_s
from ._host import HostCore as HostCore
from ._inbox import Delivery as Delivery
from ._inbox import InboxCore as InboxCore
from ._inbox import InboxLimits as InboxLimits
from ._jobtools import job_tools as job_tools
from ._loop import BASE_PROMPT as BASE_PROMPT
from ._loop import Clone as Clone
from ._providers import ProviderPool as ProviderPool
from ._sandbox import open_checked as open_checked
from ._sandbox import open_inside as open_inside
from ._spec import CloneSpec as CloneSpec
from ._spec import RunResult as RunResult
from ._tools import WORK_TOOL_TABLE as WORK_TOOL_TABLE
from ._tools import Tool as Tool
from ._tools import ToolContext as ToolContext
from ._tools import resolve_inside as resolve_inside
from ._tools import tool_from_function as tool_from_function
from ._webtools import WebAccess as WebAccess

__all__ = [
    "state_of",
    "Delivery",
    "InboxCore",
    "InboxLimits",
    "job_tools",
    "open_checked",
    "schema_errors",
    "BASE_PROMPT",
    "Candidate",
    "Clone",
    "CloneSpec",
    "ExitDecision",
    "ExitJudge",
    "FailoverModel",
    "HostCore",
    "ProviderPool",
    "RunResult",
    "Tool",
    "WORK_TOOL_TABLE",
    "ToolContext",
    "Verdict",
    "backoff_s",
    "classify",
    "open_inside",
    "resolve_inside",
    "tool_from_function",
    "WebAccess",
]
