"""Planning a batch: from (agent, prompt, count, options) to rendered clone specs and the
submission the scheduler starts, on the caller's machine or on a spawning clone's host; and what
the scheduler's new clone hosts ask the cluster for (:class:`Placement`).
"""

from clonefleet.planning._batch_plan import BatchPlan as BatchPlan
from clonefleet.planning._batch_plan import PlanOptions as PlanOptions
from clonefleet.planning._batch_plan import RowsPlan as RowsPlan
from clonefleet.planning._batch_plan import plan_batch as plan_batch
from clonefleet.planning._batch_plan import plan_rows as plan_rows
from clonefleet.planning._budget_check import check_batch_budget as check_batch_budget
from clonefleet.planning._clone_specs import BatchRequest as BatchRequest
from clonefleet.planning._clone_specs import RowFailure as RowFailure
from clonefleet.planning._clone_specs import check_count as check_count
from clonefleet.planning._clone_specs import check_rows as check_rows
from clonefleet.planning._clone_specs import clone_tools as clone_tools
from clonefleet.planning._clone_specs import plan_specs as plan_specs
from clonefleet.planning._clone_specs import resolve_tools as resolve_tools
from clonefleet.planning._clone_specs import shared_paragraphs as shared_paragraphs
from clonefleet.planning._nested import Fork as Fork
from clonefleet.planning._nested import NestedPlan as NestedPlan
from clonefleet.planning._nested import check_planned as check_planned
from clonefleet.planning._nested import child_request as child_request
from clonefleet.planning._nested import fork_of as fork_of
from clonefleet.planning._placement import NODE_GROUP_LABEL as NODE_GROUP_LABEL
from clonefleet.planning._placement import PENDING_NOTICE_S as PENDING_NOTICE_S
from clonefleet.planning._placement import Placement as Placement
from clonefleet.planning._placement import autoscaled as autoscaled
from clonefleet.planning._submission import BatchSubmission as BatchSubmission
from clonefleet.planning._submission import new_batch_id as new_batch_id
from clonefleet.planning._submission import new_job_id as new_job_id

__all__ = [
    "BatchPlan",
    "BatchRequest",
    "BatchSubmission",
    "Fork",
    "NODE_GROUP_LABEL",
    "NestedPlan",
    "PENDING_NOTICE_S",
    "Placement",
    "PlanOptions",
    "RowFailure",
    "RowsPlan",
    "autoscaled",
    "check_batch_budget",
    "check_count",
    "check_planned",
    "check_rows",
    "child_request",
    "fork_of",
    "clone_tools",
    "new_batch_id",
    "new_job_id",
    "plan_batch",
    "plan_rows",
    "plan_specs",
    "shared_paragraphs",
    "resolve_tools",
]
