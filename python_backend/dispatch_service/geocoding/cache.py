"""The address cache: LRU with a time to live, bounded, with hit / miss / eviction counters.

Order services see the same addresses again and again (a restaurant's pickup address, a
regular customer's door), so most lookups never need the network. The cache is
`cachetools.TTLCache` (LRU order within the TTL); a subclass counts what it drops, because
an eviction rate says the cache is too small and an expiry rate says the TTL is too short.
Only provider answers are cached: gazetteer guesses are cheap to redo and would otherwise
hide a provider's better answer for a day.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cachetools import TTLCache

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TTL_S",
    "CacheKey",
    "CacheStats",
    "GeocodeCache",
    "LatLon",
]

DEFAULT_TTL_S: Final = 24 * 3600.0
DEFAULT_MAX_ENTRIES: Final = 100_000

LatLon = tuple[float, float]
# (normalised address, normalised city): the same text in two cities is two places.
CacheKey = tuple[str, str]


@dataclass(frozen=True)
class CacheStats:
    """Counters since the cache was made (monotonic; export them as counters)."""

    hits: int
    misses: int
    evictions: int  # dropped as least recently used to stay within max_entries
    expirations: int  # dropped because their TTL ran out
    size: int


class _CountingTTLCache(TTLCache[CacheKey, LatLon]):
    """`TTLCache` that counts the entries it drops, told apart by why."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float]) -> None:
        super().__init__(maxsize=maxsize, ttl=ttl, timer=timer)
        self.evictions = 0
        self.expirations = 0

    def popitem(self) -> tuple[CacheKey, LatLon]:
        item = super().popitem()
        self.evictions += 1
        return item

    def expire(self, time: Any = None) -> list[tuple[CacheKey, LatLon]]:
        expired = super().expire(time)
        self.expirations += len(expired)
        return expired


class GeocodeCache:
    """Thread-safe LRU+TTL map from (address, city) to a WGS-84 point.

    ``timer`` is the clock the TTL runs on (``time.monotonic`` by default; tests pass a
    clock they move by hand).
    """

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        ttl_s: float = DEFAULT_TTL_S,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError("cache max_entries must be >= 1")
        if not ttl_s > 0:
            raise ValueError("cache ttl_s must be > 0")
        self._cache = _CountingTTLCache(max_entries, ttl_s, timer)
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    def get(self, key: CacheKey) -> LatLon | None:
        """The cached point, or None (counted as a miss); a hit refreshes its LRU rank."""
        with self._lock:
            value = self._cache.get(key)
            if value is None:
                self._misses += 1
            else:
                self._hits += 1
            return value

    def get_many(self, keys: Sequence[CacheKey]) -> list[LatLon | None]:
        """Each key's point or None, counting nothing: the caller records the hits it
        uses (`count_hits`) or looks the keys up again with `get`."""
        with self._lock:
            return [self._cache.get(key) for key in keys]

    def count_hits(self, count: int) -> None:
        with self._lock:
            self._hits += count

    def put(self, key: CacheKey, value: LatLon) -> None:
        with self._lock:
            self._cache[key] = value

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def stats(self) -> CacheStats:
        with self._lock:
            self._cache.expire()
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._cache.evictions,
                expirations=self._cache.expirations,
                size=len(self._cache),
            )
