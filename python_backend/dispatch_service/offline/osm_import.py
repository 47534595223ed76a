"""A city registry entry from an OpenStreetMap extract: its administrative boundary as the
service area, its rivers and railways as barriers, and the bridges, tunnels and level
crossings over them as crossings.

`python -m dispatch_service.offline.osm_import EXTRACT.osm --id wuhan --timezone
Asia/Shanghai --speeds-kmh 16,23,28 --road-circuity 1.4 [--registry cities.geojson] --out
new.geojson` reads an OSM XML extract (what the OpenStreetMap export, Overpass or osmium
write) and writes a registry (`docs/cities.md`): the given registry's cities and the new
one, checked by the registry's own rules (`cities.registry_from_dict`) before anything is
written. What OSM does not say (the time zone, the riders' free-flow speeds, the road
circuity) the operator gives.

From the extract:

- the area: the relation (or closed way) tagged ``boundary=administrative`` (the one
  ``--boundary`` names where the extract holds several), its outer ways joined into one ring,
  simplified to ``--simplify-m``; its ``name:en`` (else ``name``) is the city's name, its
  ``name`` and ``ref`` the aliases, its ``admin_centre`` member the centre (else a point
  inside the area);
- barriers: the ways tagged ``waterway=river`` and ``railway=rail``, those of one name
  joined into one course each, cut to the area (a kilometre's margin);
- crossings: where a way tagged ``bridge`` or ``tunnel`` (a road's or a railway's over a
  river, a road's under a railway) meets a barrier's course, and the nodes tagged
  ``railway=level_crossing`` on a railway. A barrier with no crossing is left out, named in
  the report (roads cannot cross it, so the registry cannot hold it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import shapely

from dispatch_service.domain.cities import RegistryError, registry_from_dict
from dispatch_service.domain.registry_file import (
    BarrierEntry,
    CityEntry,
    registry_document,
    registry_text,
)

__all__ = ["CityEntry", "OsmExtract", "city_entry", "main", "read_osm"]

# Kilometres of barrier course kept beyond the area's border (so that a course crosses it).
_MARGIN_KM: Final = 1.0
_KM_PER_DEGREE: Final = 111.19508
_BARRIER_TAGS: Final = (("waterway", "river", "river"), ("railway", "rail", "railway"))


@dataclass(frozen=True)
class OsmExtract:
    """The parts of an OSM extract the importer reads: node positions (lon, lat), ways as
    node lists with tags, relations as members with tags."""

    nodes: dict[str, tuple[float, float]]
    node_tags: dict[str, dict[str, str]]
    ways: dict[str, tuple[list[str], dict[str, str]]]
    relations: list[tuple[list[tuple[str, str, str]], dict[str, str]]]

    def line(self, way: str) -> shapely.LineString:
        """A way as a (lon, lat) line; KeyError naming a node the extract lacks."""
        refs = self.ways[way][0]
        missing = [ref for ref in refs if ref not in self.nodes]
        if missing:
            raise KeyError(f"way {way} refers to node {missing[0]}, which the extract lacks")
        return shapely.LineString([self.nodes[ref] for ref in refs])


def read_osm(path: Path) -> OsmExtract:
    """An OSM XML file's nodes, ways and relations."""
    root = ElementTree.parse(path).getroot()
    if root.tag != "osm":
        raise ValueError(f"{path}: not an OSM XML file (root element {root.tag!r})")
    nodes, node_tags = {}, {}
    ways = {}
    relations = []
    for element in root:
        tags = {tag.get("k", ""): tag.get("v", "") for tag in element.iter("tag")}
        if element.tag == "node":
            number = element.get("id", "")
            nodes[number] = (float(element.get("lon", "nan")), float(element.get("lat", "nan")))
            if tags:
                node_tags[number] = tags
        elif element.tag == "way":
            refs = [nd.get("ref", "") for nd in element.iter("nd")]
            ways[element.get("id", "")] = (refs, tags)
        elif element.tag == "relation":
            members = [
                (m.get("type", ""), m.get("ref", ""), m.get("role", ""))
                for m in element.iter("member")
            ]
            relations.append((members, tags))
    return OsmExtract(nodes=nodes, node_tags=node_tags, ways=ways, relations=relations)


def _boundary(
    extract: OsmExtract, name: str | None
) -> tuple[shapely.Polygon, dict[str, str], str | None]:
    """The administrative boundary named ``name`` (``name`` or ``name:en``; without one, the
    extract's only boundary): (lon, lat) polygon, its tags, its admin_centre node."""
    found: list[tuple[shapely.Polygon, dict[str, str], str | None]] = []
    for members, tags in extract.relations:
        if tags.get("boundary") != "administrative":
            continue
        outer = [
            extract.line(ref)
            for kind, ref, role in members
            if kind == "way" and role in ("outer", "")
        ]
        polygons = shapely.get_parts(shapely.polygonize(outer))
        if len(polygons) != 1:
            raise ValueError(
                f"boundary {tags.get('name', '?')}: its outer ways make {len(polygons)} rings, "
                "not one"
            )
        centre = next((ref for kind, ref, role in members if role == "admin_centre"), None)
        found.append((polygons[0], tags, centre))
    for refs, tags in extract.ways.values():
        if tags.get("boundary") == "administrative" and len(refs) > 3 and refs[0] == refs[-1]:
            ring = shapely.Polygon([extract.nodes[ref] for ref in refs])
            found.append((ring, tags, None))
    names = [tags.get("name:en") or tags.get("name", "?") for _, tags, _ in found]
    if name is not None:
        found = [item for item in found if name in (item[1].get("name"), item[1].get("name:en"))]
    if len(found) != 1:
        raise ValueError(
            f"the extract holds {len(found)} boundary=administrative relations or closed "
            f"ways{' named ' + repr(name) if name else ''} (of {', '.join(names) or 'none'}): "
            "name one with --boundary"
        )
    return found[0]


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", text.casefold()).strip("_")
    return slug if slug and slug[0].isalpha() else f"b_{slug}"


def _barriers(extract: OsmExtract, area: shapely.Polygon) -> tuple[list[BarrierEntry], list[str]]:
    """The area's barriers with their crossings, and the names of those left out."""
    margin = area.buffer(_MARGIN_KM / _KM_PER_DEGREE)
    courses: dict[tuple[str, str], list[shapely.LineString]] = {}
    for way, (_, tags) in extract.ways.items():
        for key, value, kind in _BARRIER_TAGS:
            if tags.get(key) == value and tags.get("bridge") is None and tags.get("tunnel") is None:
                name = tags.get("name:en") or tags.get("name") or f"{kind} {way}"
                courses.setdefault((kind, name), []).append(extract.line(way))
    over = [  # ways that pass over or under something: bridges and tunnels
        extract.line(way)
        for way, (_, tags) in extract.ways.items()
        if tags.get("bridge", "no") != "no" or tags.get("tunnel", "no") != "no"
    ]
    level = [
        shapely.Point(extract.nodes[node])
        for node, tags in extract.node_tags.items()
        if tags.get("railway") == "level_crossing"
    ]
    barriers, left_out = [], []
    for (kind, name), parts in courses.items():
        merged = shapely.line_merge(shapely.intersection(shapely.MultiLineString(parts), margin))
        if merged.is_empty:
            continue
        if merged.geom_type != "LineString":
            left_out.append(f"{name}: its ways inside the area do not join into one course")
            continue
        points = [shapely.intersection(way, merged) for way in over if way.intersects(merged)]
        if kind == "railway":
            points += [point for point in level if merged.distance(point) < 1e-6]
        crossings = [
            (round(point.y, 7), round(point.x, 7))
            for found in points
            for point in shapely.get_parts(found)
            if point.geom_type == "Point" and area.contains(point)
        ]
        if not crossings:
            left_out.append(f"{name}: no bridge, tunnel or level crossing inside the area")
            continue
        crossings.sort(key=lambda latlon: merged.project(shapely.Point(latlon[1], latlon[0])))
        course = np.round(np.asarray(merged.coords)[:, ::-1], 7)
        barriers.append(
            BarrierEntry(id=_slug(name), kind=kind, course=course, crossings=np.asarray(crossings))
        )
    return barriers, left_out


def city_entry(
    extract: OsmExtract,
    *,
    city_id: str,
    timezone: str,
    speeds_kmh: Sequence[float],
    road_circuity: float,
    boundary: str | None = None,
    simplify_m: float = 100.0,
) -> tuple[CityEntry, list[str]]:
    """The extract's city (its administrative boundary named ``boundary``) as a registry
    entry, and what was left out of it (one line each)."""
    area, tags, centre_node = _boundary(extract, boundary)
    area = shapely.simplify(area, simplify_m / 1000.0 / _KM_PER_DEGREE)
    area = shapely.orient_polygons(area)
    if centre_node is not None and centre_node in extract.nodes:
        centre = shapely.Point(extract.nodes[centre_node])
    else:
        centre = shapely.point_on_surface(area)
    barriers, left_out = _barriers(extract, area)
    name = tags.get("name:en") or tags.get("name") or city_id
    aliases = tuple(
        dict.fromkeys(v for v in (tags.get("name"), tags.get("ref")) if v and v != name)
    )
    entry = CityEntry(
        id=city_id,
        name=name,
        aliases=aliases,
        timezone=timezone,
        centre=(centre.y, centre.x),
        area=np.asarray(area.exterior.coords)[:, ::-1],
        speeds_kmh=dict(zip(("ebike", "motorbike", "car"), map(float, speeds_kmh), strict=True)),
        road_circuity=road_circuity,
        barriers=tuple(barriers),
    )
    return entry, left_out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.offline.osm_import",
        description="Add a city to a registry from an OpenStreetMap XML extract.",
    )
    parser.add_argument("extract", type=Path, help="OSM XML file (.osm)")
    parser.add_argument("--id", required=True, help="the city's id (the metrics' label)")
    parser.add_argument("--timezone", required=True, help="IANA time zone, e.g. Asia/Shanghai")
    parser.add_argument(
        "--speeds-kmh", required=True, help="free-flow km/h of ebike,motorbike,car, e.g. 16,23,28"
    )
    parser.add_argument(
        "--road-circuity", type=float, required=True, help="road km per straight km"
    )
    parser.add_argument(
        "--boundary", help="name (or name:en) of the administrative boundary, where several"
    )
    parser.add_argument(
        "--simplify-m", type=float, default=100.0, help="area simplification tolerance, metres"
    )
    parser.add_argument("--registry", type=Path, help="registry to add the city to")
    parser.add_argument("--out", type=Path, required=True, help="registry file to write")
    args = parser.parse_args(argv)
    try:
        speeds = [float(value) for value in args.speeds_kmh.split(",")]
        if len(speeds) != 3:
            raise ValueError("--speeds-kmh needs three numbers: ebike,motorbike,car")
        entry, left_out = city_entry(
            read_osm(args.extract),
            city_id=args.id,
            timezone=args.timezone,
            speeds_kmh=speeds,
            road_circuity=args.road_circuity,
            boundary=args.boundary,
            simplify_m=args.simplify_m,
        )
        new = registry_document([entry])
        if args.registry is not None:
            document = json.loads(args.registry.read_text(encoding="utf-8"))
            document["features"] = [*document.get("features", []), *new["features"]]
        else:
            document = new
        registry = registry_from_dict(document)
    except (OSError, ValueError, KeyError, ElementTree.ParseError, RegistryError) as exc:
        print(f"osm_import: {exc}", file=sys.stderr)
        return 2
    for line in left_out:
        print(f"left out: {line}", file=sys.stderr)
    city = registry.get(args.id)
    args.out.write_text(registry_text(document), encoding="utf-8")
    print(
        f"{args.out}: {city.id} ({city.name}): area of {city.area.shape[0] - 1} vertices, "
        f"{len(city.barriers)} barriers, "
        f"{sum(b.crossings.shape[0] for b in city.barriers)} crossings"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
