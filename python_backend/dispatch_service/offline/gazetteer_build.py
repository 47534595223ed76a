"""Build the offline gazetteer of the simulator's city, and measure how well it geocodes.

The simulator's city is a synthetic Shanghai: its hot spots are real places, its streets are
not modelled. The gazetteer the geocoding fallback ships
(``dispatch_service/geocoding/data/gazetteer_shanghai.json``) is therefore generated here
from the simulator's `CityConfig`, deterministically:

- POIs: the simulator's hot spots, under the names of the places they stand for;
- roads: a street grid over the simulator's core box (east-west and north-south, every
  ``spacing_km``), named from two pools of characters the way Chinese streets are, with
  house numbers every ``metres_per_number`` metres from the west / south end. Names that
  cpca would read as a division, or that hold a Shanghai district's name, are left out.

The accuracy check draws order pickups and drop-offs from the simulator, writes each as the
address a customer would type (district + nearest road + house number when a road lies
within ``max_road_km``, otherwise district + an unnamed estate), geocodes it offline and
compares with the simulator's true point.

    python -m dispatch_service.offline.gazetteer_build            # rewrite the shipped file
    python -m dispatch_service.offline.gazetteer_build --check    # fail if it is stale
    python -m dispatch_service.offline.gazetteer_build --accuracy # print the error figures
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from dispatch_service.domain import geo
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.geocoding import gazetteer as gaz
from dispatch_service.geocoding.normalize import normalize_address
from dispatch_service.offline import simulator
from dispatch_service.offline.simulator import DEFAULT_CITY, CityConfig

__all__ = [
    "HOT_SPOT_NAMES",
    "AccuracyReport",
    "AddressBook",
    "address_for_point",
    "build_gazetteer",
    "default_path",
    "gazetteer_accuracy",
    "main",
    "window_with_addresses",
]

# Names of the simulator's hot spots, in `CityConfig.hot_spots` order, with aliases.
HOT_SPOT_NAMES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("人民广场", ()),
    ("静安寺", ()),
    ("徐家汇", ()),
    ("陆家嘴", ()),
    ("五角场", ()),
    ("中山公园", ()),
    ("世纪公园", ()),
    ("张江高科", ("张江",)),
    ("虹桥火车站", ("虹桥站",)),
    ("莘庄", ()),
    ("宝山万达", ()),
    ("三林", ("浦江",)),
)
_FIRST: Final = "安宝昌定福富广和华惠吉建江金康乐丽隆瑞顺"
_SECOND: Final = "平兴泰阳丰盛源新德祥"
_SHANGHAI: Final = "310000"
_KM_PER_DEG_LAT: Final = geo.EARTH_RADIUS_KM * np.pi / 180.0


def default_path() -> Path:
    """Where the package keeps its gazetteer (the file the geocoding layer loads)."""
    import dispatch_service.geocoding as package

    return Path(package.__file__).resolve().parent / "data" / gaz.DEFAULT_GAZETTEER


def _road_names(count: int, recogniser: gaz.AdminRecogniser, seed: int) -> list[str]:
    stems = [d[:-1] for d in _shanghai_districts(recogniser)]
    names = []
    for a in _FIRST:
        for b in _SECOND:
            name = f"{a}{b}路"
            if any(s[:2] in name for s in stems) or recogniser.recognise(name) is not None:
                continue
            if any(name in n or n in name for n, _ in HOT_SPOT_NAMES):
                continue
            names.append(name)
    if len(names) < count:
        raise ValueError(f"only {len(names)} road names for {count} roads")
    order = np.random.default_rng(seed).permutation(len(names))
    return [names[i] for i in order[:count]]


def _shanghai_districts(recogniser: gaz.AdminRecogniser) -> list[str]:
    return [name for name, _ in recogniser.districts("31")]


def build_gazetteer(
    config: CityConfig = DEFAULT_CITY,
    spacing_km: float = 0.6,
    metres_per_number: float = 10.0,
    seed: int = 13,
    recogniser: gaz.AdminRecogniser | None = None,
) -> dict[str, Any]:
    """The gazetteer as JSON-ready data (same arguments, same output)."""
    if len(HOT_SPOT_NAMES) != len(config.hot_spots):
        raise ValueError("HOT_SPOT_NAMES must name every hot spot of the city")
    recogniser = recogniser or gaz.AdminRecogniser()
    (lat0, lat1), (lon0, lon1) = config.core_lat_range, config.core_lon_range
    mid_lat = 0.5 * (lat0 + lat1)
    km_per_deg_lon = _KM_PER_DEG_LAT * float(np.cos(np.radians(mid_lat)))
    lat_step, lon_step = spacing_km / _KM_PER_DEG_LAT, spacing_km / km_per_deg_lon
    lats = np.arange(lat0 + lat_step / 2, lat1, lat_step)
    lons = np.arange(lon0 + lon_step / 2, lon1, lon_step)
    names = _road_names(len(lats) + len(lons), recogniser, seed)
    ew_numbers = round((lon1 - lon0) * km_per_deg_lon * 1000.0 / metres_per_number)
    ns_numbers = round((lat1 - lat0) * _KM_PER_DEG_LAT * 1000.0 / metres_per_number)
    roads: list[dict[str, Any]] = []
    for i, lat in enumerate(lats):
        roads.append(
            {
                "name": names[i],
                "start": [round(float(lat), 6), lon0],
                "end": [round(float(lat), 6), lon1],
                "numbers": [1, ew_numbers],
            }
        )
    for j, lon in enumerate(lons):
        roads.append(
            {
                "name": names[len(lats) + j],
                "start": [lat0, round(float(lon), 6)],
                "end": [lat1, round(float(lon), 6)],
                "numbers": [1, ns_numbers],
            }
        )
    pois = [
        {"name": name, "aliases": list(aliases), "latlon": [lat, lon]}
        for (name, aliases), (lat, lon, _) in zip(HOT_SPOT_NAMES, config.hot_spots, strict=True)
    ]
    return {
        "city": "上海市",
        "city_adcode": _SHANGHAI,
        "datum": "WGS-84",
        "generated_by": "python -m dispatch_service.offline.gazetteer_build",
        "spacing_km": spacing_km,
        "metres_per_number": metres_per_number,
        "roads": roads,
        "pois": pois,
    }


class AddressBook:
    """Vectorised lookups for `address_for_point`: district centres and road segments."""

    def __init__(self, gazetteer: gaz.Gazetteer, recogniser: gaz.AdminRecogniser) -> None:
        names, centres = [], []
        for name in _shanghai_districts(recogniser):
            code = recogniser.adcode_of_name(name, "31")
            centre = recogniser.centroid(code) if code else None
            if centre is not None:
                names.append(name)
                centres.append(centre)
        self.districts = names
        self.centres = np.array(centres)
        self.roads = gazetteer.roads
        self.starts = np.array([road.start for road in gazetteer.roads])
        self.ends = np.array([road.end for road in gazetteer.roads])

    def district(self, point: tuple[float, float]) -> str:
        km = geo.haversine_km(point[0], point[1], self.centres[:, 0], self.centres[:, 1])
        return self.districts[int(np.argmin(km))]

    def nearest_road(self, point: tuple[float, float]) -> tuple[float, gaz.Road, float]:
        """(distance km, road, km along it from its start) of the nearest road."""
        scale = np.cos(np.radians(point[0]))
        d = (self.ends - self.starts) * [1.0, scale]
        p = (np.array(point) - self.starts) * [1.0, scale]
        length2 = np.maximum((d * d).sum(axis=1), 1e-18)
        t = np.clip((p * d).sum(axis=1) / length2, 0.0, 1.0)
        feet = self.starts + t[:, None] * (self.ends - self.starts)
        km = geo.haversine_km(point[0], point[1], feet[:, 0], feet[:, 1])
        best = int(np.argmin(km))
        along = geo.haversine_km(
            self.starts[best, 0], self.starts[best, 1], feet[best, 0], feet[best, 1]
        )
        return float(km[best]), self.roads[best], float(along)

    def address(self, point: tuple[float, float], max_road_km: float = 0.4) -> tuple[str, bool]:
        """(the address a customer at ``point`` would type, whether it names a road):
        district + nearest road + house number, or district + an unnamed estate when no
        road lies within ``max_road_km``."""
        district = self.district(point)
        km, road, along_km = self.nearest_road(point)
        if km > max_road_km:
            return f"上海市{district}康居小区", False
        length_km = float(geo.haversine_km(road.start[0], road.start[1], road.end[0], road.end[1]))
        share = along_km / length_km if length_km > 0 else 0.0
        number = road.first_number + round(share * (road.last_number - road.first_number))
        return f"上海市{district}{road.name}{number}号", True


def address_for_point(
    point: tuple[float, float],
    gazetteer: gaz.Gazetteer,
    recogniser: gaz.AdminRecogniser,
    max_road_km: float = 0.4,
    book: AddressBook | None = None,
) -> tuple[str, bool]:
    """(the address a customer at ``point`` would type, whether it names a road)."""
    return (book or AddressBook(gazetteer, recogniser)).address(point, max_road_km)


def window_with_addresses(
    window: DispatchWindow,
    book: AddressBook,
    *,
    share: float = 1.0,
    city: str = "上海",
) -> DispatchWindow:
    """``window`` as an order service holding typed addresses would send it: the first
    ``share`` of its orders give their pickup and drop-off only as the address a customer
    at that point would type (`address_for_point`), their coordinates NaN; the others keep
    their coordinates and send no address."""
    count = round(share * window.num_orders)
    pickup, dropoff = window.pickup.copy(), window.dropoff.copy()
    texts = {end: np.full(window.num_orders, b"", dtype=object) for end in ("pickup", "dropoff")}
    for end, points in (("pickup", pickup), ("dropoff", dropoff)):
        for row in range(count):
            lat, lon = points[row]
            texts[end][row] = book.address((float(lat), float(lon)))[0].encode("utf-8")
        points[:count] = np.nan
    cities = np.full(window.num_orders, b"", dtype=object)
    cities[:count] = city.encode("utf-8")
    return replace(
        window,
        pickup=pickup,
        dropoff=dropoff,
        pickup_address=texts["pickup"],
        dropoff_address=texts["dropoff"],
        city=cities,
    )


@dataclass(frozen=True)
class AccuracyReport:
    addresses: int
    road_matches: int
    road_median_m: float
    road_p90_m: float
    district_matches: int
    district_median_m: float
    # Every address geocoded to its district centroid alone (what the fallback gives
    # without the gazetteer): the figure the road matches improve on.
    district_only_median_m: float
    unresolved: int


def gazetteer_accuracy(
    windows: int = 20, orders: int = 32, seed: int = 7, max_road_km: float = 0.4
) -> AccuracyReport:
    """Geocode simulator pickups and drop-offs offline; errors against the true points."""
    recogniser = gaz.AdminRecogniser()
    gazetteer = gaz.Gazetteer.load()
    book = AddressBook(gazetteer, recogniser)
    rng = np.random.default_rng(seed)
    road_err: list[float] = []
    district_err: list[float] = []
    district_only: list[float] = []
    unresolved = 0
    for _ in range(windows):
        window = simulator.generate_window(rng, orders, 1)
        for lat, lon in np.concatenate([window.pickup, window.dropoff]):
            point = (float(lat), float(lon))
            text, _ = address_for_point(point, gazetteer, recogniser, max_road_km, book=book)
            centre = book.centres[book.districts.index(book.district(point))]
            district_only.append(1000.0 * float(geo.haversine_km(lat, lon, *centre)))
            found = gaz.match_address(normalize_address(text), None, gazetteer, recogniser)
            if found is None:
                unresolved += 1
                continue
            metres = 1000.0 * float(geo.haversine_km(lat, lon, found.latlon[0], found.latlon[1]))
            if found.kind in (gaz.MatchKind.ROAD_NUMBER, gaz.MatchKind.POI, gaz.MatchKind.ROAD):
                road_err.append(metres)
            else:
                district_err.append(metres)
    road = np.array(road_err) if road_err else np.array([np.nan])
    district = np.array(district_err) if district_err else np.array([np.nan])
    return AccuracyReport(
        addresses=len(road_err) + len(district_err) + unresolved,
        road_matches=len(road_err),
        road_median_m=float(np.median(road)),
        road_p90_m=float(np.percentile(road, 90)),
        district_matches=len(district_err),
        district_median_m=float(np.median(district)),
        district_only_median_m=float(np.median(district_only)),
        unresolved=unresolved,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: package)")
    parser.add_argument("--check", action="store_true", help="fail if the shipped file is stale")
    parser.add_argument("--accuracy", action="store_true", help="print the accuracy figures")
    args = parser.parse_args(argv)
    if args.accuracy:
        report = gazetteer_accuracy()
        print(json.dumps(report.__dict__, indent=2))
        return 0
    text = json.dumps(build_gazetteer(), ensure_ascii=False, indent=1) + "\n"
    path = args.out or default_path()
    if args.check:
        if path.read_text(encoding="utf-8") != text:
            print(f"{path} is stale: rerun python -m {__spec__.name if __spec__ else ''}")
            return 1
        print(f"{path} is up to date")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
