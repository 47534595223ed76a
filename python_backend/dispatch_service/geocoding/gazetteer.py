"""The offline fallback: administrative divisions (cpca) refined by a city gazetteer.

When no provider answers in time, an address still gets a point without the network:

1. ``cpca`` recognises province / city / district in the text (an Aho-Corasick match over
   the national adcode table it ships); the district's centroid from that table (GCJ-02,
   converted to WGS-84) is the coarse answer;
2. the gazetteer of the simulator's city (roads with house-number ranges and POIs, generated
   by `dispatch_service.offline.gazetteer_build`, shipped as ``data/gazetteer_shanghai.json``)
   refines it: a road and number interpolate along the road, a POI name gives its point.

cpca is used through ``cpca._get_one_addr`` (one address, a dict): its public ``transform``
builds a pandas DataFrame per call, which costs milliseconds and imports pandas' lazy parts on
the request path. The version is pinned (0.5.5) and the unit tests cover the call.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from dispatch_contract import CoordSystem
from dispatch_service.domain import geo
from dispatch_service.geocoding.cache import LatLon

__all__ = [
    "DEFAULT_GAZETTEER",
    "AdminMatch",
    "AdminRecogniser",
    "Gazetteer",
    "GazetteerMatch",
    "MatchKind",
    "Poi",
    "Road",
    "adcode_prefix",
    "match_address",
]

DEFAULT_GAZETTEER: Final = "gazetteer_shanghai.json"
_ABSENT: Final = object()
_HOUSE_NUMBER: Final = re.compile(r"(\d{1,6})(?:[-之]\d{1,4})?(?:号|弄)")


class MatchKind(IntEnum):
    """How precise a gazetteer answer is (larger is finer)."""

    DISTRICT = 1  # district centroid
    ROAD = 2  # a road without a usable number: the road's point nearest the district
    POI = 3  # a named place
    ROAD_NUMBER = 4  # a road and a house number


@dataclass(frozen=True)
class AdminMatch:
    """What cpca recognised: names and the 6-digit adcode of the finest level found."""

    province: str | None
    city: str | None
    district: str | None
    adcode: str


@dataclass(frozen=True)
class GazetteerMatch:
    latlon: LatLon  # WGS-84
    kind: MatchKind
    name: str  # what matched (road, POI or district name)
    adcode: str | None  # the recognised division, when cpca found one


class AdminRecogniser:
    """cpca behind a small typed face: recognition, adcode lookup, centroids in WGS-84.

    cpca (and pandas, which it imports) load on first use: about half a second, so the
    serving adapter builds one at model load.
    """

    def __init__(self) -> None:
        cpca = _import_cpca()
        self._cpca: Any = cpca
        self._table: dict[str, Any] = cpca.ad_2_addr_dict
        # "徐汇" -> "徐汇区", "浦东" -> "浦东新区": cpca matches districts only with suffix.
        short: dict[str, str] = {}
        for info in self._table.values():
            name = str(info.name)
            if info.rank == 2 and name.endswith("区") and len(name) >= 3:
                stem = name[:-2] if name.endswith("新区") else name[:-1]
                if len(stem) >= 2:
                    short.setdefault(stem, name)
        self._short = short

    def recognise(self, text: str, city_adcode: str | None = None) -> AdminMatch | None:
        """Province / city / district of a normalised address; None when none is named."""
        found = self._cpca._get_one_addr(text, False, {})
        adcode = found.get("adcode")
        if (adcode is None or str(adcode).endswith("00")) and city_adcode is not None:
            expanded = self._expand_short_district(text, city_adcode)
            if expanded is not None:
                found = self._cpca._get_one_addr(expanded, False, {})
                adcode = found.get("adcode")
        if adcode is None:
            return None
        return AdminMatch(found.get("省"), found.get("市"), found.get("区"), str(adcode))

    def _expand_short_district(self, text: str, city_adcode: str) -> str | None:
        prefix = adcode_prefix(city_adcode)
        for stem, full in self._short.items():
            if stem in text and full not in text:
                code = self.adcode_of_name(full, prefix)
                if code is not None:
                    return text.replace(stem, full, 1)
        return None

    def adcode_of_name(self, name: str, prefix: str = "") -> str | None:
        for key, info in self._table.items():
            if info.name == name and key.startswith(prefix):
                return str(key[:6])
        return None

    def districts(self, prefix: str) -> list[tuple[str, str]]:
        """(name, adcode) of every district-level division whose adcode starts with
        ``prefix`` (e.g. "31": Shanghai's), sorted by name."""
        return sorted(
            (str(info.name), key[:6])
            for key, info in self._table.items()
            if key.startswith(prefix) and info.rank == 2
        )

    def city_adcode(self, city: str) -> str | None:
        """The 6-digit adcode of a city field (a name like 上海 / 杭州市, or an adcode)."""
        if city.isdigit():
            return city if len(city) == 6 and city.ljust(12, "0") in self._table else None
        found = self._cpca._get_one_addr(city, False, {})
        adcode = found.get("adcode")
        return None if adcode is None else str(adcode)

    def name(self, adcode: str) -> str | None:
        info = self._table.get(adcode.ljust(12, "0"))
        return None if info is None else str(info.name)

    def centroid(self, adcode: str) -> LatLon | None:
        """The division's centre from cpca's table (GCJ-02 there) in WGS-84."""
        return _centroid(self, adcode)


@cache
def _centroid(recogniser: AdminRecogniser, adcode: str) -> LatLon | None:
    info = recogniser._table.get(adcode.ljust(12, "0"))
    if info is None:
        return None
    gcj = np.array([[float(info.latitude), float(info.longitude)]])
    wgs = geo.to_wgs84(gcj, CoordSystem.GCJ02)
    return float(wgs[0, 0]), float(wgs[0, 1])


def _import_cpca() -> Any:
    """Import cpca (heavy: pandas), which reads its adcode table at import time through
    ``pkg_resources.resource_stream``. setuptools' ``pkg_resources`` takes a fifth of a
    second to import (each stub start pays it) and is absent from newer environments, so a
    stand-in over `importlib.resources` serves that one call for the duration of the import."""
    if "cpca" in sys.modules:
        return sys.modules["cpca"]
    saved = sys.modules.get("pkg_resources", _ABSENT)
    shim = types.ModuleType("pkg_resources")
    shim.resource_stream = lambda package, name: (  # type: ignore[attr-defined]
        resources.files(package).joinpath(name).open("rb")
    )
    sys.modules["pkg_resources"] = shim
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module("cpca")
    finally:
        if saved is _ABSENT:
            del sys.modules["pkg_resources"]
        else:
            sys.modules["pkg_resources"] = saved  # type: ignore[assignment]


def adcode_prefix(adcode: str) -> str:
    """The leading digits that every division inside ``adcode`` shares."""
    if adcode.endswith("0000"):
        return adcode[:2]
    if adcode.endswith("00"):
        return adcode[:4]
    return adcode


def _nested(a: str, b: str) -> bool:
    """Does one division lie inside the other (or are they the same)?"""
    pa, pb = adcode_prefix(a), adcode_prefix(b)
    return pa.startswith(pb) or pb.startswith(pa)


@dataclass(frozen=True)
class Road:
    """A straight road (WGS-84 ends) whose house numbers run evenly from start to end."""

    name: str
    start: LatLon
    end: LatLon
    first_number: int
    last_number: int

    def point(self, number: int) -> LatLon:
        span = max(self.last_number - self.first_number, 1)
        t = min(max((number - self.first_number) / span, 0.0), 1.0)
        return (
            self.start[0] + t * (self.end[0] - self.start[0]),
            self.start[1] + t * (self.end[1] - self.start[1]),
        )

    def nearest(self, target: LatLon) -> LatLon:
        """The road's point nearest ``target`` (planar; roads are a few tens of km)."""
        (a0, a1), (b0, b1) = self.start, self.end
        scale = np.cos(np.radians(target[0]))
        dx, dy = (b1 - a1) * scale, b0 - a0
        px, py = (target[1] - a1) * scale, target[0] - a0
        length2 = dx * dx + dy * dy
        t = 0.0 if length2 == 0 else min(max((px * dx + py * dy) / length2, 0.0), 1.0)
        return a0 + t * (b0 - a0), a1 + t * (b1 - a1)


@dataclass(frozen=True)
class Poi:
    name: str
    aliases: tuple[str, ...]
    latlon: LatLon


@dataclass(frozen=True)
class Gazetteer:
    """Roads and POIs of one city, matched by name inside a normalised address."""

    city: str
    city_adcode: str
    roads: tuple[Road, ...]
    pois: tuple[Poi, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gazetteer:
        if data.get("datum") != "WGS-84":
            raise ValueError("gazetteer: datum must be WGS-84")
        roads = tuple(
            Road(
                name=str(item["name"]),
                start=(float(item["start"][0]), float(item["start"][1])),
                end=(float(item["end"][0]), float(item["end"][1])),
                first_number=int(item["numbers"][0]),
                last_number=int(item["numbers"][1]),
            )
            for item in data["roads"]
        )
        pois = tuple(
            Poi(
                name=str(item["name"]),
                aliases=tuple(str(a) for a in item.get("aliases", ())),
                latlon=(float(item["latlon"][0]), float(item["latlon"][1])),
            )
            for item in data["pois"]
        )
        return cls(str(data["city"]), str(data["city_adcode"]), roads, pois)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Gazetteer:
        """The gazetteer at ``path``, or the one shipped with the package."""
        if path is None:
            text = (
                resources.files("dispatch_service.geocoding")
                .joinpath("data", DEFAULT_GAZETTEER)
                .read_text(encoding="utf-8")
            )
        else:
            text = Path(path).read_text(encoding="utf-8")
        return cls.from_dict(json.loads(text))

    def covers(self, adcode: str | None) -> bool:
        """Is a division (or unknown: None) inside or around this gazetteer's city?"""
        if adcode is None:
            return True
        return _nested(adcode, self.city_adcode)

    @cached_property
    def _poi_index(self) -> tuple[re.Pattern[str], dict[str, Poi]]:
        names = {name: poi for poi in self.pois for name in (poi.name, *poi.aliases)}
        return _alternation(names), names

    @cached_property
    def _road_index(self) -> tuple[re.Pattern[str], dict[str, Road]]:
        names = {road.name: road for road in self.roads}
        return _alternation(names), names

    def find_poi(self, text: str) -> tuple[Poi, str] | None:
        """The first POI name (longest at its position) in ``text``, and that name."""
        pattern, names = self._poi_index
        found = pattern.search(text)
        return None if found is None else (names[found.group()], found.group())

    def find_road(self, text: str) -> tuple[Road, int | None] | None:
        """The first road name in ``text`` and the house number right after it."""
        pattern, names = self._road_index
        found = pattern.search(text)
        if found is None:
            return None
        number = _HOUSE_NUMBER.match(text, found.end())
        return names[found.group()], (int(number.group(1)) if number else None)


def _alternation(names: Iterable[str]) -> re.Pattern[str]:
    """One regex for many names, longest first so the longest wins at a position
    (one C-level scan instead of a Python loop over every name)."""
    ordered = sorted(names, key=len, reverse=True)
    return re.compile("|".join(re.escape(name) for name in ordered) or r"(?!)")


def match_address(
    text: str,
    city_adcode: str | None,
    gazetteer: Gazetteer,
    recogniser: AdminRecogniser,
) -> GazetteerMatch | None:
    """The best offline point for a normalised address, or None when nothing is known.

    Order of preference: road + house number, POI, road alone, district centroid. An
    address that names only a province or city gets None: a city centroid is kilometres
    off and would silently mislead dispatch.
    """
    admin = recogniser.recognise(text, city_adcode or gazetteer.city_adcode)
    adcode = admin.adcode if admin is not None else None
    if adcode is not None and city_adcode is not None and not _nested(adcode, city_adcode):
        return None  # the address names a place outside the order's city
    local = gazetteer.covers(adcode) and gazetteer.covers(city_adcode)
    district_point: LatLon | None = None
    if adcode is not None and not adcode.endswith("00"):
        district_point = recogniser.centroid(adcode)
    if local:
        road = gazetteer.find_road(text)
        if road is not None and road[1] is not None:
            point = road[0].point(road[1])
            return GazetteerMatch(point, MatchKind.ROAD_NUMBER, road[0].name, adcode)
        poi = gazetteer.find_poi(text)
        if poi is not None:
            return GazetteerMatch(poi[0].latlon, MatchKind.POI, poi[1], adcode)
        if road is not None:
            anchor = district_point
            if anchor is None:
                anchor = road[0].point((road[0].first_number + road[0].last_number) // 2)
            return GazetteerMatch(road[0].nearest(anchor), MatchKind.ROAD, road[0].name, adcode)
    if district_point is not None and adcode is not None:
        name = recogniser.name(adcode) or adcode
        return GazetteerMatch(district_point, MatchKind.DISTRICT, name, adcode)
    return None
