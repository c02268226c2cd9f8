"""Feeding rows into one growing batch: a definition mapped over a dataset (docs/inputs.md).

Pure: no Ray. :class:`Feeder` reads rows one slice at a time, plans each slice through a
planner the caller gives, submits the first as an open batch and adds the rest as parts while
the earlier ones run, keeping a bounded number of rows submitted but not ended (as few as keep
the rate of ends at its highest, with :class:`InFlight`), and yields each
row's run record as its job ends. A row that cannot be read, has a key seen before or fails to
render fails alone, with a record that says why, without running.
"""

from clonefleet.feed._feeder import DEFAULT_AHEAD as DEFAULT_AHEAD
from clonefleet.feed._feeder import Ended as Ended
from clonefleet.feed._feeder import FeedClient as FeedClient
from clonefleet.feed._feeder import Feeder as Feeder
from clonefleet.feed._feeder import Part as Part
from clonefleet.feed._feeder import Planner as Planner
from clonefleet.feed._feeder import ahead_for as ahead_for
from clonefleet.feed._feeder import failed_record as failed_record
from clonefleet.feed._feeder import slice_for as slice_for
from clonefleet.feed._inflight import InFlight as InFlight
from clonefleet.feed._inflight import Limiter as Limiter
from clonefleet.feed._inflight import Span as Span
from clonefleet.feed._inputs_run import InputsRequest as InputsRequest
from clonefleet.feed._inputs_run import InputsRun as InputsRun
from clonefleet.feed._resume import Adopted as Adopted
from clonefleet.feed._resume import LedgerEntry as LedgerEntry
from clonefleet.feed._resume import RunLedger as RunLedger
from clonefleet.feed._resume import adopt as adopt
from clonefleet.feed._resume import run_fingerprint as run_fingerprint
from clonefleet.feed._seen_keys import SeenKeys as SeenKeys

__all__ = [
    "DEFAULT_AHEAD",
    "Adopted",
    "Ended",
    "FeedClient",
    "Feeder",
    "InFlight",
    "InputsRequest",
    "InputsRun",
    "LedgerEntry",
    "Limiter",
    "Part",
    "Planner",
    "RunLedger",
    "SeenKeys",
    "Span",
    "adopt",
    "ahead_for",
    "failed_record",
    "run_fingerprint",
    "slice_for",
]
