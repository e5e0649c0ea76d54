"""One least-recently-used cache bounded by a total weight: a count of entries (each weighs 1) or bytes.

The project keeps several caches that must stay bounded (copy maps bounded by host bytes, weight parts by
device bytes on each card, prepared programs and timings by entries). ``functools.lru_cache`` bounds only
entries, wraps a function and cannot drop one entry or free what an evicted entry holds; ``cachetools`` is
not a dependency. Hence this one class: an ``OrderedDict`` in recency order, a weight per entry, a bound
that may change between calls (an env var read at each store), a callback for every entry that leaves,
and a lock, since several of the caches are reached from more than one thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Iterator, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A mapping in least-recently-used order whose entries' weights add up to at most ``bound``.

    :meth:`put` makes room by evicting the least recently used entries first; an entry heavier than the
    whole bound is not kept (and evicts nothing). ``on_drop(key, value)`` is called for every entry that
    leaves: evicted, replaced by :meth:`put`, removed by :meth:`pop` or :meth:`clear`; it runs under the
    cache's (reentrant) lock, so it may use the cache but should not wait for another thread.
    """

    def __init__(self, bound: int, on_drop: Callable[[K, V], None] | None = None):
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._on_drop = on_drop
        self._lock = threading.RLock()
        self.bound = bound
        self.evictions = 0  # entries evicted to stay within the bound

    @property
    def bound(self) -> int:
        return self._bound

    @bound.setter
    def bound(self, value: int) -> None:
        """A new bound applies from the next :meth:`put` (nothing is evicted now)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"a cache bound is a whole number >= 0 (entries or bytes), got {value!r}")
        self._bound = value

    @property
    def weight(self) -> int:
        """The entries' total weight."""
        return self._weight

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Membership, without counting as a use."""
        return key in self._entries

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value under ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return default
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, weight: int = 1) -> bool:
        """Keep ``value`` under ``key`` as the most recently used, evicting the least recently used entries
        until the total fits; any older value under ``key`` leaves first. False when ``weight`` alone is
        over the bound: then the value is not kept."""
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise ValueError(f"a cache entry's weight is a whole number >= 0, got {weight!r}")
        with self._lock:
            self.pop(key)
            if weight > self._bound:
                return False
            while self._weight + weight > self._bound:
                old_key, (old, old_weight) = self._entries.popitem(last=False)
                self._weight -= old_weight
                self.evictions += 1
                if self._on_drop is not None:
                    self._on_drop(old_key, old)
            self._entries[key] = (value, weight)
            self._weight += weight
            return True

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove and return the value under ``key`` (``default`` if none)."""
        with self._lock:
            found = self._entries.pop(key, None)
            if found is None:
                return default
            self._weight -= found[1]
            if self._on_drop is not None:
                self._on_drop(key, found[0])
            return found[0]

    def clear(self) -> None:
        """Remove every entry (``evictions`` is kept)."""
        with self._lock:
            entries, self._entries = self._entries, OrderedDict()
            self._weight = 0
            if self._on_drop is not None:
                for key, (value, _) in entries.items():
                    self._on_drop(key, value)

    def keys(self) -> list[K]:
        """The keys, least recently used first (a copy: safe to iterate while others use the cache)."""
        with self._lock:
            return list(self._entries)

    def values(self) -> list[V]:
        with self._lock:
            return [value for value, _ in self._entries.values()]

    def items(self) -> list[tuple[K, V]]:
        with self._lock:
            return [(key, value) for key, (value, _) in self._entries.items()]

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())
