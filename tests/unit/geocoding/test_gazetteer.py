"""Behaviour of dispatch_service.geocoding.gazetteer: cpca divisions, roads, POIs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dispatch_contract import CoordSystem
from dispatch_service.domain import geo
from dispatch_service.geocoding.gazetteer import (
    AdminRecogniser,
    Gazetteer,
    MatchKind,
    Road,
    match_address,
)
from dispatch_service.geocoding.normalize import normalize_address
from dispatch_service.offline.simulator import DEFAULT_CITY

# cpca's adcode table row for 黄浦区 (GCJ-02): 310101, 121.484428, 31.231739
HUANGPU_GCJ = (31.231739, 121.484428)


def _metres(a: tuple[float, float], b: tuple[float, float]) -> float:
    return 1000.0 * float(geo.haversine_km(a[0], a[1], b[0], b[1]))


def test_cpca_recognises_province_city_district(recogniser: AdminRecogniser) -> None:
    found = recogniser.recognise("上海市徐汇区安平路100号")
    assert found is not None
    assert (found.province, found.district, found.adcode) == ("上海市", "徐汇区", "310104")
    assert recogniser.recognise("火星基地1号") is None


def test_district_without_suffix_is_recognised_within_the_city(
    recogniser: AdminRecogniser,
) -> None:
    found = recogniser.recognise("浦东世纪大道88号", "310000")
    assert found is not None and found.adcode == "310115"


def test_city_field_by_name_or_adcode(recogniser: AdminRecogniser) -> None:
    assert recogniser.city_adcode("上海") == "310000"
    assert recogniser.city_adcode("杭州") == "330100"
    assert recogniser.city_adcode("310000") == "310000"
    assert recogniser.city_adcode("999999") is None
    assert recogniser.city_adcode("亚特兰蒂斯") is None


def test_district_centroid_is_the_table_point_in_wgs84(recogniser: AdminRecogniser) -> None:
    centre = recogniser.centroid("310101")
    assert centre is not None
    back = geo.from_wgs84(np.array([centre]), CoordSystem.GCJ02)[0]
    assert back == pytest.approx(HUANGPU_GCJ, abs=1e-7)
    # GCJ-02 moves Shanghai by a few hundred metres: the conversion really happened.
    assert 200.0 < _metres(centre, HUANGPU_GCJ) < 1000.0


def test_road_numbers_interpolate_along_the_road() -> None:
    road = Road("测试路", (31.0, 121.0), (31.0, 121.1), 1, 101)
    assert road.point(1) == (31.0, 121.0)
    assert road.point(101) == pytest.approx((31.0, 121.1))
    assert road.point(51) == pytest.approx((31.0, 121.05))
    assert road.point(1000) == pytest.approx((31.0, 121.1))  # past the end: clamped
    assert road.nearest((31.01, 121.03)) == pytest.approx((31.0, 121.03))


def test_road_and_number(gazetteer: Gazetteer, recogniser: AdminRecogniser) -> None:
    road = gazetteer.roads[5]
    found = match_address(f"上海市徐汇区{road.name}250号", "310000", gazetteer, recogniser)
    assert found is not None and found.kind is MatchKind.ROAD_NUMBER
    assert found.latlon == pytest.approx(road.point(250))
    assert found.adcode == "310104"
    for variant in (f"{road.name}250-3号", f"{road.name}250之1号", f"{road.name}250弄12号"):
        other = match_address(variant, None, gazetteer, recogniser)
        assert other is not None and other.latlon == pytest.approx(road.point(250))


def test_poi_is_the_simulator_hot_spot(gazetteer: Gazetteer, recogniser: AdminRecogniser) -> None:
    found = match_address(normalize_address("上海黄浦区人民广场附近"), None, gazetteer, recogniser)
    assert found is not None and found.kind is MatchKind.POI
    assert found.latlon == pytest.approx(DEFAULT_CITY.hot_spots[0][:2])
    alias = match_address("虹桥站", None, gazetteer, recogniser)
    assert alias is not None and alias.latlon == pytest.approx(DEFAULT_CITY.hot_spots[8][:2])


def test_road_without_number_takes_the_point_nearest_the_district(
    gazetteer: Gazetteer, recogniser: AdminRecogniser
) -> None:
    road = gazetteer.roads[70]
    found = match_address(f"上海市长宁区{road.name}", None, gazetteer, recogniser)
    centre = recogniser.centroid("310105")
    assert found is not None and found.kind is MatchKind.ROAD and centre is not None
    assert found.latlon == pytest.approx(road.nearest(centre))


def test_district_only_gives_its_centroid(
    gazetteer: Gazetteer, recogniser: AdminRecogniser
) -> None:
    found = match_address("上海市闵行区某某小区", None, gazetteer, recogniser)
    assert found is not None and found.kind is MatchKind.DISTRICT
    assert found.latlon == recogniser.centroid("310112")
    elsewhere = match_address("北京市朝阳区建国路1号", None, gazetteer, recogniser)
    assert elsewhere is not None and elsewhere.adcode == "110105"


def test_city_alone_or_nothing_known_gives_none(
    gazetteer: Gazetteer, recogniser: AdminRecogniser
) -> None:
    assert match_address("上海市某某小区", None, gazetteer, recogniser) is None
    assert match_address("火星基地1号", "310000", gazetteer, recogniser) is None


def test_address_outside_the_given_city_gives_none(
    gazetteer: Gazetteer, recogniser: AdminRecogniser
) -> None:
    assert match_address("北京市朝阳区建国路1号", "310000", gazetteer, recogniser) is None


def test_cpca_imports_without_setuptools_pkg_resources() -> None:
    """cpca reads its table through pkg_resources at import; Python 3.12 venvs and newer
    setuptools lack it. A child interpreter with pkg_resources blocked still recognises."""
    code = (
        "import sys; sys.modules['pkg_resources'] = None\n"
        "from dispatch_service.geocoding.gazetteer import AdminRecogniser\n"
        "found = AdminRecogniser().recognise('上海市徐汇区安平路1号')\n"
        "assert found is not None and found.adcode == '310104', found\n"
        "assert sys.modules.get('pkg_resources', 'gone') is None\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
