"""Behaviour of the geocoder chain against a real loopback geocoding server.

The server (`dispatch_service.offline.geocoding_server`) answers from the shipped gazetteer
in the amap (GCJ-02) and baidu (BD-09) shapes, with switchable latency and failures; the
chain's answers are compared with the gazetteer's own WGS-84 points.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest
from geocoding_helpers import SERVER_KEY, ManualClock

from dispatch_contract import CoordSystem
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import geo
from dispatch_service.geocoding.breaker import BreakerState
from dispatch_service.geocoding.chain import (
    BlockingGeocoder,
    GeocoderChain,
    GeocoderSettings,
    LocationSource,
    Resolution,
)
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer, MatchKind
from dispatch_service.offline.geocoding_server import GeocodingServer

T = TypeVar("T")
# Generous limits, so that a loaded CI machine never turns an answer into a timeout: the
# tests check which source answered, not how fast. Tests of the deadline itself set their own.
ATTEMPT_MS = 1000.0
DEADLINE_MS = 4000.0


def _metres(a: Any, b: Any) -> float:
    return 1000.0 * float(geo.haversine_km(a[0], a[1], b[0], b[1]))


def _chain(
    server: GeocodingServer | None,
    gazetteer: Gazetteer,
    recogniser: AdminRecogniser,
    clock: ManualClock,
    primary: str = "amap",
    secondary: str | None = "baidu",
    **overrides: Any,
) -> GeocoderChain:
    values: dict[str, Any] = {
        "geocoder_attempt_timeout_ms": ATTEMPT_MS,
        "geocoder_deadline_ms": DEADLINE_MS,
    }
    if server is not None:
        values |= {
            "geocoder_primary_kind": primary,
            "geocoder_primary_url": server.url,
            "geocoder_primary_key": SERVER_KEY,
        }
        if secondary is not None:
            values |= {
                "geocoder_secondary_kind": secondary,
                "geocoder_secondary_url": server.url,
                "geocoder_secondary_key": SERVER_KEY,
            }
    values |= overrides
    return GeocoderChain(
        GeocoderSettings(**values), gazetteer=gazetteer, recogniser=recogniser, clock=clock
    )


def _run(chain: GeocoderChain, body: Coroutine[Any, Any, T]) -> T:
    async def main() -> T:
        try:
            # The guard: a chain that waited on a hung provider would trip it.
            return await asyncio.wait_for(body, timeout=10)
        finally:
            await chain.close()

    return asyncio.run(main())


def _address(gazetteer: Gazetteer, number: int, road: int = 3) -> tuple[str, tuple[float, float]]:
    item = gazetteer.roads[road]
    return f"上海市徐汇区{item.name}{number}号", item.point(number)


@pytest.fixture()
def parts(
    gazetteer: Gazetteer, recogniser: AdminRecogniser, clock: ManualClock
) -> tuple[Gazetteer, AdminRecogniser, ManualClock]:
    return gazetteer, recogniser, clock


def test_provider_answer_then_cache_hit(server: GeocodingServer, parts: Any) -> None:
    chain = _chain(server, *parts)
    text, truth = _address(parts[0], 120)
    before = server.calls("amap")

    async def body() -> tuple[Resolution, Resolution]:
        first = await chain.resolve_locations([text], ["上海"])
        second = await chain.resolve_locations([text], ["上海"])
        return first, second

    first, second = _run(chain, body())
    assert first.source.tolist() == [LocationSource.GEOCODER]
    assert second.source.tolist() == [LocationSource.CACHE]
    assert _metres(first.latlon[0], truth) < 1.0
    assert second.latlon[0].tolist() == first.latlon[0].tolist()
    assert server.calls("amap") == before + 1
    stats = chain.stats()["cache"]
    assert (stats["hits"], stats["misses"]) == (1, 1)


def test_cache_entry_expires_after_its_ttl(server: GeocodingServer, parts: Any) -> None:
    clock: ManualClock = parts[2]
    chain = _chain(server, *parts, geocoder_cache_ttl_s=3600.0)
    text, _ = _address(parts[0], 130)

    async def body() -> list[int]:
        sources = []
        for step in (0.0, 3599.0, 2.0):
            clock.advance(step)
            found = await chain.resolve_locations([text], ["上海"])
            sources.append(int(found.source[0]))
        return sources

    assert _run(chain, body()) == [LocationSource.GEOCODER, LocationSource.CACHE,
                                   LocationSource.GEOCODER]  # fmt: skip
    assert chain.stats()["cache"]["expirations"] == 1


def test_an_address_no_provider_knows_is_not_asked_again_until_the_ttl(
    server: GeocodingServer, parts: Any
) -> None:
    """Both providers answer "not found" (the loopback server knows roads and places, not
    estates): the gazetteer answers, and the next windows skip the round trip."""
    clock: ManualClock = parts[2]
    chain = _chain(server, *parts, geocoder_cache_ttl_s=3600.0)
    text = "上海市徐汇区康居小区"
    known, _ = _address(parts[0], 150)
    before = server.calls("amap"), server.calls("baidu")

    async def body() -> list[list[int]]:
        sources = []
        # the second window also holds an address a provider knows: asked, it alone
        for step, texts in ((0.0, [text]), (10.0, [text, known]), (3600.0, [text])):
            clock.advance(step)
            found = await chain.resolve_locations(texts, ["上海"] * len(texts))
            sources.append(found.source.tolist())
        return sources

    assert _run(chain, body()) == [
        [LocationSource.GAZETTEER],
        [LocationSource.GAZETTEER, LocationSource.GEOCODER],
        [LocationSource.GAZETTEER],
    ]
    # the unknown one asked in the first window and again once the TTL had passed
    assert (server.calls("amap"), server.calls("baidu")) == (before[0] + 3, before[1] + 2)


def test_a_failing_provider_is_asked_again_next_window(server: GeocodingServer, parts: Any) -> None:
    """An error is not an answer: only "not found" from every provider is remembered."""
    server.set_mode("amap", failure="http_500")
    chain = _chain(server, *parts, secondary=None)
    text, _ = _address(parts[0], 140)
    before = server.calls("amap")

    async def body() -> None:
        for _ in range(2):
            await chain.resolve_locations([text], ["上海"])

    _run(chain, body())
    assert server.calls("amap") == before + 2


@pytest.mark.parametrize(
    ("kind", "datum"), [("amap", CoordSystem.GCJ02), ("baidu", CoordSystem.BD09)]
)
def test_provider_datum_is_converted_to_wgs84(
    server: GeocodingServer, parts: Any, kind: str, datum: CoordSystem
) -> None:
    chain = _chain(server, *parts, primary=kind, secondary=None)
    text, truth = _address(parts[0], 140, road=90)
    found = _run(chain, chain.resolve_locations([text], ["上海"]))
    assert found.source.tolist() == [LocationSource.GEOCODER]
    assert _metres(found.latlon[0], truth) < 1.0  # the server answered in `datum`
    raw = geo.from_wgs84(np.array([truth]), datum)[0]
    assert _metres(raw, truth) > 100.0  # ... which is hundreds of metres off WGS-84


def test_primary_timeout_fails_over_to_secondary(server: GeocodingServer, parts: Any) -> None:
    server.set_mode("amap", failure="hang")
    chain = _chain(server, *parts)
    text, truth = _address(parts[0], 150)
    before = server.calls("baidu")
    found = _run(chain, chain.resolve_locations([text], ["上海"]))
    assert found.source.tolist() == [LocationSource.GEOCODER]
    assert _metres(found.latlon[0], truth) < 1.0
    assert server.calls("baidu") == before + 1
    assert chain.stats()["provider_failures"] == {"primary": 1}


@pytest.mark.parametrize(
    ("amap", "baidu"), [("http_500", "error_status"), ("garbage", "http_500"), ("hang", "hang")]
)
def test_both_providers_down_gives_gazetteer_points(
    server: GeocodingServer, parts: Any, amap: str, baidu: str
) -> None:
    server.set_mode("amap", failure=amap)
    server.set_mode("baidu", failure=baidu)
    limits = {"geocoder_deadline_ms": 500.0, "geocoder_attempt_timeout_ms": 200.0}
    chain = _chain(server, *parts, **(limits if amap == "hang" else {}))
    texts = [_address(parts[0], n)[0] for n in (160, 170, 180)] + ["人民广场"]
    found = _run(chain, chain.resolve_locations(texts, ["上海"] * 4))
    assert found.source.tolist() == [LocationSource.GAZETTEER] * 4
    kinds = [match.kind if match else None for match in found.offline]
    assert kinds == [MatchKind.ROAD_NUMBER] * 3 + [MatchKind.POI]
    assert _metres(found.latlon[0], _address(parts[0], 160)[1]) < 0.01
    assert chain.stats()["cache"]["size"] == 0  # gazetteer guesses are not cached


def test_slow_providers_past_the_deadline_give_gazetteer_points(
    server: GeocodingServer, parts: Any
) -> None:
    server.set_mode("amap", latency_ms=400)
    server.set_mode("baidu", latency_ms=400)
    chain = _chain(server, *parts, geocoder_deadline_ms=300.0, geocoder_attempt_timeout_ms=150.0)
    texts = [_address(parts[0], n, road=r)[0] for n in (10, 20) for r in (1, 2, 3, 4)]
    found = _run(chain, chain.resolve_locations(texts, ["上海"] * len(texts)))
    assert found.source.tolist() == [LocationSource.GAZETTEER] * len(texts)


def test_circuit_breaker_opens_then_half_opens(server: GeocodingServer, parts: Any) -> None:
    clock: ManualClock = parts[2]
    server.set_mode("amap", failure="http_500")
    chain = _chain(server, *parts, geocoder_breaker_failures=2, geocoder_breaker_open_s=30.0)
    numbers = iter(range(200, 300))

    async def one() -> int:
        found = await chain.resolve_locations([_address(parts[0], next(numbers))[0]], ["上海"])
        return int(found.source[0])

    async def body() -> None:
        start = server.calls("amap")
        assert [await one(), await one()] == [LocationSource.GEOCODER] * 2  # secondary answers
        assert chain.breaker_state("primary") is BreakerState.OPEN
        assert await one() == LocationSource.GEOCODER
        assert server.calls("amap") == start + 2  # open: the primary is not called
        clock.advance(30.0)
        assert chain.breaker_state("primary") is BreakerState.HALF_OPEN
        assert await one() == LocationSource.GEOCODER  # the trial fails: open again
        assert server.calls("amap") == start + 3
        assert chain.breaker_state("primary") is BreakerState.OPEN
        server.set_mode("amap")
        clock.advance(30.0)
        assert await one() == LocationSource.GEOCODER  # the trial succeeds: closed
        assert server.calls("amap") == start + 4
        assert chain.breaker_state("primary") is BreakerState.CLOSED

    _run(chain, body())
    assert chain.stats()["breaker_opened"]["primary"] == 2


def test_address_variants_share_one_cache_entry(server: GeocodingServer, parts: Any) -> None:
    chain = _chain(server, *parts)
    road = parts[0].roads[3].name
    variants = [
        f"上海市徐汇区{road}310号",
        f"上海 徐汇区 {road}３１０號",
        f"上海徐汇区{road}310#附近",
    ]

    async def body() -> list[int]:
        first = await chain.resolve_locations(variants[:1], ["上海"])
        rest = await chain.resolve_locations(variants[1:], ["上海市", "上海"])
        return [*first.source.tolist(), *rest.source.tolist()]

    assert _run(chain, body()) == [LocationSource.GEOCODER] + [LocationSource.CACHE] * 2


def test_repeated_address_in_a_window_is_asked_once(server: GeocodingServer, parts: Any) -> None:
    chain = _chain(server, *parts)
    text, _ = _address(parts[0], 320)
    before = server.calls("amap")
    found = _run(chain, chain.resolve_locations([text] * 5, ["上海"] * 5))
    assert found.source.tolist() == [LocationSource.GEOCODER] * 5
    assert server.calls("amap") == before + 1


def test_no_address_keeps_the_row_and_no_provider_uses_the_gazetteer(parts: Any) -> None:
    chain = _chain(None, *parts)
    text, truth = _address(parts[0], 330)
    found = _run(chain, chain.resolve_locations(["", text], None))
    assert found.source.tolist() == [LocationSource.GIVEN, LocationSource.GAZETTEER]
    assert np.isnan(found.latlon[0]).all()
    assert _metres(found.latlon[1], truth) < 0.01


def test_unknown_address_names_the_field_and_row_and_the_next_call_is_served(
    server: GeocodingServer, parts: Any
) -> None:
    chain = _chain(server, *parts)
    good, _ = _address(parts[0], 340)

    async def body() -> Resolution:
        with pytest.raises(
            DispatchInputError, match=r"pickup_address: row 1: address '火星基地1号'"
        ):
            await chain.resolve_locations(
                [good, "火星基地1号"], ["上海", "上海"], field="pickup_address"
            )
        return await chain.resolve_locations([good], ["上海"], field="pickup_address")

    # The good row of the refused window was still looked up and cached.
    assert _run(chain, body()).source.tolist() == [LocationSource.CACHE]


@pytest.mark.parametrize(
    ("text", "city", "message"),
    [
        (b"\xff\xfe\x00", "上海", r"dropoff_address: must be valid UTF-8, row 7 is not"),
        ("路" * 100, "上海", r"dropoff_address: must be at most 256 bytes of UTF-8, row 7 has 300"),
        ("上海市徐汇区安平路1号", "亚特兰蒂斯", r"city: row 7: city '亚特兰蒂斯' must be"),
        ("上海市徐汇区安平路1号", "999999", r"city: row 7: city '999999' must be"),
        ("北京市朝阳区建国路1号", "上海", r"dropoff_address: row 7: address"),
    ],
)
def test_bad_input_is_refused_with_field_rule_and_row(
    parts: Any, text: str | bytes, city: str, message: str
) -> None:
    chain = _chain(None, *parts)
    with pytest.raises(DispatchInputError, match=message):
        _run(chain, chain.resolve_locations([text], [city], field="dropoff_address", rows=[7]))


def test_blocking_facade_for_synchronous_callers(server: GeocodingServer, parts: Any) -> None:
    chain = _chain(server, *parts)
    blocking = BlockingGeocoder(chain)
    try:
        text, truth = _address(parts[0], 350)
        found = blocking.resolve_locations([text], ["上海"])
        assert found.source.tolist() == [LocationSource.GEOCODER]
        assert _metres(found.latlon[0], truth) < 1.0
    finally:
        blocking.close()


def test_the_window_deadline_cuts_lookups_that_are_still_waiting(
    server: GeocodingServer, parts: Any
) -> None:
    """Attempts may wait 10 s, the window only 300 ms: the window stops waiting at its
    deadline and answers from the gazetteer; the lookups are late, not failed."""
    server.set_mode("amap", latency_ms=3000)
    server.set_mode("baidu", latency_ms=3000)
    chain = _chain(server, *parts, geocoder_deadline_ms=300.0, geocoder_attempt_timeout_ms=10_000.0)
    texts = [_address(parts[0], n)[0] for n in (400, 410, 420)]
    found = _run(chain, chain.resolve_locations(texts, ["上海"] * 3))
    assert found.source.tolist() == [LocationSource.GAZETTEER] * 3
    stats = chain.stats()
    assert stats["late"] == 3
    assert stats["provider_failures"] == {}  # cut by the deadline, not failed
    assert stats["breakers"] == {"primary": "closed", "secondary": "closed"}


def test_a_late_answer_fills_the_cache_for_the_next_window(
    server: GeocodingServer, parts: Any
) -> None:
    server.set_mode("amap", latency_ms=400)
    chain = _chain(
        server, *parts, secondary=None, geocoder_deadline_ms=300.0,
        geocoder_attempt_timeout_ms=5000.0,
    )  # fmt: skip
    text, truth = _address(parts[0], 430)

    async def body() -> tuple[int, int]:
        first = await chain.resolve_locations([text], ["上海"])
        for _ in range(200):  # the late answer lands within the attempt timeout
            if chain.stats()["late_answers"]:
                break
            await asyncio.sleep(0.05)
        second = await chain.resolve_locations([text], ["上海"])
        assert _metres(second.latlon[0], truth) < 1.0
        return int(first.source[0]), int(second.source[0])

    assert _run(chain, body()) == (LocationSource.GAZETTEER, LocationSource.CACHE)
    assert chain.stats()["late"] == 1


def test_a_place_only_the_provider_knows_and_an_answer_outside_china(
    server: GeocodingServer, parts: Any
) -> None:
    server.add_place("上海市某某新村12号", (31.25, 121.45))
    server.add_place("上海市巴黎路1号", (48.8566, 2.3522))  # a provider answering nonsense
    chain = _chain(server, *parts, secondary=None)

    async def body() -> Resolution:
        known = await chain.resolve_locations(["上海市某某新村12号"], ["上海"])
        with pytest.raises(DispatchInputError, match=r"address: row 0: address '上海市巴黎路1号'"):
            await chain.resolve_locations(["上海市巴黎路1号"], ["上海"])
        return known

    known = _run(chain, body())
    assert known.source.tolist() == [LocationSource.GEOCODER]
    assert _metres(known.latlon[0], (31.25, 121.45)) < 1.0
    assert chain.stats()["provider_failures"] == {"primary": 1}


def test_resolve_cached_answers_warm_texts_without_the_loop_and_counts_once(
    server: GeocodingServer, parts: Any
) -> None:
    chain = _chain(server, *parts)
    known, _ = _address(parts[0], 160)
    other, _ = _address(parts[0], 170)
    estate = "上海市徐汇区康居小区"  # no provider knows it: the gazetteer's
    assert chain.resolve_cached([known], ["上海"]) is None  # never seen
    first = _run(chain, chain.resolve_locations([known, estate], ["上海", "上海"]))
    before = chain.stats()["cache"]
    warm = chain.resolve_cached([known, estate], ["上海", "上海"])
    assert warm is not None
    assert warm.source.tolist() == [LocationSource.CACHE, LocationSource.GAZETTEER]
    np.testing.assert_array_equal(warm.latlon, first.latlon)
    after = chain.stats()["cache"]
    assert (after["hits"] - before["hits"], after["misses"] - before["misses"]) == (1, 0)
    # one text not cached yet: nothing answered and nothing counted
    assert chain.resolve_cached([known, other], ["上海", "上海"]) is None
    assert chain.stats()["cache"] == after
