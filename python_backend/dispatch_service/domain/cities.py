"""The city registry: where the service operates, each city's clock and map, and which city
a window lies in.

The registry is one GeoJSON file (RFC 7946: [lon, lat] WGS-84, a FeatureCollection any GIS
tool opens) the operator edits; the shipped one is `DEFAULT_REGISTRY`. Per city one Polygon
feature, its service area, whose properties say the rest (the id, also the `city` label of
the metrics; a name and aliases, what ORDER_TEXT's city column may carry; the time zone;
the centre; the typical free-flow speed per vehicle and the road circuity), one LineString
feature per barrier (river, railway, ring road) and one Point feature per place a barrier
can be crossed. `registry_file` reads it through a schema (pydantic); `registry_from_dict`
refuses a registry that breaks one of the project's rules, naming the entry.

A window is served by the one city all its points lie in (`CityRegistry.locate`): never by
a model answer for a place the registry does not cover. The areas are shapely polygons,
prepared once, tested a whole window at a time (`shapely.contains_xy`), a point that falls in
a grid cell inside the area (built at load) without the polygon test.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import shapely
from numpy.typing import NDArray

from dispatch_contract import Vehicle
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import geo, planar
from dispatch_service.domain.registry_file import (
    BarrierEntry,
    CityEntry,
    RegistryError,
    registry_entries,
)
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.domain.window_wire import wire_name

__all__ = [
    "BARRIER_KINDS",
    "DEFAULT_REGISTRY",
    "NO_CITY",
    "Barrier",
    "City",
    "CityRegistry",
    "CitySettings",
    "RegistryError",
    "RoadNetwork",
    "default_registry",
    "load_registry",
    "registry_from_dict",
]

DEFAULT_REGISTRY: Final = Path(__file__).resolve().parent / "data" / "cities.geojson"
BARRIER_KINDS: Final = ("river", "railway", "ring_road")
# A crossing must lie on its barrier's course within this distance (the file rounds
# coordinates; 1e-5 degrees is about a metre).
CROSSING_TOLERANCE_KM: Final = 0.05
# The `city` label of a window routed without a city (features sent by the caller).
NO_CITY: Final = "none"
_VEHICLE_NAMES: Final = tuple(v.name.lower() for v in Vehicle)
# Cells per side of the grid whose interior cells `City.in_interior_cells` answers for.
INTERIOR_CELLS: Final = 64

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class CitySettings:
    """The encoder's `city_registry` parameter: a registry file; "" = the shipped one."""

    city_registry: str = ""

    def registry(self) -> CityRegistry:
        return load_registry(self.city_registry) if self.city_registry else default_registry()


@dataclass(frozen=True, eq=False)
class Barrier:
    """A line roads cross only at a few points: [M, 2] course and [C, 2] crossings, both as
    (east_km, north_km) of the city's plane. A closed course (first point == last) is a
    ring: crossing it means going between inside and outside."""

    id: str
    kind: str
    course: FloatArray
    crossings: FloatArray


@dataclass(frozen=True, eq=False)
class RoadNetwork:
    """Every barrier of a city at once, for one vectorised pass over a window's legs; what
    depends on the map alone is computed here, once, when the registry is read."""

    segment_start: FloatArray  # [S, 2] every barrier's segments, barrier after barrier
    segment_end: FloatArray
    segment_first: NDArray[np.intp]  # [K] where each barrier's segments start
    crossings: FloatArray  # [C, 2] every barrier's crossings, barrier after barrier
    crossing_first: NDArray[np.intp]  # [K] where each barrier's crossings start
    # The segments' lines ([S, 2] normals, [1, S] offsets: `planar.segment_lines`).
    segment_lines: tuple[FloatArray, FloatArray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lines = planar.segment_lines(self.segment_start, self.segment_end)
        object.__setattr__(self, "segment_lines", lines)

    @classmethod
    def of(cls, barriers: Sequence[Barrier]) -> RoadNetwork:
        count = [barrier.course.shape[0] - 1 for barrier in barriers]
        crossings = [barrier.crossings for barrier in barriers]
        sizes = [c.shape[0] for c in crossings]
        return cls(
            segment_start=np.concatenate([b.course[:-1] for b in barriers] or [np.zeros((0, 2))]),
            segment_end=np.concatenate([b.course[1:] for b in barriers] or [np.zeros((0, 2))]),
            segment_first=_firsts(count),
            crossings=np.concatenate(crossings or [np.zeros((0, 2))]),
            crossing_first=_firsts(sizes),
        )


def _firsts(sizes: Sequence[int]) -> NDArray[np.intp]:
    """Where each of consecutive runs of these sizes starts."""
    return (np.cumsum(sizes) - np.asarray(sizes, dtype=np.intp)).astype(np.intp)


@dataclass(frozen=True, eq=False)
class City:
    """One registered city, its geometry already in its own plane."""

    id: str
    name: str
    aliases: tuple[str, ...]
    timezone: str
    centre: tuple[float, float]  # [lat, lon] WGS-84: the origin of the city's plane
    area: FloatArray  # [V, 2] closed ring of [lat, lon]
    speeds_kmh: FloatArray  # [3] free-flow speed per Vehicle
    road_circuity: float  # road km per straight km
    barriers: tuple[Barrier, ...]
    network: RoadNetwork = field(init=False, repr=False)
    # The area as a prepared shapely polygon of (lon, lat): x east, y north, as in GeoJSON.
    shape: shapely.Polygon = field(init=False, repr=False)
    bounds: FloatArray = field(init=False, repr=False)  # [4] lat, lon low, lat, lon high
    inner: FloatArray = field(init=False, repr=False)  # [4] a box inside the area, likewise
    # [INTERIOR_CELLS, INTERIOR_CELLS]: which cells of a grid over `bounds` lie in the area's
    # interior (`_interior_cells`), and the grid's cells per degree of lat and lon.
    interior: NDArray[np.bool_] = field(init=False, repr=False)
    cells_per_degree: FloatArray = field(init=False, repr=False)
    _zone: ZoneInfo = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_zone", ZoneInfo(self.timezone))
        shape = shapely.Polygon(self.area[:, ::-1])
        shapely.prepare(shape)
        object.__setattr__(self, "shape", shape)
        lo, hi = self.area.min(axis=0), self.area.max(axis=0)
        object.__setattr__(self, "bounds", np.concatenate((lo, hi)))
        object.__setattr__(self, "inner", _inner_box(shape))
        object.__setattr__(self, "interior", _interior_cells(shape, self.bounds))
        scale = INTERIOR_CELLS / np.maximum(hi - lo, np.finfo(np.float64).tiny)
        object.__setattr__(self, "cells_per_degree", scale)
        object.__setattr__(self, "network", RoadNetwork.of(self.barriers))

    def plane(self, latlon: FloatArray) -> FloatArray:
        """[n, 2] (east_km, north_km) of [n, 2] [lat, lon] around the city's centre."""
        east, north = geo.en_offset_km(latlon[..., 0], latlon[..., 1], self.centre)
        return np.stack((east, north), axis=-1)

    def utc_offset_s(self, unix_s: int) -> int:
        """The city's offset from UTC at that instant, seconds (daylight saving included)."""
        offset = self._zone.utcoffset(datetime.fromtimestamp(unix_s, UTC))
        return 0 if offset is None else int(offset.total_seconds())

    def contains(self, latlon: FloatArray) -> NDArray[np.bool_]:
        """[n]: which [lat, lon] points lie inside the service area (a point on its border
        does not)."""
        return np.asarray(shapely.contains_xy(self.shape, latlon[:, 1], latlon[:, 0]))

    def in_interior_cells(self, latlon: FloatArray) -> NDArray[np.bool_]:
        """[n]: which [lat, lon] points (each within `bounds`) fall in a grid cell that lies
        in the area's interior: inside, by a few numpy calls (`contains` pays shapely's fixed
        cost of tens of microseconds per call); False says nothing (ask `contains`)."""
        cell = ((latlon - self.bounds[:2]) * self.cells_per_degree).astype(np.intp)
        np.clip(cell, 0, INTERIOR_CELLS - 1, out=cell)
        inside: NDArray[np.bool_] = self.interior[cell[:, 0], cell[:, 1]]
        return inside


def _inner_box(area: shapely.Polygon) -> FloatArray:
    """[4] (lat low, lon low, lat high, lon high): the square inside the area's largest
    inscribed circle, a box every point of which lies inside the area; `locate`'s quick
    test (four float comparisons) for the usual window."""
    circle = shapely.maximum_inscribed_circle(area)
    centre, edge = shapely.get_coordinates(circle)
    half = 0.999 * math.dist(centre, edge) / math.sqrt(2.0)
    box = np.array([centre[1] - half, centre[0] - half, centre[1] + half, centre[0] + half])
    # the box must lie inside by shapely's own test, not by this construction alone
    if not area.contains(shapely.box(box[1], box[0], box[3], box[2])):
        return np.array([1.0, 1.0, 0.0, 0.0])  # empty: every window takes the full test
    return box


def _interior_cells(area: shapely.Polygon, bounds: FloatArray) -> NDArray[np.bool_]:
    """[INTERIOR_CELLS, INTERIOR_CELLS]: the cells of a grid over ``bounds`` (row: lat, column:
    lon) that, grown by a tenth of a cell each way, lie in the area's interior
    (`shapely.contains_properly`): a point a rounding error outside its cell is still inside."""
    lo, hi = bounds[:2], bounds[2:]
    step = (hi - lo) / INTERIOR_CELLS
    margin = step / 10.0
    rows, cols = np.meshgrid(np.arange(INTERIOR_CELLS), np.arange(INTERIOR_CELLS), indexing="ij")
    lat_lo = lo[0] + rows * step[0] - margin[0]
    lon_lo = lo[1] + cols * step[1] - margin[1]
    boxes = shapely.box(
        lon_lo, lat_lo, lon_lo + step[1] + 2 * margin[1], lat_lo + step[0] + 2 * margin[0]
    )
    return np.asarray(shapely.contains_properly(area, boxes), dtype=np.bool_)


@dataclass(frozen=True, eq=False)
class CityRegistry:
    cities: tuple[City, ...]
    source: str = ""
    _by_name: Mapping[str, City] = field(init=False, repr=False)
    # Per city its bounding box and a box inside its area: (lat low, lon low, lat high,
    # lon high) as Python floats, compared with the window's box without numpy calls.
    _bounding_boxes: tuple[tuple[float, ...], ...] = field(init=False, repr=False)
    _inner_boxes: tuple[tuple[float, ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        names = {}
        for city in self.cities:
            for name in (city.id, city.name, *city.aliases):
                names[name.casefold()] = city
        object.__setattr__(self, "_by_name", names)
        bounding = tuple(tuple(city.bounds.tolist()) for city in self.cities)
        object.__setattr__(self, "_bounding_boxes", bounding)
        boxes = tuple(tuple(city.inner.tolist()) for city in self.cities)
        object.__setattr__(self, "_inner_boxes", boxes)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(city.id for city in self.cities)

    def get(self, name: str) -> City:
        """The city with this id, name or alias (case does not matter); KeyError if none."""
        return self._by_name[name.casefold()]

    def locate(self, window: DispatchWindow) -> City:
        """The city serving ``window``: the one its ORDER_TEXT city column names (where
        sent) and every pickup, drop-off and rider lies in. DispatchInputError (code
        ``city``) naming the first point or row that lies outside every service area, in
        another city than the rest, or outside the city the window names."""
        named = self._named_city(window)
        points = np.concatenate((window.pickup, window.dropoff, window.rider_position))
        # [2, n]: the lat row and the lon row of every point (a row's min and max are one
        # contiguous pass each, where an [n, 2] array's per-column ones are strided).
        rows = np.ascontiguousarray(points.T)
        # The usual window: every point inside the box inside one city's area (the points'
        # box against each city's, on Python floats: four comparisons per city), or one
        # city's bounding box holds every point and its area every point.
        box = (*rows.min(axis=1).tolist(), *rows.max(axis=1).tolist())
        inner = _holding(self.cities, self._inner_boxes, box)
        if len(inner) == 1 and (named is None or named is inner[0]):
            return inner[0]
        boxed = _holding(self.cities, self._bounding_boxes, box)
        if len(boxed) == 1:
            city = boxed[0]
            if named is None or named is city:
                # only points off the area's interior cells need the polygon test
                off = points[~city.in_interior_cells(points)]
                if off.size == 0 or city.contains(off).all():
                    return city
        where = np.full(points.shape[0], -1, dtype=np.int64)
        for number, city in enumerate(self.cities):
            where[(where < 0) & city.contains(points)] = number
        if named is not None:
            expected = self.cities.index(named)
        else:  # the first point's city, unless a point lies in none
            expected = -1 if (where < 0).any() else int(where[0])
        wrong = np.flatnonzero(where != expected if expected >= 0 else where < 0)
        if wrong.size == 0:
            return self.cities[expected]
        first = int(wrong[0])
        tensor, row = _point_name(window, first)
        found = int(where[first])
        if found < 0:
            reason = "lies outside every city's service area"
        elif named is not None:
            reason = (
                f"lies in {self.cities[found].id}, not in {named.id} "
                f"named by {wire_name('ORDER_CITY')}"
            )
        else:
            reason = (
                f"lies in {self.cities[found].id}, the window's first point in "
                f"{self.cities[expected].id}: a window is served in one city"
            )
        raise DispatchInputError(tensor, reason, "city", row=row)

    def _named_city(self, window: DispatchWindow) -> City | None:
        if window.city is None:
            return None
        named: City | None = None
        first_row = -1
        for row, raw in enumerate(window.city.tolist()):
            if not raw:
                continue
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            try:
                city = self.get(text)
            except KeyError:
                raise DispatchInputError(
                    f"{wire_name('ORDER_CITY')} row {row}",
                    "names no registered city",
                    "city",
                ) from None
            if named is None:
                named, first_row = city, row
            elif city is not named:
                raise DispatchInputError(
                    f"{wire_name('ORDER_CITY')} row {row}",
                    f"names {city.id}, row {first_row} names {named.id}: "
                    "a window is served in one city",
                    "city",
                )
        return named


def _holding(
    cities: Sequence[City], boxes: Sequence[tuple[float, ...]], points_box: tuple[float, ...]
) -> list[City]:
    """The cities whose box holds the points' box (each lat low, lon low, lat high, lon high)."""
    lat_lo, lon_lo, lat_hi, lon_hi = points_box
    return [
        city
        for city, (low_lat, low_lon, high_lat, high_lon) in zip(cities, boxes, strict=True)
        if low_lat <= lat_lo and low_lon <= lon_lo and high_lat >= lat_hi and high_lon >= lon_hi
    ]


def _point_name(window: DispatchWindow, index: int) -> tuple[str, int]:
    """Tensor name and row of point ``index`` of (pickups, drop-offs, riders) joined."""
    b = window.num_orders
    if index < b:
        return wire_name("ORDER_PICKUP"), index
    if index < 2 * b:
        return wire_name("ORDER_DROPOFF"), index - b
    return wire_name("RIDER_POSITION"), index - 2 * b


# ------------------------------------------------------------------------------ reading


def load_registry(path: Path | str = DEFAULT_REGISTRY) -> CityRegistry:
    """The registry in a GeoJSON file; RegistryError naming the file and the broken entry."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RegistryError(f"city registry {path}: {exc}") from exc
    try:
        return registry_from_dict(document, source=str(path))
    except RegistryError as exc:
        raise RegistryError(f"city registry {path}: {exc}") from exc


_DEFAULT: dict[str, CityRegistry] = {}


def default_registry() -> CityRegistry:
    """The shipped registry, read once per process."""
    if "registry" not in _DEFAULT:
        _DEFAULT["registry"] = load_registry(DEFAULT_REGISTRY)
    return _DEFAULT["registry"]


def registry_from_dict(document: Any, source: str = "") -> CityRegistry:
    """The registry of a GeoJSON FeatureCollection (`registry_file.registry_document`'s
    layout)."""
    entries = registry_entries(document)
    if not entries:
        raise RegistryError("no service_area feature: a service needs at least one city")
    cities: list[City] = []
    for number, entry in enumerate(entries):
        try:
            cities.append(_city(entry))
        except ValueError as exc:
            raise RegistryError(f"cities[{number}] {entry.id}: {exc}") from None
    _check_distinct(cities)
    return CityRegistry(cities=tuple(cities), source=source)


def _check_distinct(cities: Sequence[City]) -> None:
    owner: dict[str, str] = {}
    for number, city in enumerate(cities):
        for name in {city.id, city.name, *city.aliases}:
            key = name.casefold()
            if key in owner and owner[key] != city.id:
                raise RegistryError(
                    f"cities[{number}] {city.id}: name {name!r} is already {owner[key]}'s"
                )
            owner[key] = city.id
    for i, first in enumerate(cities):
        for j in range(i + 1, len(cities)):
            second = cities[j]
            # interiors meeting in an area (DE-9IM "2********"): borders may touch
            if shapely.relate_pattern(first.shape, second.shape, "2********"):
                raise RegistryError(
                    f"cities[{j}] {second.id}: its service area overlaps {first.id}'s"
                )


def _city(entry: CityEntry) -> City:
    if entry.id == NO_CITY:
        raise ValueError(f"id {NO_CITY!r} is reserved: the metrics' label of no city")
    try:
        ZoneInfo(entry.timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"timezone {entry.timezone!r} is not a known IANA time zone") from None
    area = entry.area
    if area.shape[0] < 4:
        raise ValueError("area must be a ring of at least 4 [lon, lat] points")
    if not np.array_equal(area[0], area[-1]):
        raise ValueError("area is an open polygon: its last point must repeat its first")
    shape = shapely.Polygon(area[:, ::-1])
    if not shapely.is_valid(shape):
        raise ValueError(f"area is not a simple polygon: {shapely.is_valid_reason(shape)}")
    if not shapely.contains_xy(shape, entry.centre[1], entry.centre[0]):
        raise ValueError("centre lies outside the city's area")
    speeds = entry.speeds_kmh
    if sorted(speeds) != sorted(_VEHICLE_NAMES):
        raise ValueError(f"speeds_kmh must give km/h for each of {', '.join(_VEHICLE_NAMES)}")
    speed_array = np.array([float(speeds[v]) for v in _VEHICLE_NAMES])
    if not (np.isfinite(speed_array).all() and (speed_array > 0).all()):
        raise ValueError("speeds_kmh must be positive numbers")
    if not 1.0 <= entry.road_circuity <= 3.0:
        raise ValueError("road_circuity must lie within [1, 3]")
    barriers = [_barrier(item, number, entry.centre) for number, item in enumerate(entry.barriers)]
    ids = [barrier.id for barrier in barriers]
    if len(set(ids)) != len(ids):
        raise ValueError("barrier ids must be unique within the city")
    return City(
        id=entry.id,
        name=entry.name,
        aliases=entry.aliases,
        timezone=entry.timezone,
        centre=entry.centre,
        area=area,
        speeds_kmh=speed_array,
        road_circuity=float(entry.road_circuity),
        barriers=tuple(barriers),
    )


def _barrier(entry: BarrierEntry, number: int, origin: tuple[float, float]) -> Barrier:
    label = f"barriers[{number}] {entry.id}"
    if entry.kind not in BARRIER_KINDS:
        raise ValueError(f"{label}: kind must be one of {', '.join(BARRIER_KINDS)}")
    if entry.crossings.shape[0] == 0:
        raise ValueError(f"{label}: a barrier needs at least one crossing (a Point feature)")
    course = np.stack(geo.en_offset_km(entry.course[:, 0], entry.course[:, 1], origin), axis=1)
    crossings = np.stack(
        geo.en_offset_km(entry.crossings[:, 0], entry.crossings[:, 1], origin), axis=1
    )
    off = shapely.distance(shapely.points(crossings), shapely.LineString(course))
    if (off > CROSSING_TOLERANCE_KM).any():
        at = int(np.argmax(off > CROSSING_TOLERANCE_KM))
        raise ValueError(
            f"{label}: crossing {at} lies {off[at]:.2f} km off the barrier's course "
            f"(at most {CROSSING_TOLERANCE_KM} km)"
        )
    return Barrier(id=entry.id, kind=entry.kind, course=course, crossings=crossings)
