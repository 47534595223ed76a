"""The shipped gazetteer is the one the simulator generates, and it geocodes accurately."""

from __future__ import annotations

import json

import pytest

from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline import gazetteer_build
from dispatch_service.offline.simulator import DEFAULT_CITY


@pytest.fixture(scope="module")
def recogniser() -> AdminRecogniser:
    return AdminRecogniser()


def test_shipped_file_matches_a_fresh_build(recogniser: AdminRecogniser) -> None:
    shipped = json.loads(gazetteer_build.default_path().read_text(encoding="utf-8"))
    assert shipped == gazetteer_build.build_gazetteer(recogniser=recogniser), (
        "stale gazetteer: rerun python -m dispatch_service.offline.gazetteer_build"
    )


def test_entries_are_unambiguous(recogniser: AdminRecogniser) -> None:
    gazetteer = Gazetteer.load()
    names = [road.name for road in gazetteer.roads]
    assert len(names) == len(set(names))
    # No road name reads as a division, so cpca and the road matcher never disagree.
    assert all(recogniser.recognise(name) is None for name in names)
    assert [poi.latlon for poi in gazetteer.pois] == [spot[:2] for spot in DEFAULT_CITY.hot_spots]
    lat0, lat1 = DEFAULT_CITY.core_lat_range
    lon0, lon1 = DEFAULT_CITY.core_lon_range
    for road in gazetteer.roads:
        for lat, lon in (road.start, road.end):
            assert lat0 <= lat <= lat1 and lon0 <= lon <= lon1


def test_road_addresses_of_simulated_orders_are_within_300_m() -> None:
    """The target: median error <= 300 m for road / POI matches against the
    simulator's true points; the district centroid alone is far worse."""
    report = gazetteer_build.gazetteer_accuracy(windows=4, orders=32, seed=11)
    assert report.unresolved == 0
    assert report.road_matches >= 0.9 * report.addresses
    assert report.road_median_m <= 300.0
    assert report.district_only_median_m > 3 * report.road_median_m


def test_address_for_a_point_on_a_road_round_trips(recogniser: AdminRecogniser) -> None:
    gazetteer = Gazetteer.load()
    road = gazetteer.roads[10]
    text, on_road = gazetteer_build.address_for_point(road.point(500), gazetteer, recogniser)
    assert on_road
    assert f"{road.name}500号" in text
