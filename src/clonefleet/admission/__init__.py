"""Fleet-wide admission of model requests against providers' rate limits (docs/rate-limits.md).

A pure limiter (:class:`AdmissionCore`: scopes, buckets, limits from config, headers and
refusals), the gates a clone host's clones pass before each request (:class:`HostGates`), and,
in ``remote.py``, the Ray actor that holds the one limiter of a cluster.
"""

from __future__ import annotations

from clonefleet.admission._bucket import Meter as Meter
from clonefleet.admission._bucket import RateBucket as RateBucket
from clonefleet.admission._core import AdmissionCore as AdmissionCore
from clonefleet.admission._gate import HostGates as HostGates
from clonefleet.admission._gate import HostScope as HostScope
from clonefleet.admission._gate import SyncSource as SyncSource
from clonefleet.admission._gate import Ticket as Ticket
from clonefleet.admission._request import CandidateGate as CandidateGate
from clonefleet.admission._request import announced_from as announced_from
from clonefleet.admission._request import estimate_tokens as estimate_tokens
from clonefleet.admission._scope import OPEN_WINDOW as OPEN_WINDOW
from clonefleet.admission._scope import Announced as Announced
from clonefleet.admission._scope import Demand as Demand
from clonefleet.admission._scope import Grant as Grant
from clonefleet.admission._scope import Limits as Limits

__all__ = [
    "AdmissionCore",
    "announced_from",
    "Announced",
    "CandidateGate",
    "Demand",
    "estimate_tokens",
    "Grant",
    "HostGates",
    "HostScope",
    "Limits",
    "Meter",
    "OPEN_WINDOW",
    "RateBucket",
    "SyncSource",
    "Ticket",
]
