"""The scheduler: job table, job control, the pool of slots and the event log.

Importing this package does not import Ray; ``clonefleet.scheduler.remote`` holds the actor.
"""

from clonefleet.scheduler._core import SchedulerCore as SchedulerCore
from clonefleet.scheduler._durable import Durable as Durable
from clonefleet.scheduler._durable import read_table as read_table
from clonefleet.scheduler._hosts import choose_clones_per_actor as choose_clones_per_actor
from clonefleet.scheduler._offline import JournalView as JournalView
from clonefleet.scheduler._offline import journal_folder as journal_folder
from clonefleet.scheduler._recovery import evict_expired as evict_expired
from clonefleet.scheduler._state import TERMINAL as TERMINAL
from clonefleet.scheduler._state import TRANSITIONS as TRANSITIONS
from clonefleet.scheduler._state import JobRecord as JobRecord
from clonefleet.scheduler._state import display_name as display_name

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Durable",
    "JobRecord",
    "JournalView",
    "SchedulerCore",
    "read_table",
    "choose_clones_per_actor",
    "display_name",
    "evict_expired",
    "journal_folder",
]
