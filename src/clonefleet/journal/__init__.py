"""The append-only journal: framed msgpack records on disk, group commit, replay, compaction.

Standard library and msgpack only; it knows nothing of jobs (the scheduler decides what records
mean). See docs/durability.md.
"""

from clonefleet.journal._files import Replay as Replay
from clonefleet.journal._files import read_journal as read_journal
from clonefleet.journal._frame import Damage as Damage
from clonefleet.journal._frame import Limits as Limits
from clonefleet.journal._frame import decode_records as decode_records
from clonefleet.journal._frame import encode_record as encode_record
from clonefleet.journal._writer import Journal as Journal

__all__ = [
    "Damage",
    "Journal",
    "Limits",
    "Replay",
    "decode_records",
    "encode_record",
    "read_journal",
]
