"""Clones: the agent loop, its tools, the exit judge and failover.

Importing this package does not import Ray; ``clonefleet.host.remote`` holds the Ray shells.
Model providers (the model protocol, HTTP providers, the simulated model) live in
:mod:`clonefleet.providers`. See ``docs/architecture.md``.
"""

from clonefleet.clone._checkpoint import message_from_json as message_from_json
from clonefleet.clone._checkpoint import pack_state as pack_state
from clonefleet.clone._checkpoint import state_of as state_of
from clonefleet.clone._clone_spec import CloneSpec as CloneSpec
from clonefleet.clone._clone_spec import RunResult as RunResult
from clonefleet.clone._failover import Candidate as Candidate
from clonefleet.clone._failover import FailoverModel as FailoverModel
from clonefleet.clone._failover import OnFailover as OnFailover
from clonefleet.clone._failover import OnRateLimited as OnRateLimited
from clonefleet.clone._failover import backoff_s as backoff_s
from clonefleet.clone._loop import BASE_PROMPT as BASE_PROMPT
from clonefleet.clone._loop import Clone as Clone
from clonefleet.clone.exit._judge import ExitDecision as ExitDecision
from clonefleet.clone.exit._judge import ExitJudge as ExitJudge
from clonefleet.clone.exit._judge import Verdict as Verdict
from clonefleet.clone.exit._judge import classify as classify
from clonefleet.clone.exit._judge import schema_errors as schema_errors
from clonefleet.clone.mcp._manager import McpManager as McpManager
from clonefleet.clone.tools._confine import open_checked as open_checked
from clonefleet.clone.tools._confine import open_inside as open_inside
from clonefleet.clone.tools._jobs import FORK_DESCRIPTION as FORK_DESCRIPTION
from clonefleet.clone.tools._jobs import TOOL_METHODS as TOOL_METHODS
from clonefleet.clone.tools._jobs import job_tools as job_tools
from clonefleet.clone.tools._table import WORK_TOOL_TABLE as WORK_TOOL_TABLE
from clonefleet.clone.tools._table import Tool as Tool
from clonefleet.clone.tools._table import ToolContext as ToolContext
from clonefleet.clone.tools._table import resolve_inside as resolve_inside
from clonefleet.clone.tools._table import tool_from_function as tool_from_function
from clonefleet.clone.tools._web_access import WebAccess as WebAccess

__all__ = [
    "message_from_json",
    "pack_state",
    "OnFailover",
    "OnRateLimited",
    "McpManager",
    "state_of",
    "job_tools",
    "TOOL_METHODS",
    "FORK_DESCRIPTION",
    "open_checked",
    "schema_errors",
    "BASE_PROMPT",
    "Candidate",
    "Clone",
    "CloneSpec",
    "ExitDecision",
    "ExitJudge",
    "FailoverModel",
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
