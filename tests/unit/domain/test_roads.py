"""Behaviour of dispatch_service.domain.roads on a hand-made map."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_service.domain import roads
from dispatch_service.domain.cities import City, registry_from_dict
from dispatch_service.domain.registry_file import BarrierEntry, CityEntry, registry_document

CENTRE = (30.0, 110.0)
KM_LAT = 1.0 / 111.19508  # degrees of latitude per km (mean Earth radius)


def _ll(east_km: float, north_km: float) -> list[float]:
    lat = CENTRE[0] + north_km * KM_LAT
    lon = CENTRE[1] + east_km * KM_LAT / np.cos(np.radians((lat + CENTRE[0]) / 2))
    return [lat, lon]


def _city() -> City:
    """A square city 40 km wide: a river along east = 0 crossed at north -5 and +5, and a
    ring road around the square 2 km wide at the centre, crossed at its east side."""
    ring = [(-2.0, -2.0), (2.0, -2.0), (2.0, 2.0), (-2.0, 2.0), (-2.0, -2.0)]
    square = [(-20, -20), (20, -20), (20, 20), (-20, 20), (-20, -20)]
    entry = CityEntry(
        id="square",
        name="Square",
        aliases=(),
        timezone="Etc/UTC",
        centre=CENTRE,
        area=np.array([_ll(e, n) for e, n in square]),
        speeds_kmh={"ebike": 15.0, "motorbike": 20.0, "car": 30.0},
        road_circuity=1.5,
        barriers=(
            BarrierEntry(
                id="river",
                kind="river",
                course=np.array([_ll(0.0, -30.0), _ll(0.0, 30.0)]),
                crossings=np.array([_ll(0.0, -5.0), _ll(0.0, 5.0)]),
            ),
            BarrierEntry(
                id="ring",
                kind="ring_road",
                course=np.array([_ll(e, n) for e, n in ring]),
                crossings=np.array([_ll(2.0, 0.0)]),
            ),
        ),
    )
    return registry_from_dict(registry_document([entry])).cities[0]


def test_a_leg_across_the_river_goes_through_the_best_crossing() -> None:
    city = _city()
    start = np.array([[-3.0, 4.0], [-3.0, 4.0], [-3.0, -9.0]])
    end = np.array([[3.0, 4.0], [-6.0, 8.0], [3.0, -9.0]])
    legs = roads.leg_roads(city, start, end)
    np.testing.assert_array_equal(legs.crossed[:, 0], [True, False, True])
    np.testing.assert_array_equal(legs.crossings, [1, 0, 1])
    first = 2 * np.hypot(3.0, 1.0) - 6.0  # via (0, 5)
    third = 2 * np.hypot(3.0, 4.0) - 6.0  # via (0, -5)
    np.testing.assert_allclose(legs.detour_km, [first, 0.0, third], atol=1e-3)
    np.testing.assert_allclose(legs.direct_km, [6.0, 5.0, 6.0], atol=1e-3)


def test_detours_of_several_barriers_add_up() -> None:
    city = _city()
    # From inside the ring (west of the river) to the far east: ring and river both.
    legs = roads.leg_roads(city, np.array([[-1.0, 0.0]]), np.array([[9.0, 0.0]]))
    assert legs.crossings[0] == 2
    river = np.hypot(1.0, 5.0) + np.hypot(9.0, 5.0) - 10.0
    ring = np.hypot(3.0, 0.0) + np.hypot(7.0, 0.0) - 10.0  # on the way: no detour
    assert legs.detour_km[0] == pytest.approx(river + ring, abs=1e-3)


def test_route_minutes_use_the_citys_speeds_and_circuity() -> None:
    city = _city()
    legs = roads.leg_roads(city, np.array([[5.0, 0.0], [5.0, 0.0]]), np.array([[5.0, 3.0]] * 2))
    minutes = roads.route_minutes(city, legs.road_km(city), np.array([0, 2]))
    np.testing.assert_allclose(minutes, [3.0 * 1.5 / 15 * 60, 3.0 * 1.5 / 30 * 60], rtol=1e-4)
