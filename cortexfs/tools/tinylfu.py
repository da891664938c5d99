"""A W-TinyLFU cache: tsh's tool-path cache (SPEC H-4 ``cache_capacity``, ``window_percent``).

W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission
Policy", 2017; the policy of Caffeine) keeps a cache of ``capacity`` entries in two parts:

* the **window**, an LRU of ``window_percent`` % of the capacity (at least one entry), where
  every new entry starts, so that a burst of new names does not wash the cache out;
* the **main** part, a segmented LRU: *probation* (a fifth of it) for entries admitted once,
  *protected* (the rest) for entries used again while on probation.

An entry pushed out of the window is only *admitted* to a full main part when it has been
asked for more often than the entry main would evict for it; otherwise it is the one that
goes.  "How often" is estimated by a count-min sketch of every lookup, hits and misses alike,
with 4-bit counters that are all halved after ``10 × capacity`` lookups, so that old
popularity fades.  The estimate may be high (hash collisions), never low.

Pinned entries live beside the cache: they count against no capacity and are never evicted
(H-4: "pinned tools are exempt from … eviction").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")

_PROBATION_SHARE = 0.2  # of the main part, as in the paper and Caffeine
_COUNTER_MAX = 15  # 4-bit counters
_SAMPLE_FACTOR = 10  # halve all counters after this many lookups per entry of capacity
# Odd 64-bit multipliers, one per row (Caffeine's), so that the rows hash independently.
_ROW_SEEDS = (0xC3A5C85C97CB3127, 0xB492B66FBE98F273, 0x9AE16A3B2F90404F, 0xCBF29CE484222325)
_WORD = (1 << 64) - 1
_COUNTERS_PER_ENTRY = 16  # per row; as many as Caffeine's sketch keeps, so collisions are rare


class FrequencySketch(Generic[Key]):
    """Approximate lookup counts (count-min), aged by halving every ``sample_size`` lookups."""

    def __init__(self, capacity: int) -> None:
        width = 16
        while width < _COUNTERS_PER_ENTRY * capacity:
            width *= 2
        self._mask = width - 1
        self._rows = [[0] * width for _ in _ROW_SEEDS]
        self._sample_size = _SAMPLE_FACTOR * max(capacity, 1)
        self._lookups = 0

    def _slots(self, key: Key) -> Iterator[tuple[list[int], int]]:
        item = hash(key) & _WORD
        for seed, row in zip(_ROW_SEEDS, self._rows, strict=True):
            mixed = ((item + seed) * seed) & _WORD
            yield row, (mixed ^ (mixed >> 32)) & self._mask

    def increment(self, key: Key) -> None:
        for row, slot in self._slots(key):
            if row[slot] < _COUNTER_MAX:
                row[slot] += 1
        self._lookups += 1
        if self._lookups >= self._sample_size:
            self._age()

    def frequency(self, key: Key) -> int:
        return min(row[slot] for row, slot in self._slots(key))

    def _age(self) -> None:
        for row in self._rows:
            row[:] = [count // 2 for count in row]
        self._lookups //= 2


class WTinyLFU(Generic[Key, Value]):
    """A bounded mapping with W-TinyLFU eviction, plus pinned entries that never leave."""

    def __init__(self, capacity: int, window_percent: int) -> None:
        if capacity < 1 or not 1 <= window_percent <= 100:
            raise ValueError("capacity must be >= 1 and window_percent within 1..100")
        self.capacity = capacity
        self.window_size = max(1, capacity * window_percent // 100)
        main_size = capacity - self.window_size
        self.probation_size = max(1, int(main_size * _PROBATION_SHARE)) if main_size else 0
        self.protected_size = main_size - self.probation_size
        self._window: OrderedDict[Key, Value] = OrderedDict()  # last = most recently used
        self._probation: OrderedDict[Key, Value] = OrderedDict()
        self._protected: OrderedDict[Key, Value] = OrderedDict()
        self._pinned: dict[Key, Value] = {}
        self.sketch: FrequencySketch[Key] = FrequencySketch(capacity)

    def __len__(self) -> int:
        """Unpinned entries: what ``capacity`` bounds."""
        return len(self._window) + len(self._probation) + len(self._protected)

    def __contains__(self, key: object) -> bool:
        return any(key in part for part in self._parts())

    def _parts(self) -> tuple[dict[Key, Value], ...]:
        return (self._pinned, self._window, self._probation, self._protected)

    def get(self, key: Key) -> Value | None:
        """The value of ``key`` (None on a miss); counts the lookup and refreshes the entry."""
        self.sketch.increment(key)
        if key in self._pinned:
            return self._pinned[key]
        if key in self._window:
            self._window.move_to_end(key)
            return self._window[key]
        if key in self._protected:
            self._protected.move_to_end(key)
            return self._protected[key]
        if key in self._probation:
            value = self._probation.pop(key)  # used again on probation: promote
            self._protected[key] = value
            if len(self._protected) > self.protected_size:
                demoted, demoted_value = self._protected.popitem(last=False)
                self._probation[demoted] = demoted_value
            return value
        return None

    def put(self, key: Key, value: Value) -> None:
        """Store ``key`` (replacing its value where it already is; new entries start in the
        window).  Does not count as a lookup: :meth:`get` already counted the miss."""
        for part in self._parts():
            if key in part:
                part[key] = value
                return
        self._window[key] = value
        if len(self._window) > self.window_size:
            candidate, candidate_value = self._window.popitem(last=False)
            self._admit(candidate, candidate_value)

    def _admit(self, candidate: Key, value: Value) -> None:
        """The window's evictee enters main if there is room, or if it is asked for more
        often than main's own next victim; otherwise it is dropped."""
        main_size = self.probation_size + self.protected_size
        if len(self._probation) + len(self._protected) < main_size:
            self._probation[candidate] = value
            return
        victims = self._probation or self._protected
        if not victims:
            return  # no main part at all (capacity 1): the window is the whole cache
        victim = next(iter(victims))
        if self.sketch.frequency(candidate) > self.sketch.frequency(victim):
            del victims[victim]
            self._probation[candidate] = value

    def discard(self, key: Key) -> None:
        """Forget ``key`` (a stale entry), pinned or not."""
        for part in self._parts():
            part.pop(key, None)

    def pin(self, key: Key, value: Value) -> None:
        """Keep ``key`` for good, outside the capacity."""
        for part in self._parts():
            part.pop(key, None)
        self._pinned[key] = value

    def unpin(self, key: Key) -> None:
        """Return a pinned entry to the cache, as a new entry."""
        if key in self._pinned:
            self.put(key, self._pinned.pop(key))

    def is_pinned(self, key: Key) -> bool:
        return key in self._pinned

    def clear(self) -> None:
        """Drop every unpinned entry (the counts stay: they are history, not cache)."""
        self._window.clear()
        self._probation.clear()
        self._protected.clear()

    def keys(self) -> list[Key]:
        """Pinned entries first, then the rest from the most to the least protected."""
        return [*self._pinned, *self._protected, *self._probation, *self._window]
