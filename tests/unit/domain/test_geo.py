"""Behaviour of dispatch_service.domain.geo: distances, geohash, datum transforms."""

from __future__ import annotations

import geohash2
import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import CoordSystem
from dispatch_service.domain import geo

SHANGHAI = (31.2304, 121.4737)  # People's Square


def _world_points(n: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    rng = np.random.default_rng(seed)
    return rng.uniform(-90.0, 90.0, n), rng.uniform(-180.0, 180.0, n)


def _shanghai_points(n: int, seed: int) -> NDArray[np.float64]:
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(30.7, 31.6, n), rng.uniform(121.0, 122.0, n)])


# ------------------------------------------------------------------------- haversine


def test_one_degree_of_latitude() -> None:
    assert geo.haversine_km(0.0, 0.0, 1.0, 0.0) == pytest.approx(111.195, abs=1e-3)
    assert geo.haversine_km(30.0, 121.0, 31.0, 121.0) == pytest.approx(111.195, abs=1e-3)


def test_one_degree_of_longitude_shrinks_with_latitude() -> None:
    assert geo.haversine_km(0.0, 0.0, 0.0, 1.0) == pytest.approx(111.195, abs=1e-3)
    at_60 = geo.haversine_km(60.0, 10.0, 60.0, 11.0)
    assert at_60 == pytest.approx(111.195 * 0.5, rel=1e-3)


def test_known_city_distance_and_antipodes() -> None:
    beijing_shanghai = geo.haversine_km(39.9042, 116.4074, 31.2304, 121.4737)
    assert beijing_shanghai == pytest.approx(1067, rel=0.01)
    assert geo.haversine_km(0.0, 0.0, 0.0, 180.0) == pytest.approx(np.pi * geo.EARTH_RADIUS_KM)
    assert geo.haversine_km(12.5, 45.0, 12.5, 45.0) == 0.0


def test_haversine_broadcasts_and_is_symmetric() -> None:
    lat, lon = _world_points(50, seed=1)
    d = geo.haversine_km(lat[:, None], lon[:, None], lat[None, :], lon[None, :])
    assert d.shape == (50, 50)
    np.testing.assert_allclose(d, d.T, rtol=1e-12, atol=1e-9)
    assert np.all(np.diag(d) == 0.0)
    assert np.all(d <= np.pi * geo.EARTH_RADIUS_KM + 1e-6)


# --------------------------------------------------------------------------- bearing


@pytest.mark.parametrize(
    ("lat2", "lon2", "expected"),
    [(1.0, 0.0, 0.0), (0.0, 1.0, np.pi / 2), (-1.0, 0.0, np.pi), (0.0, -1.0, 1.5 * np.pi)],
)
def test_bearing_cardinal_directions(lat2: float, lon2: float, expected: float) -> None:
    assert geo.bearing_rad(0.0, 0.0, lat2, lon2) == pytest.approx(expected, abs=1e-12)


def test_bearing_range_and_coincident_points() -> None:
    lat, lon = _world_points(2000, seed=2)
    b = geo.bearing_rad(lat[:-1], lon[:-1], lat[1:], lon[1:])
    assert np.all((b >= 0.0) & (b < 2 * np.pi))
    assert geo.bearing_rad(31.0, 121.0, 31.0, 121.0) == 0.0


# --------------------------------------------------------------------------- geohash


@pytest.mark.parametrize("precision", [1, 3, 5, 7, 9, 12])
def test_geohash_matches_reference_worldwide(precision: int) -> None:
    lat, lon = _world_points(5000, seed=precision)
    ours = geo.geohash_encode(lat, lon, precision)
    assert ours.dtype == np.dtype(f"<U{precision}")
    assert ours.shape == (5000,)
    expected = [geohash2.encode(a, b, precision) for a, b in zip(lat, lon, strict=True)]
    assert ours.tolist() == expected


@pytest.mark.parametrize("precision", [5, 6, 7, 8])
def test_geohash_matches_reference_in_shanghai(precision: int) -> None:
    points = _shanghai_points(5000, seed=10 + precision)
    ours = geo.geohash_encode(points[:, 0], points[:, 1], precision)
    expected = [geohash2.encode(a, b, precision) for a, b in points]
    assert ours.tolist() == expected


def test_geohash_on_cell_edges_matches_reference() -> None:
    """Points exactly on a bisection line go where the reference puts them."""
    lats = np.array([-90.0, 90.0, 0.0, 45.0, -45.0, 22.5, 31.2890625, 89.999999999])
    lons = np.array([-180.0, 180.0, 0.0, 90.0, -90.0, 121.46484375, 121.5, -179.9999999])
    lat, lon = np.meshgrid(lats, lons)
    for precision in (1, 5, 7, 12):
        ours = geo.geohash_encode(lat.ravel(), lon.ravel(), precision)
        expected = [
            geohash2.encode(a, b, precision) for a, b in zip(lat.ravel(), lon.ravel(), strict=True)
        ]
        assert ours.tolist() == expected


def test_geohash_default_precision_and_scalar() -> None:
    assert str(geo.geohash_encode(31.2304, 121.4737)) == geohash2.encode(31.2304, 121.4737, 7)


def test_geohash_rejects_bad_precision() -> None:
    with pytest.raises(ValueError, match="precision"):
        geo.geohash_encode([0.0], [0.0], 0)
    with pytest.raises(ValueError, match="precision"):
        geo.geohash_encode([0.0], [0.0], 13)


@pytest.mark.parametrize("precision", [1, 5, 7, 11])
def test_decode_centre_is_the_cell_centre(precision: int) -> None:
    lat, lon = _world_points(3000, seed=20 + precision)
    hashes = geo.geohash_encode(lat, lon, precision)
    c_lat, c_lon = geo.geohash_decode_centre(hashes)
    reference = np.array([geohash2.decode_exactly(h)[:4] for h in hashes.tolist()])
    np.testing.assert_allclose(c_lat, reference[:, 0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(c_lon, reference[:, 1], rtol=0, atol=1e-12)
    # The point lies within half a cell of the centre and the centre re-encodes to the cell.
    assert np.all(np.abs(lat - c_lat) <= reference[:, 2] + 1e-12)
    assert np.all(np.abs(lon - c_lon) <= reference[:, 3] + 1e-12)
    assert geo.geohash_encode(c_lat, c_lon, precision).tolist() == hashes.tolist()


def test_decode_centre_mixed_lengths_and_errors() -> None:
    c_lat, c_lon = geo.geohash_decode_centre(np.array(["s", "wtw3sjq", "WTW3SJQ"]))
    assert c_lat.tolist()[0] == 22.5
    assert c_lon.tolist()[0] == 22.5
    assert c_lat[1] == c_lat[2]
    assert c_lon[1] == c_lon[2]
    for bad in ("wtwa", "wtw3i", "", "é"):
        with pytest.raises(ValueError):
            geo.geohash_decode_centre([bad])


@pytest.mark.parametrize("precision", [3, 5, 7])
def test_cell_centre_equals_decoded_centre(precision: int) -> None:
    points = np.vstack([_shanghai_points(2000, seed=30), np.column_stack(_world_points(2000, 31))])
    direct = geo.geohash_cell_centre(points[:, 0], points[:, 1], precision)
    hashes = geo.geohash_encode(points[:, 0], points[:, 1], precision)
    decoded = geo.geohash_decode_centre(hashes)
    np.testing.assert_array_equal(direct[0], decoded[0])
    np.testing.assert_array_equal(direct[1], decoded[1])


# ------------------------------------------------------------------ GCJ-02 and BD-09


def test_gcj02_round_trip_in_shanghai() -> None:
    wgs = _shanghai_points(5000, seed=40)
    gcj = geo.from_wgs84(wgs, CoordSystem.GCJ02)
    back = geo.to_wgs84(gcj, CoordSystem.GCJ02)
    assert np.max(np.abs(back - wgs)) < 1e-7


def test_gcj02_round_trip_across_china() -> None:
    rng = np.random.default_rng(41)
    wgs = np.column_stack([rng.uniform(18.0, 53.0, 5000), rng.uniform(74.0, 134.0, 5000)])
    back = geo.to_wgs84(geo.from_wgs84(wgs, CoordSystem.GCJ02), CoordSystem.GCJ02)
    assert np.max(np.abs(back - wgs)) < 1e-6


def test_gcj02_offset_in_shanghai_is_hundreds_of_metres() -> None:
    wgs = _shanghai_points(1000, seed=42)
    gcj = geo.from_wgs84(wgs, CoordSystem.GCJ02)
    shift = geo.haversine_km(wgs[:, 0], wgs[:, 1], gcj[:, 0], gcj[:, 1])
    assert np.all((shift > 0.3) & (shift < 0.8))
    # GCJ-02 shifts Shanghai east and slightly south.
    assert np.all(gcj[:, 1] > wgs[:, 1])
    assert np.all(gcj[:, 0] < wgs[:, 0])


def test_gcj02_is_identity_outside_china() -> None:
    outside = np.array(
        [
            [35.6762, 139.6503],  # Tokyo
            [51.5074, -0.1278],  # London
            [-33.8688, 151.2093],  # Sydney
            [40.7128, -74.0060],  # New York
            [60.0, 100.0],  # north of the box
            [0.5, 110.0],  # south of the box
        ]
    )
    np.testing.assert_array_equal(geo.from_wgs84(outside, CoordSystem.GCJ02), outside)
    np.testing.assert_array_equal(geo.to_wgs84(outside, CoordSystem.GCJ02), outside)


def test_bd09_round_trip_and_offset() -> None:
    wgs = _shanghai_points(5000, seed=43)
    bd = geo.from_wgs84(wgs, CoordSystem.BD09)
    back = geo.to_wgs84(bd, CoordSystem.BD09)
    assert np.max(np.abs(back - wgs)) < 1e-7
    shift = geo.haversine_km(wgs[:, 0], wgs[:, 1], bd[:, 0], bd[:, 1])
    assert np.all((shift > 0.8) & (shift < 1.6))


def test_bd09_inverts_gcj02_to_bd09_step() -> None:
    """BD-09 -> WGS-84 equals GCJ-02 -> WGS-84 of the GCJ point BD-09 was made from."""
    wgs = _shanghai_points(500, seed=44)
    gcj = geo.from_wgs84(wgs, CoordSystem.GCJ02)
    bd = geo.from_wgs84(wgs, CoordSystem.BD09)
    np.testing.assert_allclose(
        geo.to_wgs84(bd, CoordSystem.BD09),
        geo.to_wgs84(gcj, CoordSystem.GCJ02),
        rtol=0,
        atol=1e-8,
    )


def test_wgs84_is_identity_and_copies() -> None:
    wgs = _shanghai_points(10, seed=45)
    out = geo.to_wgs84(wgs, CoordSystem.WGS84)
    np.testing.assert_array_equal(out, wgs)
    out[0, 0] = 0.0
    assert wgs[0, 0] != 0.0


def test_transforms_keep_empty_and_reject_bad_shapes() -> None:
    empty = np.zeros((0, 2))
    for system in CoordSystem:
        assert geo.to_wgs84(empty, system).shape == (0, 2)
        assert geo.from_wgs84(empty, system).shape == (0, 2)
    with pytest.raises(ValueError, match="shape"):
        geo.to_wgs84(np.zeros((3, 3)), CoordSystem.GCJ02)
    with pytest.raises(ValueError, match="shape"):
        geo.from_wgs84(np.zeros(2), CoordSystem.WGS84)


# --------------------------------------------------------------------- city offsets


def test_en_offset_km() -> None:
    east, north = geo.en_offset_km(SHANGHAI[0], SHANGHAI[1], SHANGHAI)
    assert float(east) == 0.0
    assert float(north) == 0.0
    east, north = geo.en_offset_km(SHANGHAI[0] + 0.1, SHANGHAI[1], SHANGHAI)
    assert float(north) == pytest.approx(11.1195, abs=1e-3)
    assert float(east) == 0.0
    east, north = geo.en_offset_km(SHANGHAI[0], SHANGHAI[1] - 0.1, SHANGHAI)
    assert float(east) == pytest.approx(-11.1195 * np.cos(np.radians(SHANGHAI[0])), abs=1e-3)


def test_en_offset_agrees_with_haversine_at_city_scale() -> None:
    points = _shanghai_points(1000, seed=46)
    east, north = geo.en_offset_km(points[:, 0], points[:, 1], SHANGHAI)
    flat = np.hypot(east, north)
    great_circle = geo.haversine_km(SHANGHAI[0], SHANGHAI[1], points[:, 0], points[:, 1])
    np.testing.assert_allclose(flat, great_circle, rtol=1e-3, atol=1e-3)


def test_haversine_bearing_is_bitwise_the_two_functions() -> None:
    rng = np.random.default_rng(31)
    lat1, lat2 = rng.uniform(-90, 90, (2, 500))
    lon1, lon2 = rng.uniform(-180, 180, (2, 500))
    lat2[:50], lon2[:50] = lat1[:50], lon1[:50]  # coincident points
    km, bearing = geo.haversine_bearing(lat1, lon1, lat2, lon2)
    assert km.tobytes() == geo.haversine_km(lat1, lon1, lat2, lon2).tobytes()
    assert bearing.tobytes() == geo.bearing_rad(lat1, lon1, lat2, lon2).tobytes()


@pytest.mark.parametrize("precision", [1, 5, 7, 12])
def test_cell_centre_latlon_is_bitwise_geohash_cell_centre(precision: int) -> None:
    rng = np.random.default_rng(32)
    points = np.column_stack([rng.uniform(-90, 90, 400), rng.uniform(-180, 180, 400)])
    points[:8] = [
        [0, 0],
        [90, 180],
        [-90, -180],
        [45, 90],
        [-45, -90],
        [90, 0],
        [0, 180],
        [0, -180],
    ]
    lat, lon = geo.geohash_cell_centre(points[:, 0], points[:, 1], precision)
    centre = geo.cell_centre_latlon(points, precision)
    assert centre[:, 0].tobytes() == lat.tobytes()
    assert centre[:, 1].tobytes() == lon.tobytes()


def test_non_finite_points_land_in_the_edge_cells() -> None:
    # NaN goes to cell 0, infinities to the first or last cell, as before the fmin/fmax rewrite.
    lat = np.array([np.nan, np.inf, -np.inf, np.nan])
    lon = np.array([np.nan, -np.inf, np.inf, 10.0])
    assert geo.geohash_encode(lat, lon, 5).tolist() == ["00000", "bpbpb", "pbpbp", "h0p05"]
