"""Prometheus metrics of the geocoder chain, in the vocabulary of `core.metrics`.

The adapter that owns a chain passes `GEOCODING_METRICS` to its metrics sink beside the
service's own and, after each window, records `GeocodingObserver.observe`: a handful of
values per window (each one an IPC call from the stub), never one per address.

| metric | kind | labels (besides model, version) |
| --- | --- | --- |
| dispatch_geocoding_latency_ms | histogram | | one per window that carried addresses |
| dispatch_geocoding_locations_total | counter | source: cache, geocoder, gazetteer |
| dispatch_geocoding_cache_events_total | counter | event: hit, miss, eviction, expiration |
| dispatch_geocoding_provider_failures_total | counter | provider: primary, secondary |
| dispatch_geocoding_late_total | counter | | lookups cut by the window's deadline |
| dispatch_geocoding_breaker_open | gauge | provider | 1 while the breaker is not closed |
"""

from __future__ import annotations

from typing import Any, Final

from dispatch_service.core.metrics import (
    LATENCY_BUCKETS_MS,
    MetricKind,
    MetricSpec,
    Observation,
)

__all__ = [
    "BREAKER_OPEN",
    "CACHE_EVENTS",
    "GEOCODING_LATENCY",
    "GEOCODING_METRICS",
    "LATE_LOOKUPS",
    "LOCATIONS",
    "PROVIDER_FAILURES",
    "GeocodingObserver",
]

GEOCODING_LATENCY: Final = MetricSpec(
    "dispatch_geocoding_latency_ms",
    MetricKind.HISTOGRAM,
    "time to resolve a window's addresses (cache, providers, gazetteer), ms",
    buckets=LATENCY_BUCKETS_MS,
)
LOCATIONS: Final = MetricSpec(
    "dispatch_geocoding_locations_total",
    MetricKind.COUNTER,
    "order ends located from an address, by source",
    labels=("source",),
)
CACHE_EVENTS: Final = MetricSpec(
    "dispatch_geocoding_cache_events_total",
    MetricKind.COUNTER,
    "address cache hits, misses, LRU evictions and TTL expirations",
    labels=("event",),
)
PROVIDER_FAILURES: Final = MetricSpec(
    "dispatch_geocoding_provider_failures_total",
    MetricKind.COUNTER,
    "geocoding provider calls that failed (timeout, HTTP, error status, bad body)",
    labels=("provider",),
)
LATE_LOOKUPS: Final = MetricSpec(
    "dispatch_geocoding_late_total",
    MetricKind.COUNTER,
    "provider lookups cut by the window's deadline (the gazetteer answered instead)",
)
BREAKER_OPEN: Final = MetricSpec(
    "dispatch_geocoding_breaker_open",
    MetricKind.GAUGE,
    "1 while a provider's circuit breaker is open or half-open, else 0",
    labels=("provider",),
)
GEOCODING_METRICS: Final = (
    GEOCODING_LATENCY,
    LOCATIONS,
    CACHE_EVENTS,
    PROVIDER_FAILURES,
    LATE_LOOKUPS,
    BREAKER_OPEN,
)
_CACHE_EVENTS: Final = (
    ("hits", "hit"),
    ("misses", "miss"),
    ("evictions", "eviction"),
    ("expirations", "expiration"),
)


def _delta(now: dict[str, Any], before: dict[str, Any], key: str) -> float:
    return float(now.get(key, 0)) - float(before.get(key, 0))


class GeocodingObserver:
    """Turns `GeocoderChain.stats()` into per-window observations (deltas of counters)."""

    def __init__(self) -> None:
        self._last: dict[str, Any] = {}

    def observe(self, stats: dict[str, Any], latency_ms: float | None) -> list[Observation]:
        """What changed since the previous call; zero deltas are left out."""
        last = self._last
        found: list[Observation] = []
        if latency_ms is not None:
            found.append(Observation(GEOCODING_LATENCY, latency_ms))
        for name in ("cache", "geocoder", "gazetteer"):
            value = _delta(stats["sources"], last.get("sources", {}), name)
            if value > 0:
                found.append(Observation(LOCATIONS, value, (("source", name),)))
        for key, event in _CACHE_EVENTS:
            value = _delta(stats["cache"], last.get("cache", {}), key)
            if value > 0:
                found.append(Observation(CACHE_EVENTS, value, (("event", event),)))
        for provider in stats["breakers"]:
            value = _delta(stats["provider_failures"], last.get("provider_failures", {}), provider)
            if value > 0:
                found.append(Observation(PROVIDER_FAILURES, value, (("provider", provider),)))
        late = float(stats["late"]) - float(last.get("late", 0))
        if late > 0:
            found.append(Observation(LATE_LOOKUPS, late))
        for provider, state in stats["breakers"].items():
            before = last.get("breakers", {}).get(provider)
            if state != before:
                found.append(
                    Observation(BREAKER_OPEN, float(state != "closed"), (("provider", provider),))
                )
        self._last = stats
        return found
