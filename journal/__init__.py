"""The append-only journal: framed msgpack records on disk, group commit, replay, compaction.

Standard library and msgpack only; it knows nothing of jobs (the scheduler decides what records
mean). See docs/durability.md.
"""
