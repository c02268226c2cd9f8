"""The journal writer on a real folder: group commit, reopen and repair, compaction, rotation,
write errors, permissions and lifecycle.

Failures are injected through the writer's own seams (``_write``, ``_fsync``) in small
subclasses; ``os`` is never patched.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat

import pytest

from clonefleet.errors import JournalError, UsageError
from clonefleet.journal import Damage, Journal, Replay, encode_record, read_journal

pytestmark = pytest.mark.timeout(30)


def names(folder) -> set[str]:
    return set(os.listdir(folder))


def disk_bytes(folder) -> int:
    return sum(
        os.path.getsize(os.path.join(folder, n)) for n in names(folder) if n.endswith(".cfj")
    )


def segment_sizes(folder) -> list[int]:
    segments = sorted(n for n in names(folder) if n.startswith("seg-"))
    return [os.path.getsize(os.path.join(folder, n)) for n in segments]


def write_file(path, records) -> None:
    with open(path, "wb") as file:
        file.write(b"".join(encode_record(r) for r in records))


async def test_appended_records_are_replayed_in_order_after_commit(tmp_path):
    journal, replay = Journal.open(tmp_path / "j")
    assert replay == Replay()
    seqs = [journal.append({"i": i}) for i in range(5)]
    assert seqs == sorted(set(seqs))
    await journal.commit()
    assert read_journal(tmp_path / "j").records == [{"i": i} for i in range(5)]
    await journal.aclose()


async def test_concurrent_commits_share_one_fsync(tmp_path):
    journal = Journal(tmp_path)
    for i in range(100):
        journal.append({"i": i})
    await asyncio.gather(*(journal.commit() for _ in range(100)))
    assert journal.fsyncs == 1
    await journal.aclose()


async def test_appends_and_commits_from_many_tasks_share_groups(tmp_path):
    journal = Journal(tmp_path)

    async def one(i: int) -> None:
        journal.append({"i": i})
        await journal.commit()

    await asyncio.gather(*(one(i) for i in range(200)))
    # The first caller's group may start before the others append; every later one shares one.
    assert journal.fsyncs <= 2
    assert sorted(r["i"] for r in read_journal(tmp_path).records) == list(range(200))
    await journal.aclose()


async def test_commit_with_nothing_pending_does_no_io(tmp_path):
    journal = Journal(tmp_path)
    await journal.commit()
    assert journal.fsyncs == 0
    assert names(tmp_path) == set()
    await journal.aclose()


async def test_a_cancelled_committer_does_not_cancel_the_group(tmp_path):
    journal = Journal(tmp_path)
    journal.append({"a": 1})
    waiter = asyncio.create_task(journal.commit())
    await asyncio.sleep(0)
    waiter.cancel()
    await journal.commit()
    assert read_journal(tmp_path).records == [{"a": 1}]
    await journal.aclose()


async def test_reopen_starts_a_new_segment_and_replays_everything(tmp_path):
    journal, _ = Journal.open(tmp_path)
    journal.append({"a": 1})
    await journal.aclose()
    journal, replay = Journal.open(tmp_path)
    assert replay.records == [{"a": 1}]
    journal.append({"b": 2})
    await journal.aclose()
    assert names(tmp_path) == {"seg-00000001.cfj", "seg-00000002.cfj"}
    journal, replay = Journal.open(tmp_path)
    assert replay.records == [{"a": 1}, {"b": 2}]
    assert replay.damage == []
    assert replay.bytes == disk_bytes(tmp_path) == journal.size_bytes()
    journal.close()


def test_sync_callers_flush_and_close_without_a_loop(tmp_path):
    journal = Journal(tmp_path)
    journal.append({"a": 1})
    journal.flush_sync()
    assert read_journal(tmp_path).records == [{"a": 1}]
    journal.append({"b": 2})
    journal.close()
    assert read_journal(tmp_path).records == [{"a": 1}, {"b": 2}]


def test_an_unencodable_record_fails_at_append_and_buffers_nothing(tmp_path):
    journal = Journal(tmp_path)
    with pytest.raises(JournalError):
        journal.append({"a": object()})
    journal.append({"ok": True})
    journal.close()
    assert read_journal(tmp_path).records == [{"ok": True}]


async def test_every_torn_cut_of_the_last_segment_is_reported_then_repaired(tmp_path):
    records = [{"i": 1}, {"i": 2}, {"text": "the last one"}]
    frames = [encode_record(r) for r in records]
    last = len(frames[0]) + len(frames[1])
    whole = b"".join(frames)
    for cut in range(last + 1, len(whole)):
        folder = tmp_path / str(cut)
        folder.mkdir()
        (folder / "seg-00000001.cfj").write_bytes(whole[:cut])
        journal, replay = Journal.open(folder)
        journal.close()
        segment = str(folder / "seg-00000001.cfj")
        assert replay.records == records[:2], cut
        assert [(d.path, d.offset) for d in replay.damage] == [(segment, last)], cut
        assert "torn" in replay.damage[0].reason
        assert (folder / "seg-00000001.cfj").read_bytes() == whole[:last]
        assert (folder / "seg-00000001.cfj.damaged").read_bytes() == whole[last:cut]
        journal, again = Journal.open(folder)
        journal.close()
        assert (again.records, again.damage) == (records[:2], [])


def test_damage_in_an_older_segment_is_reported_and_later_segments_still_read(tmp_path):
    write_file(tmp_path / "seg-00000001.cfj", [{"a": 1}, {"a": 2}])
    write_file(tmp_path / "seg-00000002.cfj", [{"b": 1}])
    broken = bytearray((tmp_path / "seg-00000001.cfj").read_bytes())
    broken[-1] ^= 0x40
    (tmp_path / "seg-00000001.cfj").write_bytes(bytes(broken))
    journal, replay = Journal.open(tmp_path)
    journal.close()
    first = len(encode_record({"a": 1}))
    assert replay.records == [{"a": 1}, {"b": 1}]
    assert replay.damage == [
        Damage(path=str(tmp_path / "seg-00000001.cfj"), offset=first, reason="checksum mismatch")
    ]
    # Not the last segment: left as it is, and reported again next time.
    assert (tmp_path / "seg-00000001.cfj").read_bytes() == bytes(broken)
    assert read_journal(tmp_path).damage == replay.damage


def test_a_second_damaged_tail_is_kept_under_a_new_name(tmp_path):
    (tmp_path / "seg-00000001.cfj").write_bytes(b"junk")
    (tmp_path / "seg-00000001.cfj.damaged").write_bytes(b"older")
    journal, replay = Journal.open(tmp_path)
    journal.close()
    assert [d.reason for d in replay.damage] == ["torn tail: record header needs 12 bytes, 4 left"]
    assert (tmp_path / "seg-00000001.cfj.damaged.1").read_bytes() == b"junk"
    assert (tmp_path / "seg-00000001.cfj.damaged").read_bytes() == b"older"


async def test_compaction_leaves_the_snapshot_and_the_new_segment(tmp_path):
    journal = Journal(tmp_path)
    for i in range(10):
        journal.append({"i": i})
    await journal.commit()
    journal.append({"pending": True})
    await journal.compact([{"state": "s1"}, {"state": "s2"}])
    journal.append({"after": 1})
    await journal.commit()
    assert names(tmp_path) == {"snap-00000002.cfj", "seg-00000002.cfj"}
    replay = read_journal(tmp_path)
    assert replay.records == [{"state": "s1"}, {"state": "s2"}, {"after": 1}]
    assert replay.snapshot_seq == 2
    assert journal.size_bytes() == disk_bytes(tmp_path)
    await journal.aclose()
    reopened, again = Journal.open(tmp_path)
    reopened.close()
    assert again.records == replay.records


async def test_records_appended_while_compacting_go_to_the_new_segment(tmp_path):
    journal = Journal(tmp_path)
    journal.append({"before": 1})
    compaction = asyncio.create_task(journal.compact([{"state": 1}]))
    await asyncio.sleep(0)  # the compaction has switched segments and waits for the write
    journal.append({"during": 1})
    await compaction
    await journal.aclose()
    assert read_journal(tmp_path).records == [{"state": 1}, {"during": 1}]


async def test_compacting_to_an_empty_state_and_twice_in_a_row(tmp_path):
    journal = Journal(tmp_path)
    journal.append({"a": 1})
    await journal.compact([])
    await journal.compact([{"b": 2}])
    await journal.aclose()
    replay = read_journal(tmp_path)
    assert (replay.records, replay.snapshot_seq) == ([{"b": 2}], 2)
    assert names(tmp_path) == {"snap-00000002.cfj"}


async def test_a_bad_snapshot_record_fails_compaction_and_changes_nothing(tmp_path):
    journal = Journal(tmp_path)
    journal.append({"a": 1})
    await journal.commit()
    with pytest.raises(JournalError):
        await journal.compact([{"ok": 1}, {2: "bad key"}])
    journal.append({"b": 2})
    await journal.aclose()
    assert read_journal(tmp_path).records == [{"a": 1}, {"b": 2}]
    assert names(tmp_path) == {"seg-00000001.cfj"}


def test_a_half_written_temp_snapshot_is_ignored_then_removed(tmp_path):
    write_file(tmp_path / "seg-00000001.cfj", [{"a": 1}])
    (tmp_path / "snap-00000002.cfj.tmp").write_bytes(encode_record({"s": 1})[:7])
    replay = read_journal(tmp_path)
    assert (replay.records, replay.damage, replay.snapshot_seq) == ([{"a": 1}], [], None)
    journal, replay = Journal.open(tmp_path)
    journal.close()
    assert replay.records == [{"a": 1}]
    assert names(tmp_path) == {"seg-00000001.cfj"}


def test_a_compaction_cut_short_before_deleting_replays_from_the_snapshot(tmp_path):
    write_file(tmp_path / "seg-00000001.cfj", [{"old": 1}])
    write_file(tmp_path / "snap-00000002.cfj", [{"state": 1}])
    write_file(tmp_path / "seg-00000002.cfj", [{"new": 1}])
    replay = read_journal(tmp_path)
    assert (replay.records, replay.snapshot_seq) == ([{"state": 1}, {"new": 1}], 2)
    journal, _ = Journal.open(tmp_path)
    journal.close()
    assert names(tmp_path) == {"snap-00000002.cfj", "seg-00000002.cfj"}


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one(tmp_path):
    write_file(tmp_path / "snap-00000001.cfj", [{"state": 1}])
    write_file(tmp_path / "seg-00000001.cfj", [{"a": 1}])
    (tmp_path / "snap-00000002.cfj").write_bytes(b"CFJ1garbage")
    write_file(tmp_path / "seg-00000002.cfj", [{"b": 1}])
    replay = read_journal(tmp_path)
    assert replay.records == [{"state": 1}, {"a": 1}, {"b": 1}]
    assert replay.snapshot_seq == 1
    assert [d.path for d in replay.damage] == [str(tmp_path / "snap-00000002.cfj")]


async def test_segments_rotate_past_segment_bytes_at_group_boundaries(tmp_path):
    journal = Journal(tmp_path, segment_bytes=200)
    group = len(encode_record({"i": 0, "pad": "x" * 40})) * 2
    for i in range(0, 20, 2):
        journal.append({"i": i, "pad": "x" * 40})
        journal.append({"i": i + 1, "pad": "x" * 40})
        await journal.commit()
    await journal.aclose()
    sizes = segment_sizes(tmp_path)
    assert len(sizes) > 3
    for size in sizes[:-1]:
        assert 200 <= size < 200 + group
        assert size % group == 0
    assert [r["i"] for r in read_journal(tmp_path).records] == list(range(20))


class FullDisk(Journal):
    """A journal whose disk is full after ``room`` bytes of any write."""

    room = 5

    def _write(self, fd: int, data: bytes) -> None:
        os.write(fd, data[: self.room])
        raise OSError(errno.ENOSPC, "No space left on device")


class FailingFsync(Journal):
    def _fsync(self, fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")


@pytest.mark.parametrize("cls", [FullDisk, FailingFsync])
async def test_a_write_error_reaches_every_waiter_and_breaks_the_journal(tmp_path, cls):
    journal = cls(tmp_path)
    for i in range(10):
        journal.append({"i": i})
    async with asyncio.timeout(5):
        results = await asyncio.gather(
            *(journal.commit() for _ in range(10)), return_exceptions=True
        )
    assert all(isinstance(r, JournalError) for r in results)
    assert isinstance(results[0].__cause__, OSError)
    assert results[0].__cause__.errno in (errno.ENOSPC, errno.EIO)
    with pytest.raises(JournalError, match="could not write"):
        journal.append({"more": 1})
    with pytest.raises(JournalError):
        journal.flush_sync()
    with pytest.raises(JournalError):
        await journal.aclose()  # the failed group's records are not on disk
    await journal.aclose()


async def test_a_torn_write_is_repaired_on_the_next_open(tmp_path):
    journal = Journal(tmp_path)
    journal.append({"kept": 1})
    await journal.commit()
    await journal.aclose()
    broken = FullDisk(tmp_path)
    broken.append({"lost": 1})
    with pytest.raises(JournalError):
        await broken.commit()
    with pytest.raises(JournalError):
        broken.close()
    journal, replay = Journal.open(tmp_path)
    journal.close()
    assert replay.records == [{"kept": 1}]
    assert [d.offset for d in replay.damage] == [0]
    assert (tmp_path / "seg-00000002.cfj.damaged").read_bytes() == encode_record({"lost": 1})[:5]


async def test_aclose_raises_when_pending_records_cannot_be_written(tmp_path):
    journal = FullDisk(tmp_path)
    journal.append({"a": 1})
    with pytest.raises(JournalError):
        await journal.aclose()
    with pytest.raises(UsageError):
        journal.append({"b": 1})


class Signalling(Journal):
    """Sets ``synced`` on the event loop after each fsync of segment data."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loop = asyncio.get_running_loop()
        self.synced = asyncio.Event()

    def _fsync(self, fd: int) -> None:
        super()._fsync(fd)
        self.loop.call_soon_threadsafe(self.synced.set)


class SignallingFullDisk(FullDisk):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loop = asyncio.get_running_loop()
        self.failed = asyncio.Event()

    def _write(self, fd: int, data: bytes) -> None:
        self.loop.call_soon_threadsafe(self.failed.set)
        super()._write(fd, data)


async def test_the_background_flush_writes_records_nobody_committed(tmp_path):
    journal = Signalling(tmp_path)
    journal.start_background(interval_s=0.01)
    with pytest.raises(UsageError, match="already running"):
        journal.start_background()
    journal.append({"a": 1})
    async with asyncio.timeout(5):
        await journal.synced.wait()
    assert read_journal(tmp_path).records == [{"a": 1}]
    await journal.aclose()


async def test_the_background_flush_stops_quietly_after_a_write_error(tmp_path):
    journal = SignallingFullDisk(tmp_path)
    journal.start_background(interval_s=0.01)
    journal.append({"a": 1})
    async with asyncio.timeout(5):
        await journal.failed.wait()
    with pytest.raises(JournalError):
        await journal.commit()
    with pytest.raises(JournalError):
        await journal.aclose()


async def test_use_after_close_is_a_usage_error_and_closing_twice_is_harmless(tmp_path):
    journal = Journal(tmp_path)
    await journal.aclose()
    await journal.aclose()
    journal.close()
    with pytest.raises(UsageError):
        journal.append({"a": 1})
    with pytest.raises(UsageError):
        journal.flush_sync()
    with pytest.raises(UsageError):
        await journal.compact([])
    with pytest.raises(UsageError):
        journal.start_background()


def test_folder_is_private_and_files_are_owner_only(tmp_path):
    folder = tmp_path / "deep" / "j"
    journal = Journal(folder)
    journal.append({"a": 1})
    journal.close()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    for name in names(folder):
        assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o600


async def test_snapshot_and_damage_files_are_owner_only(tmp_path):
    (tmp_path / "seg-00000001.cfj").write_bytes(b"junk")
    journal, _ = Journal.open(tmp_path)
    await journal.compact([{"s": 1}])
    await journal.aclose()
    for name in ("snap-00000002.cfj", "seg-00000001.cfj.damaged"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600, name


def test_a_symlinked_folder_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(JournalError, match="symlink"):
        Journal(tmp_path / "link")
    with pytest.raises(JournalError, match="symlink"):
        Journal.open(tmp_path / "link")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(JournalError, match="symlink"):
        Journal(tmp_path / "dangling")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chown(folder, 12345, 12345)
    with pytest.raises(JournalError, match="belongs to user 12345"):
        Journal(folder)


def test_a_second_writer_on_the_same_folder_is_refused(tmp_path):
    journal = Journal(tmp_path)
    with pytest.raises(JournalError, match="another writer"):
        Journal(tmp_path)
    journal.close()
    Journal(tmp_path).close()


def test_reading_a_missing_folder_is_empty_and_creates_nothing(tmp_path):
    assert read_journal(tmp_path / "missing") == Replay()
    assert not (tmp_path / "missing").exists()


def test_reading_leaves_a_damaged_folder_untouched(tmp_path):
    (tmp_path / "seg-00000001.cfj").write_bytes(b"junk")
    (tmp_path / "snap-00000003.cfj.tmp").write_bytes(b"half")
    before = {n: (tmp_path / n).read_bytes() for n in names(tmp_path)}
    replay = read_journal(tmp_path)
    assert len(replay.damage) == 1
    assert {n: (tmp_path / n).read_bytes() for n in names(tmp_path)} == before


def test_a_fifo_under_a_segment_name_is_damage_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "seg-00000001.cfj")
    write_file(tmp_path / "seg-00000002.cfj", [{"a": 1}])
    replay = read_journal(tmp_path)
    assert replay.records == [{"a": 1}]
    assert replay.damage[0].reason.startswith("unreadable")


def test_segment_bytes_must_be_positive(tmp_path):
    with pytest.raises(UsageError):
        Journal(tmp_path, segment_bytes=0)
