"""The append-only journal: framed msgpack records on disk, group commit, replay, compaction.

Standard library and msgpack only; it knows nothing of jobs (the scheduler decides what records
mean). See docs/durability.md.
"""

from ._files import Replay as Replay
from ._files import read_journal as read_journal
from ._frame import Damage as Damage
from ._frame import Limits as Limits
from ._frame import decode_records as decode_records
from ._frame import encode_record as encode_record
from ._writer import Journal as Journal

__all__ = [
    "Damage",
    "Journal",
    "Limits",
    "Replay",
    "decode_records",
    "encode_record",
    "read_journal",
]
