"""A cache keyed by object identity, for what many requests rebuild from the same few objects
(a tool spec's wire form, a batch's exit spec and validator)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["IdentityCache"]

K = TypeVar("K")
V = TypeVar("V")


class IdentityCache(Generic[K, V]):
    """``make(key)``, made once per key object and found again by its identity.

    For what every request of every clone rebuilds from the same few objects (the wire form of
    a tool spec, a batch's exit spec and validator from its one shared schema): an ``id`` lookup
    instead of walking or hashing the object. Each key is kept alive beside its value, so its id
    stays its own; past ``size`` entries the cache starts again empty.
    """

    __slots__ = ("_items", "_make", "_size")

    def __init__(self, make: Callable[[K], V], size: int) -> None:
        self._make, self._size = make, size
        self._items: dict[int, tuple[K, V]] = {}

    def __call__(self, key: K) -> V:
        found = self._items.get(id(key))
        if found is not None and found[0] is key:
            return found[1]
        value = self._make(key)
        if len(self._items) >= self._size:
            self._items.clear()
        self._items[id(key)] = (key, value)
        return value
