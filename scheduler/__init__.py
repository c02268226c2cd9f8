"""The scheduler: job table, job control, the pool of slots and the event log.

Importing this package does not import Ray; ``clonefleet.scheduler.remote`` holds the actor.
"""

from ._batch import BatchRequest as BatchRequest
from ._batch import check_count as check_count
from ._batch import clone_tools as clone_tools
from ._batch import plan_specs as plan_specs
from ._batch import resolve_tools as resolve_tools
from ._core import SchedulerCore as SchedulerCore
from ._durable import Durable as Durable
from ._durable import read_table as read_table
from ._hosts import HostFactory as HostFactory
from ._hosts import HostLike as HostLike
from ._hosts import choose_clones_per_actor as choose_clones_per_actor
from ._offline import JournalView as JournalView
from ._offline import journal_folder as journal_folder
from ._recovery import evict_expired as evict_expired
from ._state import TERMINAL as TERMINAL
from ._state import TRANSITIONS as TRANSITIONS
from ._state import BatchSubmission as BatchSubmission
from ._state import JobRecord as JobRecord
from ._state import display_name as display_name
from ._state import new_batch_id as new_batch_id
from ._state import new_job_id as new_job_id

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "BatchRequest",
    "BatchSubmission",
    "Durable",
    "HostFactory",
    "HostLike",
    "JobRecord",
    "JournalView",
    "SchedulerCore",
    "read_table",
    "check_count",
    "clone_tools",
    "choose_clones_per_actor",
    "display_name",
    "evict_expired",
    "journal_folder",
    "new_batch_id",
    "new_job_id",
    "plan_specs",
    "resolve_tools",
]
