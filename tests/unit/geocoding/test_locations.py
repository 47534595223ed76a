"""Behaviour of dispatch_service.geocoding.locations: a window's points from coordinates
or addresses, with per-order, per-end source codes."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from geocoding_helpers import ManualClock

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.geocoding.chain import GeocoderChain, GeocoderSettings, LocationSource
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.geocoding.locations import WindowLocations, resolve_window_locations

NAN = float("nan")


@pytest.fixture()
def chain(gazetteer: Gazetteer, recogniser: AdminRecogniser, clock: ManualClock) -> GeocoderChain:
    """No providers configured: every address takes the offline path (source 3)."""
    return GeocoderChain(
        GeocoderSettings(), gazetteer=gazetteer, recogniser=recogniser, clock=clock
    )


def _resolve(chain: GeocoderChain, *args: Any, **kwargs: Any) -> WindowLocations:
    return asyncio.run(resolve_window_locations(chain, *args, **kwargs))


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
