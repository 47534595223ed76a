"""Behaviour of dispatch_service.offline.osm_import on a small hand-made OSM extract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dispatch_service.domain.cities import DEFAULT_REGISTRY, load_registry
from dispatch_service.offline import osm_import

EXTRACT = Path(__file__).parent / "data" / "wuhan.osm"
ARGS = ["--id", "wuhan", "--timezone", "Asia/Shanghai", "--speeds-kmh", "16,23,28"]


def _cut(p1: tuple[float, float], p2: tuple[float, float], q1: tuple[float, float],
         q2: tuple[float, float]) -> np.ndarray:  # fmt: skip
    """Where segment p1-p2 meets segment q1-q2, (lat, lon), by hand: p1 + t (p2 - p1) =
    q1 + u (q2 - q1) solved for t and u."""
    p1a, p2a, q1a, q2a = map(np.asarray, (p1, p2, q1, q2))
    t, _ = np.linalg.solve(np.column_stack((p2a - p1a, q1a - q2a)), q1a - p1a)
    return np.asarray(p1a + t * (p2a - p1a))


def _entry() -> tuple[osm_import.CityEntry, list[str]]:
    return osm_import.city_entry(
        osm_import.read_osm(EXTRACT),
        city_id="wuhan",
        timezone="Asia/Shanghai",
        speeds_kmh=(16.0, 23.0, 28.0),
        road_circuity=1.45,
        boundary="Wuhan",
    )


def test_the_boundary_becomes_the_area_and_its_tags_the_names() -> None:
    entry, _ = _entry()
    assert (entry.id, entry.name, entry.aliases) == ("wuhan", "Wuhan", ("武汉市", "420100"))
    assert entry.centre == (30.60, 114.27)  # the relation's admin_centre node
    corners = {(30.40, 114.00), (30.35, 114.30), (30.42, 114.60), (30.60, 114.65),
               (30.78, 114.58), (30.82, 114.30), (30.75, 114.02), (30.58, 113.96)}  # fmt: skip
    assert {tuple(point) for point in entry.area.tolist()} == corners
    assert entry.area.shape == (9, 2) and tuple(entry.area[0]) == tuple(entry.area[-1])
    # counter-clockwise in (lon, lat), RFC 7946's right-hand rule: positive shoelace area
    lon, lat = entry.area[:, 1], entry.area[:, 0]
    assert np.sum(lon[:-1] * lat[1:] - lon[1:] * lat[:-1]) > 0
    assert dict(entry.speeds_kmh) == {"ebike": 16.0, "motorbike": 23.0, "car": 28.0}


def test_rivers_and_railways_become_barriers_crossed_at_bridges_tunnels_and_level_crossings() -> (
    None
):
    entry, left_out = _entry()
    barriers = {barrier.id: barrier for barrier in entry.barriers}
    assert {(b.id, b.kind) for b in entry.barriers} == {
        ("yangtze", "river"), ("han_river", "river"), ("jingguang_railway", "railway"),
    }  # fmt: skip
    assert left_out == ["Fu River: no bridge, tunnel or level crossing inside the area"]
    # the Yangtze's two ways are one course; its bridges in the order of the course
    yangtze = barriers["yangtze"].crossings
    np.testing.assert_allclose(
        yangtze,
        [
            _cut((30.56, 114.28), (30.62, 114.33), (30.575, 114.27), (30.555, 114.295)),
            _cut((30.62, 114.33), (30.70, 114.45), (30.67, 114.36), (30.63, 114.40)),
        ],
        atol=1e-6,
    )
    np.testing.assert_allclose(
        barriers["han_river"].crossings,
        [_cut((30.59, 114.10), (30.575, 114.22), (30.60, 114.15), (30.56, 114.16))],
        atol=1e-6,
    )
    railway = barriers["jingguang_railway"]
    np.testing.assert_allclose(
        railway.crossings,
        [_cut((30.43, 114.50), (30.48, 114.56), (30.47, 114.50), (30.43, 114.55)), [30.48, 114.56]],
        atol=1e-6,
    )
    # courses are cut about a kilometre beyond the border: the Yangtze's far ends are gone
    yangtze_course = barriers["yangtze"].course
    assert 30.30 < yangtze_course[0, 0] < 30.40 and 30.78 < yangtze_course[-1, 0] < 30.88
    assert 30.30 < railway.course[0, 0] < 30.40 and railway.course[-1, 1] < 114.66


def test_the_written_registry_holds_the_shipped_cities_and_the_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cities.geojson"
    code = osm_import.main(
        [str(EXTRACT), *ARGS, "--road-circuity", "1.45", "--boundary", "Wuhan",
         "--registry", str(DEFAULT_REGISTRY), "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    assert "wuhan (Wuhan): area of 8 vertices, 3 barriers, 5 crossings" in capsys.readouterr().out
    registry = load_registry(out)
    assert registry.ids == ("shanghai", "beijing", "shenzhen", "chengdu", "wuhan")
    wuhan = registry.get("420100")
    assert wuhan.contains(np.array([[30.60, 114.27], [30.36, 114.62]])).tolist() == [True, False]
    document = json.loads(out.read_text())
    assert document["type"] == "FeatureCollection"
    assert document["features"][-1]["geometry"]["coordinates"] == [114.56, 30.48]  # [lon, lat]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "holds 2 boundary=administrative relations or closed ways (of Wuhan, 湖北省): "
             "name one with --boundary"),
        (["--boundary", "Wuhan", "--speeds-kmh", "16,23"], "--speeds-kmh needs three numbers"),
        (["--boundary", "Wuhan", "--road-circuity", "4"], "road_circuity must lie within [1, 3]"),
    ],
)  # fmt: skip
def test_a_city_that_cannot_be_made_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    out = tmp_path / "cities.geojson"
    argv = [str(EXTRACT), *ARGS, "--road-circuity", "1.45", *extra, "--out", str(out)]
    assert osm_import.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_city_overlapping_a_registered_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.geojson"
    argv = [str(EXTRACT), *ARGS, "--road-circuity", "1.45", "--boundary", "Wuhan"]
    assert osm_import.main([*argv, "--out", str(first)]) == 0
    document = json.loads(first.read_text())
    document["features"][0]["properties"].update(name="Old Wuhan", aliases=[])
    for feature in document["features"]:
        feature["properties"]["city"] = "old_wuhan"
    first.write_text(json.dumps(document))
    again = [*argv, "--id", "wuhan2", "--registry", str(first), "--out", str(tmp_path / "x")]
    assert osm_import.main(again) == 2
    assert "cities[1] wuhan2: its service area overlaps old_wuhan's" in capsys.readouterr().err


def test_an_extract_that_is_no_osm_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.osm"
    bad.write_text("<gpx></gpx>")
    argv = [str(bad), *ARGS, "--road-circuity", "1.45", "--out", str(tmp_path / "x")]
    assert osm_import.main(argv) == 2
    assert "not an OSM XML file (root element 'gpx')" in capsys.readouterr().err
    broken = tmp_path / "broken.osm"
    broken.write_text(EXTRACT.read_text().replace('<node id="41" lat="30.43" lon="114.50"/>', ""))
    assert osm_import.main([str(broken), *argv[1:], "--boundary", "Wuhan"]) == 2
    assert "way 300 refers to node 41, which the extract lacks" in capsys.readouterr().err
