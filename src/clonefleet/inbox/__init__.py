"""The inbox: messages to running clones, each a delivery with a durable state.

Importing this package does not import Ray; ``clonefleet.inbox.remote`` holds the Ray shell.
"""

from clonefleet.inbox._core import Delivery as Delivery
from clonefleet.inbox._core import InboxCore as InboxCore
from clonefleet.inbox._core import InboxLimits as InboxLimits

__all__ = [
    "Delivery",
    "InboxCore",
    "InboxLimits",
]
