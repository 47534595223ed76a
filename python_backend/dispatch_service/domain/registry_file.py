"""The city registry's file: GeoJSON (RFC 7946) read through a schema, and written.

A `FeatureCollection` of [lon, lat] WGS-84 positions that any GIS tool opens: per city one
`Polygon` feature, its service area, whose properties carry the rest of its entry, one
`LineString` per barrier and one `Point` per crossing (`docs/cities.md`). pydantic checks
the shapes and types (`registry_entries`, a RegistryError naming the feature or the city);
the project's rules on what the entries mean are `domain.cities`'. [lat, lon] is the
library's order: positions are turned here, once, each way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import numpy as np
import shapely
from numpy.typing import NDArray
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "CITY_ID",
    "BarrierEntry",
    "CityEntry",
    "RegistryError",
    "registry_document",
    "registry_entries",
    "registry_text",
]

FloatArray = NDArray[np.float64]
# A city's id: the `city` label of the metrics.
CITY_ID: Final = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class RegistryError(ValueError):
    """The registry breaks a rule; the message names the entry (``cities[1] beijing: ...``)."""


@dataclass(frozen=True)
class BarrierEntry:
    """One barrier as the file gives it: [lat, lon] course and crossings."""

    id: str
    kind: str
    course: FloatArray
    crossings: FloatArray


@dataclass(frozen=True)
class CityEntry:
    """One city as the file gives it, before the rules: [lat, lon] points throughout (the
    file's [lon, lat] turned once, here)."""

    id: str
    name: str
    aliases: tuple[str, ...]
    timezone: str
    centre: tuple[float, float]
    area: FloatArray
    speeds_kmh: Mapping[str, float]
    road_circuity: float
    barriers: tuple[BarrierEntry, ...] = ()


# ------------------------------------------------------------------------ the file's schema


def _lon_lat(point: tuple[float, float]) -> tuple[float, float]:
    lon, lat = point
    if abs(lat) > 90.0 or abs(lon) > 180.0:
        raise ValueError("holds a point outside [-180, 180] x [-90, 90] ([lon, lat])")
    return point


# RFC 7946 positions: [lon, lat], two finite numbers (the registry is flat: an altitude is
# refused).
Position = Annotated[
    tuple[
        Annotated[float, Field(allow_inf_nan=False)], Annotated[float, Field(allow_inf_nan=False)]
    ],
    AfterValidator(_lon_lat),
]


class _Strict(BaseModel):
    # a geometry's other members (a bbox a GIS tool wrote) are not the registry's
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Polygon(_Strict):
    type: Literal["Polygon"]
    coordinates: list[list[Position]]


class _LineString(_Strict):
    type: Literal["LineString"]
    coordinates: list[Position] = Field(min_length=2)


class _Point(_Strict):
    type: Literal["Point"]
    coordinates: Position


class _AreaProperties(BaseModel):
    """A service area's properties: the city (other properties are the operator's)."""

    feature: Literal["service_area"]
    city: str
    name: str = Field(min_length=1)
    aliases: list[Annotated[str, Field(min_length=1)]] = []
    timezone: str
    centre: Position
    speeds_kmh: dict[str, float]
    road_circuity: float


class _BarrierProperties(BaseModel):
    feature: Literal["barrier"]
    city: str
    barrier: str = Field(min_length=1)
    kind: str


class _CrossingProperties(BaseModel):
    feature: Literal["crossing"]
    city: str
    barrier: str


class _Feature(BaseModel):
    type: Literal["Feature"]
    id: str | int | None = None
    geometry: dict[str, Any]
    properties: dict[str, Any]


class _FeatureCollection(BaseModel):
    type: Literal["FeatureCollection"]
    features: list[_Feature]


def _reason(error: ValidationError) -> str:
    """A schema error as the registry's messages say it: the field and the rule."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    if first["type"] == "missing":
        return f"missing field {str(first['loc'][-1])!r}"
    if first["type"] == "value_error":
        return f"{where} {first['ctx']['error']}"
    return f"{where}: {first['msg']}"


def registry_entries(document: Any) -> list[CityEntry]:
    """Each city's entry of a registry document, in its service areas' order; RegistryError
    naming the feature or city whose shape or type the schema refuses."""
    try:
        collection = _FeatureCollection.model_validate(document)
    except ValidationError as exc:
        raise RegistryError(f"must be a GeoJSON FeatureCollection: {_reason(exc)}") from None
    areas: list[tuple[str, _AreaProperties, _Polygon]] = []
    lines: dict[str, list[tuple[str, _BarrierProperties, _LineString]]] = {}
    points: dict[tuple[str, str], list[_Point]] = {}
    for number, feature in enumerate(collection.features):
        kind = feature.properties.get("feature")
        city = feature.properties.get("city")
        label = f"cities[{len(areas)}] {city}" if kind == "service_area" else f"features[{number}]"
        try:
            if kind == "service_area":
                if not isinstance(city, str) or not CITY_ID.match(city):
                    raise ValueError(
                        "id must be 1-32 lower-case letters, digits or '_', starting a letter"
                    )
                area = _AreaProperties.model_validate(feature.properties)
                areas.append((city, area, _Polygon.model_validate(feature.geometry)))
            elif kind == "barrier":
                barrier = _BarrierProperties.model_validate(feature.properties)
                line = _LineString.model_validate(feature.geometry)
                lines.setdefault(barrier.city, []).append((barrier.barrier, barrier, line))
            elif kind == "crossing":
                crossing = _CrossingProperties.model_validate(feature.properties)
                point = _Point.model_validate(feature.geometry)
                points.setdefault((crossing.city, crossing.barrier), []).append(point)
            else:
                raise ValueError(
                    "properties.feature must be one of service_area, barrier, crossing"
                )
        except ValidationError as exc:
            raise RegistryError(f"{label}: {_reason(exc)}") from None
        except ValueError as exc:
            raise RegistryError(f"{label}: {exc}") from None
    ids = [city for city, _, _ in areas]
    for city_id in [*lines, *(city for city, _ in points)]:
        if city_id not in ids:
            raise RegistryError(f"a barrier or crossing names city {city_id!r}, which has no area")
    entries = []
    for city_id, props, polygon in areas:
        barriers = []
        for barrier_id, barrier_props, course in lines.get(city_id, []):
            crossings = points.pop((city_id, barrier_id), [])
            barriers.append(
                BarrierEntry(
                    id=barrier_id,
                    kind=barrier_props.kind,
                    course=_lat_lon(course.coordinates),
                    crossings=_lat_lon([p.coordinates for p in crossings]).reshape(-1, 2),
                )
            )
        entries.append(
            CityEntry(
                id=city_id,
                name=props.name,
                aliases=tuple(props.aliases),
                timezone=props.timezone,
                centre=(props.centre[1], props.centre[0]),
                area=_lat_lon(polygon.coordinates[0]) if polygon.coordinates else np.zeros((0, 2)),
                speeds_kmh=props.speeds_kmh,
                road_circuity=props.road_circuity,
                barriers=tuple(barriers),
            )
        )
        if len(polygon.coordinates) > 1:
            number = len(entries) - 1
            raise RegistryError(f"cities[{number}] {city_id}: area must be one ring (no holes)")
    if points:
        city_id, barrier_id = next(iter(points))
        raise RegistryError(
            f"a crossing names barrier {barrier_id!r} of {city_id}: no such barrier"
        )
    return entries


def _lat_lon(positions: Sequence[tuple[float, float]]) -> FloatArray:
    """[n, 2] [lat, lon] of GeoJSON [lon, lat] positions."""
    return np.asarray(positions, dtype=np.float64).reshape(-1, 2)[:, ::-1].copy()


# ------------------------------------------------------------------------------ writing


def registry_document(entries: Sequence[CityEntry], *, about: str = "") -> dict[str, Any]:
    """A registry file's GeoJSON FeatureCollection of these entries: per city its area
    (Polygon, counter-clockwise as RFC 7946 asks), its barriers (LineString) and their
    crossings (Point), [lon, lat] throughout."""
    features: list[dict[str, Any]] = []
    for entry in entries:
        ring = shapely.Polygon(entry.area[:, ::-1])
        ring = shapely.orient_polygons(ring) if hasattr(shapely, "orient_polygons") else ring
        features.append(
            {
                "type": "Feature",
                "id": entry.id,
                "geometry": {"type": "Polygon", "coordinates": [_positions(ring.exterior.coords)]},
                "properties": {
                    "feature": "service_area",
                    "city": entry.id,
                    "name": entry.name,
                    "aliases": list(entry.aliases),
                    "timezone": entry.timezone,
                    "centre": [entry.centre[1], entry.centre[0]],
                    "speeds_kmh": dict(entry.speeds_kmh),
                    "road_circuity": entry.road_circuity,
                },
            }
        )
        for barrier in entry.barriers:
            features.append(
                {
                    "type": "Feature",
                    "id": f"{entry.id}/{barrier.id}",
                    "geometry": {
                        "type": "LineString",
                        "coordinates": _positions(barrier.course[:, ::-1]),
                    },
                    "properties": {
                        "feature": "barrier",
                        "city": entry.id,
                        "barrier": barrier.id,
                        "kind": barrier.kind,
                    },
                }
            )
            for number, point in enumerate(barrier.crossings):
                features.append(
                    {
                        "type": "Feature",
                        "id": f"{entry.id}/{barrier.id}/{number}",
                        "geometry": {"type": "Point", "coordinates": [point[1], point[0]]},
                        "properties": {
                            "feature": "crossing",
                            "city": entry.id,
                            "barrier": barrier.id,
                        },
                    }
                )
    document: dict[str, Any] = {"type": "FeatureCollection"}
    if about:
        document["about"] = about
    document["features"] = features
    return document


def _positions(points: Any) -> list[list[float]]:
    return [[float(x), float(y)] for x, y in np.asarray(points, dtype=np.float64)]


def registry_text(document: Mapping[str, Any]) -> str:
    """A registry document as the shipped file is written: one feature a line, so that a
    change to one city's map is a change to its lines."""
    head = {key: value for key, value in document.items() if key != "features"}
    lines = [
        f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}"
        for key, value in head.items()
    ]
    features = [f"  {json.dumps(feature, ensure_ascii=False)}" for feature in document["features"]]
    return (
        "{\n" + ",\n".join([*lines, ' "features": [\n' + ",\n".join(features) + "\n ]"]) + "\n}\n"
    )
