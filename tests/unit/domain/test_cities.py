"""Behaviour of dispatch_service.domain.cities: the shipped registry, its rules, locating."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

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
    document["cities"][1]["area"] = document["cities"][0]["area"]
    document["cities"][1]["centre"] = document["cities"][0]["centre"]
    assert _refused(document) == "cities[1] beijing: its service area overlaps shanghai's"


def test_an_open_polygon_is_refused() -> None:
    document = _document()
    document["cities"][2]["area"] = document["cities"][2]["area"][:-1]
    assert _refused(document).startswith("cities[2] shenzhen: area is an open polygon")


def test_a_crossing_off_its_barrier_is_refused() -> None:
    document = _document()
    crossing = document["cities"][3]["barriers"][0]["crossings"][1]
    crossing[0] += 0.02  # about 2.2 km north
    message = _refused(document)
    assert message.startswith("cities[3] chengdu: barriers[0] jin_river: crossing 1 lies ")
    assert "off the barrier's course" in message


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda c: c.update(timezone="Mars/Olympus"), "is not a known IANA time zone"),
        (lambda c: c.update(id="Shanghai!"), "id must be"),
        (lambda c: c.pop("speeds_kmh"), "missing field 'speeds_kmh'"),
        (lambda c: c.update(road_circuity=0.5), "road_circuity must lie within [1, 3]"),
        (lambda c: c.update(centre=[0.0, 0.0]), "centre lies outside the city's area"),
        (lambda c: c["barriers"][0].update(kind="canal"), "kind must be one of"),
    ],
)
def test_a_bad_entry_is_named_with_its_rule(change: Any, reason: str) -> None:
    document = _document()
    change(document["cities"][0])
    message = _refused(document)
    assert message.startswith("cities[0]") and reason in message


def test_a_name_two_cities_claim_is_refused_at_the_second() -> None:
    document = _document()
    document["cities"][0]["aliases"].append("北京")
    assert _refused(document) == "cities[1] beijing: name '北京' is already shanghai's"


def test_a_registry_file_is_read_and_its_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cities.json"
    document = _document()
    document["cities"] = document["cities"][:2]
    path.write_text(json.dumps(document))
    assert CitySettings(city_registry=str(path)).registry().ids == ("shanghai", "beijing")
    assert CitySettings().registry() is default_registry()
    path.write_text("{not json")
    with pytest.raises(RegistryError, match=f"city registry {path}: "):
        load_registry(path)
    path.write_text(json.dumps({"cities": []}))
    with pytest.raises(RegistryError, match="'cities' is empty"):
        load_registry(path)


def test_the_no_city_label_is_no_citys_id() -> None:
    document = _document()
    document["cities"][3]["id"] = "none"
    assert "is reserved" in _refused(document)


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
