"""Behaviour of dispatch_service.geocoding.metrics: chain counters become per-window deltas."""

from __future__ import annotations

import asyncio

from geocoding_helpers import SERVER_KEY, ManualClock

from dispatch_service.core.metrics import InMemoryMetrics
from dispatch_service.geocoding.chain import GeocoderChain, GeocoderSettings
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.geocoding.metrics import GeocodingObserver
from dispatch_service.offline.geocoding_server import GeocodingServer


def test_windows_become_counter_deltas_and_breaker_gauges(
    server: GeocodingServer, gazetteer: Gazetteer, recogniser: AdminRecogniser, clock: ManualClock
) -> None:
    server.set_mode("amap", failure="http_500")
    settings = GeocoderSettings(
        geocoder_primary_url=server.url,
        geocoder_primary_key=SERVER_KEY,
        geocoder_secondary_kind="baidu",
        geocoder_secondary_url=server.url,
        geocoder_secondary_key=SERVER_KEY,
        geocoder_breaker_failures=1,
        geocoder_deadline_ms=4000.0,
        geocoder_attempt_timeout_ms=1000.0,
    )
    chain = GeocoderChain(settings, gazetteer=gazetteer, recogniser=recogniser, clock=clock)
    road = gazetteer.roads[20].name
    observer = GeocodingObserver()
    sink = InMemoryMetrics()

    async def body() -> None:
        for texts in ([f"上海市{road}10号"], [f"上海市{road}10号", "上海市闵行区某某小区"]):
            await chain.resolve_locations(texts, ["上海"] * len(texts))
            sink.record(observer.observe(chain.stats(), latency_ms=1.0))
        await chain.close()

    asyncio.run(body())
    counters = {(name, labels): value for (name, labels), value in sink.counters.items()}
    assert counters[("dispatch_geocoding_locations_total", (("source", "geocoder"),))] == 1
    assert counters[("dispatch_geocoding_locations_total", (("source", "cache"),))] == 1
    assert counters[("dispatch_geocoding_locations_total", (("source", "gazetteer"),))] == 1
    assert counters[("dispatch_geocoding_cache_events_total", (("event", "hit"),))] == 1
    assert counters[("dispatch_geocoding_cache_events_total", (("event", "miss"),))] == 2
    assert counters[("dispatch_geocoding_provider_failures_total", (("provider", "primary"),))] == 1
    gauges = sink.gauges
    assert gauges[("dispatch_geocoding_breaker_open", (("provider", "primary"),))] == 1.0
    assert gauges[("dispatch_geocoding_breaker_open", (("provider", "secondary"),))] == 0.0
    assert len(sink.histograms[("dispatch_geocoding_latency_ms", ())]) == 2
