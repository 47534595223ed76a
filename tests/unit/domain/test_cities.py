"""Behaviour of dispatch_service.domain.cities: the shipped registry, its rules, locating."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shapely

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import rejection_observation
from dispatch_service.domain.cities import (
    DEFAULT_REGISTRY,
    CitySettings,
    RegistryError,
    default_registry,
    load_registry,
    registry_from_dict,
)
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline import simulator

DOCUMENT = json.loads(DEFAULT_REGISTRY.read_text())


def _document() -> dict[str, Any]:
    return copy.deepcopy(DOCUMENT)


def _area(document: dict[str, Any], number: int) -> dict[str, Any]:
    """The service area feature of the registry's city ``number``."""
    areas = [f for f in document["features"] if f["properties"]["feature"] == "service_area"]
    return areas[number]


def _city_features(document: dict[str, Any], city: str, kind: str) -> list[dict[str, Any]]:
    return [
        f
        for f in document["features"]
        if f["properties"]["city"] == city and f["properties"]["feature"] == kind
    ]


def _window(city: str, seed: int = 0) -> DispatchWindow:
    world = simulator.city_worlds()[city]
    return simulator.generate_window(np.random.default_rng(seed), 4, 6, config=world)


def test_the_shipped_registry_has_four_different_cities() -> None:
    registry = default_registry()
    assert registry.ids == ("shanghai", "beijing", "shenzhen", "chengdu")
    maps = {
        city.id: (len(city.barriers), tuple(city.speeds_kmh), city.road_circuity)
        for city in registry.cities
    }
    assert len(set(maps.values())) == 4  # every map differs
    assert registry.get("北京") is registry.get("beijing") is registry.get("110000")
    assert registry.get("SHANGHAI").id == "shanghai"
    with pytest.raises(KeyError):
        registry.get("hangzhou")


@pytest.mark.parametrize("city", ["shanghai", "beijing", "shenzhen", "chengdu"])
def test_each_citys_windows_are_located_in_it(city: str) -> None:
    for seed in range(5):
        assert default_registry().locate(_window(city, seed)).id == city


def test_the_time_zone_gives_the_local_offset() -> None:
    shanghai = default_registry().get("shanghai")
    assert shanghai.utc_offset_s(1_709_481_600) == 8 * 3600


def _moved(window: DispatchWindow, field: str, row: int, latlon: tuple[float, float]) -> Any:
    values = getattr(window, field).copy()
    values[row] = latlon
    return dataclasses.replace(window, **{field: values})


NEW_YORK = (40.7128, -74.0060)
BEIJING = (39.9042, 116.4074)


def test_a_point_outside_every_city_is_named() -> None:
    window = _moved(_window("shanghai"), "dropoff", 2, NEW_YORK)
    with pytest.raises(DispatchInputError) as caught:
        default_registry().locate(window)
    assert caught.value.code == "city"
    assert str(caught.value) == (
        "ORDER_FIELDS[dropoff_lat, dropoff_lon] row 2: lies outside every city's service area"
    )
    # The metric's labels stay bounded: the tensor and the rule, never the row.
    labels = dict(rejection_observation(caught.value).labels)
    assert labels == {"tensor": "ORDER_FIELDS[dropoff_lat, dropoff_lon]", "rule": "city"}


def test_a_window_in_two_cities_is_refused_at_its_first_stray_point() -> None:
    window = _moved(_window("shanghai"), "rider_position", 3, BEIJING)
    with pytest.raises(
        DispatchInputError,
        match=r"RIDER_FIELDS\[lat, lon\] row 3: lies in "
        r"beijing, the window's first point in shanghai",
    ):
        default_registry().locate(window)


def test_the_named_city_must_hold_every_point() -> None:
    window = _window("beijing")
    named = dataclasses.replace(window, city=np.array([b"", "上海".encode(), b"", b""], object))
    with pytest.raises(DispatchInputError) as caught:
        default_registry().locate(named)
    assert str(caught.value) == (
        "ORDER_FIELDS[pickup_lat, pickup_lon] row 0: lies in beijing, not in shanghai named "
        "by ORDER_TEXT[city]"
    )
    agreeing = dataclasses.replace(window, city=np.array([b"110000"] * 4, object))
    assert default_registry().locate(agreeing).id == "beijing"


def test_an_unknown_or_second_city_name_is_refused() -> None:
    window = _window("shanghai")
    unknown = dataclasses.replace(window, city=np.array([b"", b"", b"Atlantis", b""], object))
    with pytest.raises(DispatchInputError, match=r"ORDER_TEXT\[city\] row 2: names no registered"):
        default_registry().locate(unknown)
    two = dataclasses.replace(window, city=np.array([b"shanghai", b"beijing", b"", b""], object))
    with pytest.raises(DispatchInputError, match=r"row 1: names beijing, row 0 names shanghai"):
        default_registry().locate(two)


def _refused(document: dict[str, Any]) -> str:
    with pytest.raises(RegistryError) as caught:
        registry_from_dict(document)
    return str(caught.value)


def test_overlapping_areas_refuse_the_registry_naming_the_entry() -> None:
    document = _document()
    _area(document, 1)["geometry"] = _area(document, 0)["geometry"]
    _area(document, 1)["properties"]["centre"] = _area(document, 0)["properties"]["centre"]
    assert _refused(document) == "cities[1] beijing: its service area overlaps shanghai's"


def test_areas_that_only_share_a_border_do_not_overlap() -> None:
    document = _document()
    # Beijing's area moved to share Shanghai's eastern edge (x = 121.85) and nothing more.
    ring = [[121.85, 31.0], [122.3, 31.0], [122.3, 31.4], [121.85, 31.4], [121.85, 31.0]]
    _area(document, 1)["geometry"] = {"type": "Polygon", "coordinates": [ring]}
    _area(document, 1)["properties"]["centre"] = [122.0, 31.2]
    document["features"] = [
        f
        for f in document["features"]
        if f["properties"]["city"] != "beijing" or f["properties"]["feature"] == "service_area"
    ]
    assert registry_from_dict(document).get("beijing").contains(np.array([[31.2, 122.0]]))[0]


def test_an_open_polygon_is_refused() -> None:
    document = _document()
    ring = _area(document, 2)["geometry"]["coordinates"][0]
    _area(document, 2)["geometry"]["coordinates"][0] = ring[:-1]
    assert _refused(document).startswith("cities[2] shenzhen: area is an open polygon")


def test_a_crossing_off_its_barrier_is_refused() -> None:
    document = _document()
    crossings = [
        f for f in _city_features(document, "chengdu", "crossing")
        if f["properties"]["barrier"] == "jin_river"
    ]  # fmt: skip
    crossings[1]["geometry"]["coordinates"][1] += 0.02  # about 2.2 km north
    message = _refused(document)
    assert message.startswith("cities[3] chengdu: barriers[0] jin_river: crossing 1 lies ")
    assert "off the barrier's course" in message


def _set(key: str, value: Any) -> Any:
    return lambda document: _area(document, 0)["properties"].update({key: value})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_set("timezone", "Mars/Olympus"), "is not a known IANA time zone"),
        (_set("city", "Shanghai!"), "id must be"),
        (lambda d: _area(d, 0)["properties"].pop("speeds_kmh"), "missing field 'speeds_kmh'"),
        (_set("road_circuity", 0.5), "road_circuity must lie within [1, 3]"),
        (_set("centre", [0.0, 0.0]), "centre lies outside the city's area"),
        (
            lambda d: _city_features(d, "shanghai", "barrier")[0]["properties"].update(
                kind="canal"
            ),
            "kind must be one of",
        ),
        (_set("aliases", "上海"), "aliases: Input should be a valid list"),
        (_set("speeds_kmh", {"ebike": 15.0, "car": 30.0}), "speeds_kmh must give km/h for"),
        (
            lambda d: _area(d, 0)["geometry"]["coordinates"][0].insert(1, [121.9, 31.6]),
            "area is not a simple polygon: Self-intersection",
        ),
        (
            lambda d: _area(d, 0)["geometry"]["coordinates"].append(
                [[121.4, 31.1], [121.5, 31.1], [121.5, 31.2], [121.4, 31.1]]
            ),
            "area must be one ring (no holes)",
        ),
    ],
)
def test_a_bad_entry_is_named_with_its_rule(change: Any, reason: str) -> None:
    document = _document()
    change(document)
    message = _refused(document)
    assert message.startswith("cities[0]") and reason in message


def test_a_registry_in_lat_lon_order_is_refused_by_its_first_point() -> None:
    """GeoJSON's positions are [lon, lat] (RFC 7946); the old [lat, lon] order puts
    Shanghai's latitude 121 out of range, and the registry says so at the first city."""
    document = _document()
    for feature in document["features"]:
        geometry = feature["geometry"]
        if geometry["type"] == "Polygon":
            geometry["coordinates"] = [[p[::-1] for p in ring] for ring in geometry["coordinates"]]
    message = _refused(document)
    assert message.startswith("cities[0] shanghai: coordinates.0.0 holds a point outside")


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ({"cities": []}, "must be a GeoJSON FeatureCollection: missing field 'type'"),
        (
            {"type": "FeatureCollection", "features": []},
            "no service_area feature: a service needs at least one city",
        ),
        (
            {
                "type": "FeatureCollection",
                "features": [
                    {"type": "Feature", "geometry": {}, "properties": {"feature": "lake"}}
                ],
            },
            "features[0]: properties.feature must be one of service_area, barrier, crossing",
        ),
    ],
)
def test_a_document_that_is_no_registry_is_refused(document: Any, reason: str) -> None:
    assert _refused(document) == reason


def test_a_barrier_or_crossing_of_no_city_or_barrier_is_refused() -> None:
    document = _document()
    _city_features(document, "beijing", "crossing")[0]["properties"]["barrier"] = "third_ring"
    assert _refused(document) == "a crossing names barrier 'third_ring' of beijing: no such barrier"
    document = _document()
    _city_features(document, "beijing", "barrier")[0]["properties"]["city"] = "tianjin"
    assert _refused(document) == "a barrier or crossing names city 'tianjin', which has no area"


def test_a_name_two_cities_claim_is_refused_at_the_second() -> None:
    document = _document()
    _area(document, 0)["properties"]["aliases"].append("北京")
    assert _refused(document) == "cities[1] beijing: name '北京' is already shanghai's"


def test_a_registry_file_is_read_and_its_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cities.geojson"
    document = _document()
    document["features"] = [
        f for f in document["features"] if f["properties"]["city"] in ("shanghai", "beijing")
    ]
    path.write_text(json.dumps(document))
    assert CitySettings(city_registry=str(path)).registry().ids == ("shanghai", "beijing")
    assert CitySettings().registry() is default_registry()
    path.write_text("{not json")
    with pytest.raises(RegistryError, match=f"city registry {path}: "):
        load_registry(path)
    path.write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    with pytest.raises(RegistryError, match="no service_area feature"):
        load_registry(path)


def test_the_no_city_label_is_no_citys_id() -> None:
    document = _document()
    for feature in document["features"]:
        if feature["properties"]["city"] == "chengdu":
            feature["properties"]["city"] = "none"
    assert "is reserved" in _refused(document)


def test_the_shipped_file_is_geojson_a_gis_reader_places_correctly() -> None:
    """GEOS's own GeoJSON reader (not this module's schema) reads the file; its x is the
    longitude: each area holds its city's centre as (lon, lat) and its counter-clockwise
    exterior follows RFC 7946's right-hand rule."""
    collection = shapely.from_geojson(DEFAULT_REGISTRY.read_text())
    parts = shapely.get_parts(collection)
    areas = [part for part in parts if part.geom_type == "Polygon"]
    assert len(areas) == 4
    assert {part.geom_type for part in parts} == {"Polygon", "LineString", "Point"}
    landmarks = {  # (lon, lat) of a well-known place in each city
        "shanghai": (121.4737, 31.2304),  # People's Square
        "beijing": (116.3972, 39.9163),  # the Forbidden City
        "shenzhen": (114.0579, 22.5431),  # Futian
        "chengdu": (104.0657, 30.6595),  # Tianfu Square
    }
    for area, (lon, lat) in zip(areas, landmarks.values(), strict=True):
        assert area.contains(shapely.Point(lon, lat))
        assert shapely.is_ccw(area.exterior)


def _where(window: DispatchWindow) -> set[str | None]:
    """The cities whose areas hold each point (`City.contains`, point by point); None for
    a point no city holds."""
    registry = default_registry()
    points = np.concatenate((window.pickup, window.dropoff, window.rider_position))
    found: set[str | None] = set()
    for point in points:
        inside = [city.id for city in registry.cities if city.contains(point[None, :])[0]]
        found.add(inside[0] if inside else None)
    return found


@pytest.mark.parametrize("seed", range(4))
def test_locating_agrees_with_each_points_city_near_borders_and_across_cities(seed: int) -> None:
    """The quick tests (every point in a box inside one area, or one bounding box) give what
    testing each point's city gives: on simulated windows, with points moved onto and a
    hair either side of a city's border vertices, and into another city."""
    registry = default_registry()
    rng = np.random.default_rng(seed)
    for city in registry.cities:
        others = [other for other in registry.cities if other is not city]
        for trial in range(12):
            window = _window(city.id, seed * 100 + trial)
            moves = int(rng.integers(0, 3))
            for _ in range(moves):
                field = ("pickup", "dropoff", "rider_position")[int(rng.integers(3))]
                row = int(rng.integers(getattr(window, field).shape[0]))
                owner = city if rng.random() < 0.7 else others[int(rng.integers(3))]
                vertex = owner.area[int(rng.integers(owner.area.shape[0] - 1))]
                towards = np.asarray(owner.centre) - vertex
                shift = float(rng.choice([-1e-9, 0.0, 1e-9, 1e-3]))
                point = vertex + shift * towards
                window = _moved(window, field, row, (float(point[0]), float(point[1])))
            found = _where(window)
            if len(found) == 1 and None not in found:
                assert registry.locate(window).id == found.pop()
            else:
                with pytest.raises(DispatchInputError) as caught:
                    registry.locate(window)
                assert caught.value.code == "city"


def test_a_point_in_an_interior_cell_lies_inside_the_area_by_shapely() -> None:
    """`City.in_interior_cells` (the grid `locate` asks before the polygon test) says
    inside only where shapely's own point test says inside: random points over each city's
    bounding box, every cell corner and every area vertex; and it answers for most of the
    area, or it would save nothing."""
    rng = np.random.default_rng(7)
    for city in default_registry().cities:
        lo, hi = city.bounds[:2], city.bounds[2:]
        corners = np.linspace(0.0, 1.0, 65)
        grid = np.stack(np.meshgrid(corners, corners, indexing="ij"), axis=-1).reshape(-1, 2)
        points = np.concatenate((lo + rng.random((20_000, 2)) * (hi - lo), lo + grid * (hi - lo)))
        points = np.concatenate((points, city.area))
        inside = shapely.contains_xy(city.shape, points[:, 1], points[:, 0])
        fast = city.in_interior_cells(points)
        assert not (fast & ~inside).any(), city.id
        assert fast.sum() > 0.8 * inside.sum(), city.id
