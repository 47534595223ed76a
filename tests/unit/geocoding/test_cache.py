"""Behaviour of dispatch_service.geocoding.cache: LRU within a TTL, and its counters."""

from __future__ import annotations

import pytest
from geocoding_helpers import ManualClock

from dispatch_service.geocoding.cache import DEFAULT_TTL_S, GeocodeCache

A = ("上海市徐汇区安平路100号", "上海")
B = ("上海市徐汇区安平路200号", "上海")
C = ("上海市徐汇区安平路300号", "上海")


def test_hit_and_miss_are_counted() -> None:
    cache = GeocodeCache(max_entries=10)
    assert cache.get(A) is None
    cache.put(A, (31.2, 121.4))
    assert cache.get(A) == (31.2, 121.4)
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size) == (1, 1, 1)


def test_same_text_in_another_city_is_another_key() -> None:
    cache = GeocodeCache()
    cache.put(A, (31.2, 121.4))
    assert cache.get((A[0], "杭州")) is None


def test_least_recently_used_is_evicted_first() -> None:
    cache = GeocodeCache(max_entries=2)
    cache.put(A, (1.0, 1.0))
    cache.put(B, (2.0, 2.0))
    assert cache.get(A) is not None  # A is now more recent than B
    cache.put(C, (3.0, 3.0))
    assert cache.get(B) is None
    assert cache.get(A) == (1.0, 1.0)
    assert cache.get(C) == (3.0, 3.0)
    assert cache.stats().evictions == 1


def test_entries_expire_after_the_ttl(clock: ManualClock) -> None:
    cache = GeocodeCache(ttl_s=DEFAULT_TTL_S, timer=clock)
    cache.put(A, (1.0, 1.0))
    clock.advance(DEFAULT_TTL_S - 1)
    assert cache.get(A) == (1.0, 1.0)
    clock.advance(2)
    assert cache.get(A) is None
    stats = cache.stats()
    assert stats.expirations == 1
    assert stats.evictions == 0
    assert stats.size == 0


def test_default_ttl_is_a_day() -> None:
    assert DEFAULT_TTL_S == 24 * 3600


@pytest.mark.parametrize(("entries", "ttl"), [(0, 10.0), (10, 0.0)])
def test_bad_settings_are_refused(entries: int, ttl: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        GeocodeCache(max_entries=entries, ttl_s=ttl)
