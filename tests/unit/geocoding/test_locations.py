"""Behaviour of dispatch_service.geocoding.locations: a window's points from coordinates
or addresses, with per-order, per-end source codes."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest
from geocoding_helpers import SERVER_KEY, ManualClock
from numpy.typing import NDArray

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import geo
from dispatch_service.geocoding.chain import GeocoderChain, GeocoderSettings, LocationSource
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.geocoding.locations import (
    WindowGeocoder,
    WindowLocations,
    resolve_window_locations,
)
from dispatch_service.offline.geocoding_server import GeocodingServer
from dispatch_service.offline.simulator import generate_window

NAN = float("nan")


@pytest.fixture()
def chain(gazetteer: Gazetteer, recogniser: AdminRecogniser, clock: ManualClock) -> GeocoderChain:
    """No providers configured: every address takes the offline path (source 3)."""
    return GeocoderChain(
        GeocoderSettings(), gazetteer=gazetteer, recogniser=recogniser, clock=clock
    )


def _resolve(
    chain: GeocoderChain,
    pickup: NDArray[np.float64],
    dropoff: NDArray[np.float64],
    *columns: list[Any],
    **kwargs: Any,
) -> WindowLocations:
    """``columns``: the pickup addresses, drop-off addresses and cities."""
    pickup_address, dropoff_address, city = columns
    return asyncio.run(
        resolve_window_locations(
            chain,
            pickup,
            dropoff,
            pickup_address=pickup_address,
            dropoff_address=dropoff_address,
            city=city,
            **kwargs,
        )
    )


def test_coordinates_win_and_nan_rows_take_their_address(
    chain: GeocoderChain, gazetteer: Gazetteer
) -> None:
    road = gazetteer.roads[7]
    pickup = np.array([[31.2, 121.4], [NAN, NAN], [31.3, 121.5]])
    dropoff = np.array([[NAN, NAN], [31.21, 121.41], [31.31, 121.51]])
    found = _resolve(
        chain,
        pickup,
        dropoff,
        ["ignored: coordinates given", f"上海市{road.name}100号", ""],
        ["人民广场", "", ""],
        ["上海", "上海", ""],
    )
    assert found.pickup[0].tolist() == [31.2, 121.4]
    assert found.pickup[1] == pytest.approx(road.point(100))
    assert found.dropoff[0] == pytest.approx(gazetteer.pois[0].latlon)
    assert found.source.tolist() == [[0, 3], [3, 0], [0, 0]]
    assert np.isnan(pickup[1]).all()  # inputs are not modified


def test_nan_coordinates_without_an_address_name_the_field_and_row(chain: GeocoderChain) -> None:
    pickup = np.array([[31.2, 121.4], [NAN, NAN]])
    with pytest.raises(DispatchInputError, match=r"pickup_address: row 1: must be given when"):
        _resolve(chain, pickup, pickup.copy() * 0 + 31.0, ["", ""], ["", ""], ["", ""])


def test_half_given_point_is_refused(chain: GeocoderChain) -> None:
    dropoff = np.array([[31.2, NAN]])
    with pytest.raises(DispatchInputError, match=r"ORDER_DROPOFF: row 0: lat and lon must both"):
        _resolve(chain, np.array([[31.2, 121.4]]), dropoff, [""], ["x"], [""])


def test_unknown_dropoff_address_names_its_field_and_row(chain: GeocoderChain) -> None:
    pickup = np.array([[31.2, 121.4], [31.2, 121.4]])
    dropoff = np.array([[31.2, 121.4], [NAN, NAN]])
    with pytest.raises(DispatchInputError, match=r"dropoff_address: row 1: address '火星基地'"):
        _resolve(chain, pickup, dropoff, ["", ""], ["", "火星基地"], ["", ""])


def test_column_lengths_must_match(chain: GeocoderChain) -> None:
    points = np.array([[31.2, 121.4]])
    with pytest.raises(DispatchInputError, match="must have 1 rows"):
        _resolve(chain, points, points, [], [""], [""])


def test_source_codes_are_the_contract_values() -> None:
    assert [s.value for s in LocationSource] == [0, 1, 2, 3]


# ---- WindowGeocoder: what the encoder calls -------------------------------------------------


def _address_window(gazetteer: Gazetteer) -> Any:
    """A simulated window whose first two orders give their pickup as an address."""
    window = generate_window(np.random.default_rng(5), 4, 6)
    road = gazetteer.roads[3]
    pickup = window.pickup.copy()
    pickup[:2] = NAN
    addresses = np.array(
        [f"上海市{road.name}200号".encode(), "人民广场".encode(), b"", b""], dtype=object
    )
    return dataclasses.replace(
        window,
        pickup=pickup,
        pickup_address=addresses,
        city=np.array(["上海".encode()] * 4, dtype=object),
    )


def test_a_window_with_coordinates_never_builds_the_chain() -> None:
    geocoder = WindowGeocoder()
    window = generate_window(np.random.default_rng(5), 4, 6)
    located, sources = geocoder.locate(window)
    assert located is window
    assert sources.tolist() == [[0, 0]] * 4 and sources.dtype == np.int32
    assert geocoder.observations() == []


def test_the_window_geocoder_fills_nan_points_and_reports_sources_and_metrics(
    server: GeocodingServer, gazetteer: Gazetteer
) -> None:
    # Deadlines far above the defaults (300 ms, 150 ms an attempt): what is tested is which
    # points are filled and how they are reported, not how fast a loaded host answers (a
    # default deadline missed on a busy machine sent the points to the gazetteer instead).
    settings = GeocoderSettings(
        geocoder_primary_url=server.url,
        geocoder_primary_key=SERVER_KEY,
        geocoder_deadline_ms=30_000.0,
        geocoder_attempt_timeout_ms=10_000.0,
    )
    geocoder = WindowGeocoder(settings).warm()
    try:
        window = _address_window(gazetteer)
        located, sources = geocoder.locate(window)
        road = gazetteer.roads[3]
        # the loopback provider answers road + number and POIs (its GCJ-02, converted back)
        assert 1000.0 * float(geo.haversine_km(*located.pickup[0], *road.point(200))) < 5.0
        np.testing.assert_array_equal(located.pickup[2:], window.pickup[2:])
        np.testing.assert_array_equal(located.dropoff, window.dropoff)
        assert sources.tolist() == [[2, 0], [2, 0], [0, 0], [0, 0]]
        metrics = {(o.metric.name, o.labels) for o in geocoder.observations()}
        assert ("dispatch_geocoding_latency_ms", ()) in metrics
        assert ("dispatch_geocoding_locations_total", (("source", "geocoder"),)) in metrics
        # the same window again: both from the cache; the metrics count only the new ones
        _, sources = geocoder.locate(window)
        assert sources[:2, 0].tolist() == [LocationSource.CACHE] * 2
        again = {(o.metric.name, o.labels, o.value) for o in geocoder.observations()}
        assert ("dispatch_geocoding_locations_total", (("source", "cache"),), 2.0) in again
        assert not any(labels == (("source", "geocoder"),) for _, labels, _ in again)
    finally:
        geocoder.close()


def test_window_geocoder_errors_name_the_wire_columns(gazetteer: Gazetteer) -> None:
    geocoder = WindowGeocoder()
    window = _address_window(gazetteer)
    unknown = window.pickup_address.copy()
    unknown[1] = "北京市朝阳区建国路1号".encode()
    try:
        with pytest.raises(DispatchInputError) as caught:
            geocoder.locate(dataclasses.replace(window, pickup_address=unknown))
        assert caught.value.tensor == "ORDER_TEXT[pickup_address]"
        assert "row 1" in caught.value.rule
        cities = np.array(["亚特兰蒂斯".encode()] * 4, dtype=object)
        with pytest.raises(DispatchInputError) as caught:
            geocoder.locate(dataclasses.replace(window, city=cities))
        assert caught.value.tensor == "ORDER_TEXT[city]"
    finally:
        geocoder.close()
