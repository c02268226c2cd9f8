"""Record framing: what encode_record writes reads back, and no bytes make decode_records raise.

Hostile and broken inputs (torn tails at every cut, flipped bytes, huge lengths, deep nesting,
non-string keys, odd top levels, absurd claimed sizes, random bytes and mutations of a valid
journal) each end in a reported :class:`Damage` at the start of the bad record.
"""

from __future__ import annotations

import pickle
import struct
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clonefleet.errors import ClonefleetError, JournalError
from clonefleet.journal import Damage, Limits, decode_records, encode_record

pytestmark = pytest.mark.timeout(60)

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,  # nothing is written into the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

RECORDS = [
    {"t": "job", "id": "sa_12345678", "attempt": 1},
    {"t": "event", "text": "héllo ✓", "blob": b"\x00\xff", "cost": 0.25, "ok": True, "none": None},
    {"t": "nested", "detail": {"tags": ["a", "b"], "n": -(2**63)}, "big": 2**64 - 1},
]


def frame(payload: bytes, *, magic: bytes = b"CFJ1", length: int | None = None) -> bytes:
    """A frame around ``payload`` with a valid checksum (and a claimed length, if given)."""
    size = len(payload) if length is None else length
    return struct.pack(">4sII", magic, size, zlib.crc32(payload)) + payload


def journal_bytes(records=RECORDS) -> tuple[bytes, list[int]]:
    """The framed records and the offset at which each starts."""
    frames = [encode_record(r) for r in records]
    starts = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
    return b"".join(frames), starts


def test_records_round_trip_in_order():
    data, _ = journal_bytes()
    records, damage, end = decode_records(data)
    assert records == RECORDS
    assert damage is None
    assert end == len(data)


def test_frame_is_magic_length_checksum_then_msgpack():
    record = {"a": 1}
    payload = msgpack.packb(record, use_bin_type=True)
    assert encode_record(record) == frame(payload)


def test_tuples_come_back_as_lists():
    records, damage, _ = decode_records(encode_record({"pair": (1, (2, 3))}))
    assert records == [{"pair": [1, [2, 3]]}]
    assert damage is None


def test_empty_input_has_no_records_and_no_damage():
    assert decode_records(b"") == ([], None, 0)


def test_damage_reads_as_path_offset_reason():
    damage = Damage(path="/j/seg-00000001.cfj", offset=42, reason="checksum mismatch")
    assert str(damage) == "/j/seg-00000001.cfj: offset 42: checksum mismatch"


def test_journal_error_is_a_clonefleet_error_and_pickles():
    error = JournalError("disk full")
    clone = pickle.loads(pickle.dumps(error))
    assert isinstance(clone, ClonefleetError)
    assert str(clone) == "disk full"


def test_every_cut_of_the_last_record_is_a_torn_tail_at_its_start():
    data, starts = journal_bytes()
    last = starts[-1]
    for cut in range(last + 1, len(data)):
        records, damage, end = decode_records(data[:cut], path="seg")
        assert records == RECORDS[:-1], cut
        assert damage == Damage(path="seg", offset=last, reason=damage.reason), cut
        assert "torn tail" in damage.reason, cut
        assert end == last
    assert decode_records(data[:last]) == (RECORDS[:-1], None, last)


def test_torn_reason_says_how_many_bytes_were_needed_and_left():
    data = encode_record({"a": "x" * 100})
    _, damage, _ = decode_records(data[:40])
    assert damage is not None
    assert damage.reason == f"torn tail: record needs {len(data)} bytes, 40 left"


def test_a_flipped_payload_byte_is_a_checksum_mismatch():
    data, starts = journal_bytes()
    second = starts[1]
    for at in range(second + 12, starts[2]):
        broken = bytearray(data)
        broken[at] ^= 0x01
        records, damage, end = decode_records(bytes(broken))
        assert records == RECORDS[:1]
        assert damage is not None
        assert (damage.offset, damage.reason) == (second, "checksum mismatch")
        assert end == second


def test_a_flipped_magic_byte_is_bad_magic():
    data, starts = journal_bytes()
    broken = bytearray(data)
    broken[starts[2]] ^= 0xFF
    records, damage, _ = decode_records(bytes(broken))
    assert records == RECORDS[:2]
    assert damage is not None
    assert damage.offset == starts[2]
    assert damage.reason.startswith("bad magic")


def test_a_huge_claimed_length_is_refused_before_reading():
    data = encode_record({"a": 1}) + frame(b"", length=0xFFFFFFFF)
    records, damage, _ = decode_records(data)
    assert records == [{"a": 1}]
    assert damage is not None
    assert damage.reason == "record length 4294967295 exceeds limit 67108864"


def _packed_nesting(depth: int) -> bytes:
    """``{"a": [[[...]]]}`` with ``depth`` arrays, built as bytes (no Python recursion)."""
    return b"\x81\xa1a" + b"\x91" * (depth - 1) + b"\x90"


HOSTILE = {
    "100,000 nested arrays": (b"\x91" * 100_000 + b"\xc0", "nesting deeper than 64"),
    "nesting past the limit": (_packed_nesting(100), "nesting deeper than 64"),
    "an int map key": (b"\x81\x01\x02", "non-string map key"),
    "a nested int map key": (b"\x81\xa1a\x81\x01\x02", "non-string map key"),
    "a bytes map key": (b"\x81\xc4\x01k\x01", "non-string map key"),
    "an array top level": (msgpack.packb([1, 2]), "record is not a map"),
    "an int top level": (msgpack.packb(5), "record is not a map"),
    "a bin claiming 2**31 bytes": (b"\x81\xa1k\xc6\x80\x00\x00\x00" + b"x" * 10, "undecodable"),
    "a str claiming 2**32-1 bytes": (b"\x81\xa1k\xdb\xff\xff\xff\xff" + b"x" * 10, "undecodable"),
    "an array claiming 2**32-1 items": (b"\x81\xa1k\xdd\xff\xff\xff\xff", "undecodable"),
    "a map claiming 2**32-1 keys": (b"\xdf\xff\xff\xff\xff", "undecodable"),
    "invalid utf-8": (b"\x81\xa1k\xa2\xff\xfe", "undecodable"),
    "an ext type": (b"\x81\xa1k\xd4\x01\x02", "undecodable"),
    "a timestamp ext": (b"\x81\xa1k\xd6\xff\x00\x00\x00\x01", "undecodable"),
    "bytes after the map": (b"\x80\x01", "undecodable"),
    "an empty payload": (b"", "undecodable"),
    "a list as map key": (b"\x81\x91\x01\x02", "non-string map key"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_payload_is_damage_not_a_crash(name):
    payload, reason = HOSTILE[name]
    good = encode_record({"before": True})
    records, damage, end = decode_records(good + frame(payload) + good, path="p")
    assert records == [{"before": True}]
    assert damage is not None
    assert damage.offset == len(good) == end
    assert damage.reason.startswith(reason), damage.reason


def test_decode_applies_the_limits_it_is_given():
    data = encode_record({"s": "x" * 10, "l": [1] * 10})
    assert decode_records(data)[1] is None
    for limits in (Limits(max_str_len=5), Limits(max_array_len=5), Limits(max_map_len=1)):
        _, damage, _ = decode_records(data, limits=limits)
        assert damage is not None, limits
    _, damage, _ = decode_records(data, limits=Limits(max_record_bytes=10))
    assert damage is not None
    assert damage.reason.startswith("record length")


def test_nesting_at_the_limit_reads_and_one_more_level_does_not():
    limits = Limits(max_depth=5)
    assert decode_records(frame(_packed_nesting(4)), limits=limits)[1] is None
    _, damage, _ = decode_records(frame(_packed_nesting(5)), limits=limits)
    assert damage is not None
    assert damage.reason == "nesting deeper than 5"


def _nested(depth: int) -> dict:
    record: dict = {}
    inner = record
    for _ in range(depth - 1):
        inner["a"] = {}
        inner = inner["a"]
    return record


UNENCODABLE = {
    "a list": [1, 2],
    "an int key": {1: "x"},
    "a nested int key": {"a": {1: "x"}},
    "a bytes key": {b"k": 1},
    "an object": {"a": object()},
    "a huge int": {"a": 2**70},
    "too deep": _nested(65),
    "deep past msgpack's own limit": _nested(1000),
}


@pytest.mark.parametrize("name", UNENCODABLE)
def test_encode_refuses_what_cannot_be_read_back(name):
    with pytest.raises(JournalError, match="cannot journal this record"):
        encode_record(UNENCODABLE[name])


def test_encode_refuses_a_cycle_without_recursing_forever():
    cycle: dict = {"a": []}
    cycle["a"].append(cycle)
    with pytest.raises(JournalError, match="nesting deeper than 64"):
        encode_record(cycle)


def test_encode_accepts_nesting_at_the_limit():
    assert decode_records(encode_record(_nested(64)))[0] == [_nested(64)]


def test_encode_refuses_records_over_a_limit():
    with pytest.raises(JournalError, match="exceeds the limit of 10"):
        encode_record({"a": "x" * 20}, Limits(max_record_bytes=10))
    with pytest.raises(JournalError, match="cannot journal"):
        encode_record({"a": list(range(20))}, Limits(max_array_len=10))
    with pytest.raises(JournalError, match="cannot journal"):
        encode_record({"a": "é" * 10}, Limits(max_str_len=15))


# -- fuzzing --------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_records = st.dictionaries(st.text(max_size=8), _values, max_size=6)


@FUZZ
@given(st.lists(_records, max_size=5))
def test_any_encodable_record_reads_back_equal(records):
    data = b"".join(encode_record(r) for r in records)
    assert decode_records(data) == (records, None, len(data))


def _check_outcome(data: bytes) -> tuple[list, Damage | None, int]:
    records, damage, end = decode_records(data, path="fuzz")
    assert all(isinstance(r, dict) for r in records)
    if damage is None:
        assert end == len(data)
    else:
        assert damage.offset == end < len(data)
        assert damage.reason
    return records, damage, end


@FUZZ
@given(st.binary(max_size=2000))
def test_random_bytes_never_raise(data):
    _check_outcome(data)


@FUZZ
@given(st.binary(max_size=300))
def test_random_payload_with_a_valid_frame_never_raises(payload):
    records, damage, _ = _check_outcome(frame(payload))
    assert len(records) + (damage is not None) == 1


_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
    st.tuples(st.just("cut"), st.integers(min_value=0), st.just(0)),
    st.tuples(st.just("insert"), st.integers(min_value=0), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(min_value=0), st.integers(min_value=1, max_value=32)),
)


@FUZZ
@given(st.lists(_records, min_size=1, max_size=5), st.lists(_mutation, min_size=1, max_size=3))
def test_mutated_journal_keeps_every_record_before_the_first_change(records, mutations):
    frames = [encode_record(r) for r in records]
    data = bytearray(b"".join(frames))
    first_change = len(data)
    for kind, where, arg in mutations:
        at = where % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= arg
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = arg
        elif kind == "delete":
            del data[at : at + arg]
        first_change = min(first_change, at)
    decoded, _, _ = _check_outcome(bytes(data))
    intact, offset = 0, 0
    for f in frames:
        if offset + len(f) > first_change:
            break
        offset += len(f)
        intact += 1
    assert decoded[:intact] == records[:intact]
