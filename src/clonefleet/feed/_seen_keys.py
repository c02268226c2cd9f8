"""The keys a feeder has seen, kept as 64-bit hashes in one flat table (docs/inputs.md)."""

from __future__ import annotations

from array import array
from hashlib import blake2b

__all__ = ["SeenKeys"]

_FIRST_SLOTS = 1024


def key_hash(key: str) -> int:
    """The key's 64-bit hash (BLAKE2b, the same in every process), never 0 (an empty slot)."""
    value = int.from_bytes(blake2b(key.encode(errors="surrogatepass"), digest_size=8).digest())
    return value or 1


class SeenKeys:
    """The set of the row keys seen so far, as their 64-bit :func:`key_hash` in one
    open-addressing table of 8-byte slots kept at most half full: 16 to 32 bytes a key, however
    long the keys (a million keys: 16 MiB, where a set of the strings takes over 100 MiB).

    A key whose hash is in the table is taken as seen. Two different keys share a hash with a
    probability of about n²/2⁶⁵ over n keys (3 in 100 million for a million keys), so a row
    wrongly failed as a repeat is negligible; the keys themselves are not kept, so such a hit
    cannot be told from a real repeat.
    """

    def __init__(self) -> None:
        self._slots = array("Q", bytes(8 * _FIRST_SLOTS))
        self._used = 0

    def __len__(self) -> int:
        return self._used

    def add(self, key: str) -> bool:
        """Note ``key`` as seen; ``True`` when it was not seen before."""
        if not self._put(self._slots, key_hash(key)):
            return False
        self._used += 1
        if 2 * self._used > len(self._slots):
            self._grow()
        return True

    @staticmethod
    def _put(slots: array[int], value: int) -> bool:
        """Put ``value`` in the first free slot from its own (linear probing); ``False`` when
        it is there already."""
        mask = len(slots) - 1
        i = value & mask
        while (there := slots[i]) != 0:
            if there == value:
                return False
            i = (i + 1) & mask
        slots[i] = value
        return True

    def _grow(self) -> None:
        """Twice the slots, every hash put again."""
        old = self._slots
        self._slots = array("Q", bytes(16 * len(old)))
        for value in old:
            if value:
                self._put(self._slots, value)
