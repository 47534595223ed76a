"""Geodesy for dispatch: distances, bearings, geohash zones and Chinese map datums.

Everything is vectorised numpy over arrays of points, because the encoder evaluates
thousands of order/rider pairs per window and a Python loop per point would dominate
the request's latency. Coordinates are degrees; pairs are ``[lat, lon]``.

The GCJ-02 and BD-09 transforms follow the widely published description of those
datums (Krasovsky ellipsoid parameters, the polynomial-plus-sine offset, BD-09's polar
perturbation); the inverse transforms are computed by fixed-point iteration of the
forward ones, so a round trip is exact to well under a millimetre.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import CoordSystem

__all__ = [
    "EARTH_RADIUS_KM",
    "MAX_GEOHASH_PRECISION",
    "FloatArray",
    "bearing_rad",
    "cell_centre_latlon",
    "en_offset_km",
    "from_wgs84",
    "geohash_cell_centre",
    "geohash_decode_centre",
    "geohash_encode",
    "geohash_grid",
    "haversine_bearing",
    "haversine_km",
    "in_mainland_china",
    "to_wgs84",
]

FloatArray = NDArray[np.float64]

# Mean Earth radius (IUGG): one degree of latitude is then ~111.195 km.
EARTH_RADIUS_KM: Final = 6371.0088

# ---------------------------------------------------------------- distances and bearings


def _f64(value: ArrayLike) -> FloatArray:
    return np.asarray(value, dtype=np.float64)


def haversine_km(lat1: ArrayLike, lon1: ArrayLike, lat2: ArrayLike, lon2: ArrayLike) -> FloatArray:
    """Great-circle distance in km; arguments broadcast like numpy ufuncs."""
    phi1 = np.radians(_f64(lat1))
    phi2 = np.radians(_f64(lat2))
    half_dphi = (phi2 - phi1) * 0.5
    half_dlam = np.radians(_f64(lon2) - _f64(lon1)) * 0.5
    a = np.sin(half_dphi) ** 2 + np.cos(phi1) * np.cos(phi2) * np.sin(half_dlam) ** 2
    return np.asarray(2.0 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(a.clip(0.0, 1.0))))


def bearing_rad(lat1: ArrayLike, lon1: ArrayLike, lat2: ArrayLike, lon2: ArrayLike) -> FloatArray:
    """Initial bearing from point 1 to point 2, radians in [0, 2*pi), clockwise from north.

    Coincident points get 0 (north) rather than NaN, so features stay finite.
    """
    phi1 = np.radians(_f64(lat1))
    phi2 = np.radians(_f64(lat2))
    dlam = np.radians(_f64(lon2) - _f64(lon1))
    y = np.sin(dlam) * np.cos(phi2)
    x = np.cos(phi1) * np.sin(phi2) - np.sin(phi1) * np.cos(phi2) * np.cos(dlam)
    return np.asarray(np.mod(np.arctan2(y, x), 2.0 * np.pi))


def haversine_bearing(
    lat1: ArrayLike, lon1: ArrayLike, lat2: ArrayLike, lon2: ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """(`haversine_km`, `bearing_rad`) in one pass, bit for bit the same values.

    The two share their radians and cosines; the encoder needs both for every pair, and
    on small windows the count of numpy calls, not the arithmetic, is the cost.
    """
    phi1 = np.radians(_f64(lat1))
    phi2 = np.radians(_f64(lat2))
    dlam = np.radians(_f64(lon2) - _f64(lon1))
    cos_phi1 = np.cos(phi1)
    cos_phi2 = np.cos(phi2)
    a = np.sin((phi2 - phi1) * 0.5) ** 2 + cos_phi1 * cos_phi2 * np.sin(dlam * 0.5) ** 2
    km = 2.0 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(a.clip(0.0, 1.0)))  # np.clip, unwrapped
    y = np.sin(dlam) * cos_phi2
    x = cos_phi1 * np.sin(phi2) - np.sin(phi1) * cos_phi2 * np.cos(dlam)
    return np.asarray(km), np.asarray(np.mod(np.arctan2(y, x), 2.0 * np.pi))


def en_offset_km(
    lat: ArrayLike, lon: ArrayLike, origin: tuple[ArrayLike, ArrayLike]
) -> tuple[FloatArray, FloatArray]:
    """(east_km, north_km) of points relative to ``origin`` [lat, lon] (a city's centre).

    Equirectangular at the mean latitude: within a city the error is metres, and the
    result is a smooth, model-friendly position rather than an exact distance.
    """
    lat_arr = _f64(lat)
    lon_arr = _f64(lon)
    lat0, lon0 = _f64(origin[0]), _f64(origin[1])
    km_per_rad = EARTH_RADIUS_KM
    mean_lat = np.radians((lat_arr + lat0) * 0.5)
    east = km_per_rad * np.radians(lon_arr - lon0) * np.cos(mean_lat)
    north = km_per_rad * np.radians(lat_arr - lat0)
    return np.asarray(east), np.asarray(north)


# ---------------------------------------------------------------------------------- geohash

_BASE32: Final = "0123456789bcdefghjkmnpqrstuvwxyz"
_BASE32_CHARS: Final = np.array(list(_BASE32), dtype="<U1")
_BASE32_VALUE: Final = np.full(128, -1, dtype=np.int64)
_BASE32_VALUE[[ord(c) for c in _BASE32]] = np.arange(32)
MAX_GEOHASH_PRECISION: Final = 12  # 60 bits: fits an int64


def _check_precision(precision: int) -> None:
    if not 1 <= precision <= MAX_GEOHASH_PRECISION:
        raise ValueError(f"geohash precision must be within 1..{MAX_GEOHASH_PRECISION}")


def _bit_split(precision: int) -> tuple[int, int]:
    """(lat_bits, lon_bits): bits alternate starting with longitude."""
    total = 5 * precision
    return total // 2, (total + 1) // 2


def _grid(precision: int) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """(half range, cells, cell size, last cell, cells per degree) per axis (lat, lon) of a
    precision's geohash grid: built once per precision at import, not on every call."""
    lat_bits, lon_bits = _bit_split(precision)
    half = np.array([90.0, 180.0])
    cells = np.array([float(1 << lat_bits), float(1 << lon_bits)])
    return half, cells, 2.0 * half / cells, cells - 1.0, cells / (2.0 * half)


_GRIDS: Final = {precision: _grid(precision) for precision in range(1, MAX_GEOHASH_PRECISION + 1)}


def geohash_grid(
    precision: int,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """A precision's grid per axis (lat, lon): half range, cells, cell size, last cell and
    cells per degree, as `_quantise` reads them (the pair encoder's compiled zones too)."""
    _check_precision(precision)
    return _GRIDS[precision]


def _quantise(latlon: FloatArray, precision: int) -> NDArray[np.int64]:
    """[n, 2] cell indices (lat, lon) as produced by geohash bisection, ``value > mid`` up.

    A float estimate is corrected against the exact cell edges, so points on an edge
    land in the same cell as the reference bisection (the lower one). Both axes go
    through each numpy call together (per-column constants broadcast): these few calls
    are on the encoder's per-window path. An edge ``k * step - half_range`` is exact in
    float64 (``step`` is 45 or 90 times a power of two and ``k < 2**30``).
    """
    half, _, step, top, per_degree = _GRIDS[precision]
    # fmax/fmin rather than clip: NaN lands in cell 0 and infinities at the ends.
    q = np.fmin(np.fmax(np.floor((latlon + half) * per_degree), 0.0), top)
    q -= (q > 0.0) & (latlon <= q * step - half)
    q += (q < top) & (latlon > (q + 1.0) * step - half)
    return q.astype(np.int64)


def _centre(q: NDArray[np.int64], bits: int, half_range: float) -> FloatArray:
    scale = float(1 << bits)
    return np.asarray(half_range * (2.0 * q.astype(np.float64) + 1.0 - scale) / scale)


def _interleave(
    lat_q: NDArray[np.int64], lon_q: NDArray[np.int64], precision: int
) -> NDArray[np.int64]:
    """Interleave the bits (longitude first, most significant first) into one integer."""
    lat_bits, lon_bits = _bit_split(precision)
    code = np.zeros(lat_q.shape, dtype=np.int64)
    for i in range(5 * precision):
        if i % 2 == 0:
            bit = (lon_q >> (lon_bits - 1 - i // 2)) & 1
        else:
            bit = (lat_q >> (lat_bits - 1 - i // 2)) & 1
        code = (code << 1) | bit
    return code


def _deinterleave(
    code: NDArray[np.int64], precision: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    total = 5 * precision
    lat_q = np.zeros(code.shape, dtype=np.int64)
    lon_q = np.zeros(code.shape, dtype=np.int64)
    for i in range(total):
        bit = (code >> (total - 1 - i)) & 1
        if i % 2 == 0:
            lon_q = (lon_q << 1) | bit
        else:
            lat_q = (lat_q << 1) | bit
    return lat_q, lon_q


def _quantise_latlon(
    lat: ArrayLike, lon: ArrayLike, precision: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    _check_precision(precision)
    lat_arr, lon_arr = np.broadcast_arrays(_f64(lat), _f64(lon))
    q = _quantise(np.stack((lat_arr.reshape(-1), lon_arr.reshape(-1)), axis=1), precision)
    return q[:, 0].reshape(lat_arr.shape), q[:, 1].reshape(lat_arr.shape)


def geohash_encode(lat: ArrayLike, lon: ArrayLike, precision: int = 7) -> NDArray[np.str_]:
    """Geohash strings (dtype ``<U{precision}``), identical to the classic bisection encoder."""
    lat_q, lon_q = _quantise_latlon(lat, lon, precision)
    code = _interleave(lat_q, lon_q, precision).reshape(-1)
    shifts = 5 * np.arange(precision - 1, -1, -1, dtype=np.int64)
    digits = (code[:, None] >> shifts[None, :]) & 31
    chars = np.ascontiguousarray(_BASE32_CHARS[digits])
    return chars.view(f"<U{precision}").reshape(lat_q.shape)


def geohash_decode_centre(hashes: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """(lat, lon) of the centres of the given geohash cells; mixed lengths are allowed."""
    raw = np.asarray(hashes)
    if raw.dtype.kind == "S":
        raw = np.char.decode(raw, "ascii")
    flat = raw.astype(str).reshape(-1)
    lat = np.empty(flat.shape, dtype=np.float64)
    lon = np.empty(flat.shape, dtype=np.float64)
    lengths = np.char.str_len(flat) if flat.size else np.zeros(0, dtype=np.int64)
    for length in np.unique(lengths).tolist():
        _check_precision(int(length))
        rows = np.flatnonzero(lengths == length)
        fixed = np.ascontiguousarray(np.char.lower(flat[rows]).astype(f"<U{length}"))
        points = fixed.view(np.uint32).reshape(rows.size, length)
        values = _BASE32_VALUE[np.minimum(points, 127)]
        if (points > 127).any() or (values < 0).any():
            raise ValueError("geohash contains a character outside the base32 alphabet")
        code = np.zeros(rows.size, dtype=np.int64)
        for column in range(length):
            code = (code << 5) | values[:, column]
        lat_q, lon_q = _deinterleave(code, int(length))
        lat_bits, lon_bits = _bit_split(int(length))
        lat[rows] = _centre(lat_q, lat_bits, 90.0)
        lon[rows] = _centre(lon_q, lon_bits, 180.0)
    return lat.reshape(raw.shape), lon.reshape(raw.shape)


def geohash_cell_centre(
    lat: ArrayLike, lon: ArrayLike, precision: int = 5
) -> tuple[FloatArray, FloatArray]:
    """Centre of each point's geohash cell, straight from the quantised integers.

    Same cell as ``geohash_encode`` but without building strings: the hot path only
    needs the zone's position.
    """
    lat_q, lon_q = _quantise_latlon(lat, lon, precision)
    lat_bits, lon_bits = _bit_split(precision)
    return _centre(lat_q, lat_bits, 90.0), _centre(lon_q, lon_bits, 180.0)


def cell_centre_latlon(latlon: FloatArray, precision: int = 5) -> FloatArray:
    """`geohash_cell_centre` for an [n, 2] array of [lat, lon]; returns [n, 2] centres."""
    _check_precision(precision)
    q = _quantise(latlon, precision)
    half, cells = _GRIDS[precision][:2]
    return np.asarray(half * (2.0 * q.astype(np.float64) + 1.0 - cells) / cells)


# ----------------------------------------------------------------------- GCJ-02 and BD-09

_KRASOVSKY_A: Final = 6378245.0
_KRASOVSKY_EE: Final = 0.00669342162296594323
_BD_X_PI: Final = np.pi * 3000.0 / 180.0
_INVERSE_TOLERANCE_DEG: Final = 1e-12
_INVERSE_MAX_ITER: Final = 50


def _as_latlon(latlon: ArrayLike) -> FloatArray:
    array = np.array(latlon, dtype=np.float64)  # a copy: callers keep their input
    if array.ndim != 2 or array.shape[1] != 2:
        raise ValueError(f"latlon must have shape [n, 2], got {array.shape}")
    return array


def in_mainland_china(lat: ArrayLike, lon: ArrayLike) -> NDArray[np.bool_]:
    """The rectangle in which the standard GCJ-02 formula applies an offset."""
    lat_arr = _f64(lat)
    lon_arr = _f64(lon)
    return np.asarray(
        (lon_arr >= 72.004) & (lon_arr <= 137.8347) & (lat_arr >= 0.8293) & (lat_arr <= 55.8271)
    )


def _gcj_offset(lat: FloatArray, lon: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(dlat, dlon) in degrees that GCJ-02 adds to a WGS-84 point; zero outside China."""
    x = lon - 105.0
    y = lat - 35.0
    pi = np.pi
    common = (20.0 * np.sin(6.0 * x * pi) + 20.0 * np.sin(2.0 * x * pi)) * 2.0 / 3.0
    sqrt_abs_x = np.sqrt(np.abs(x))
    dlat = -100.0 + 2.0 * x + 3.0 * y + 0.2 * y * y + 0.1 * x * y + 0.2 * sqrt_abs_x + common
    dlat += (20.0 * np.sin(y * pi) + 40.0 * np.sin(y / 3.0 * pi)) * 2.0 / 3.0
    dlat += (160.0 * np.sin(y / 12.0 * pi) + 320.0 * np.sin(y * pi / 30.0)) * 2.0 / 3.0
    dlon = 300.0 + x + 2.0 * y + 0.1 * x * x + 0.1 * x * y + 0.1 * sqrt_abs_x + common
    dlon += (20.0 * np.sin(x * pi) + 40.0 * np.sin(x / 3.0 * pi)) * 2.0 / 3.0
    dlon += (150.0 * np.sin(x / 12.0 * pi) + 300.0 * np.sin(x / 30.0 * pi)) * 2.0 / 3.0

    rad_lat = np.radians(lat)
    magic = 1.0 - _KRASOVSKY_EE * np.sin(rad_lat) ** 2
    sqrt_magic = np.sqrt(magic)
    dlat = (dlat * 180.0) / ((_KRASOVSKY_A * (1.0 - _KRASOVSKY_EE)) / (magic * sqrt_magic) * pi)
    dlon = (dlon * 180.0) / (_KRASOVSKY_A / sqrt_magic * np.cos(rad_lat) * pi)
    inside = in_mainland_china(lat, lon)
    return np.where(inside, dlat, 0.0), np.where(inside, dlon, 0.0)


def _wgs84_to_gcj02(latlon: FloatArray) -> FloatArray:
    dlat, dlon = _gcj_offset(latlon[:, 0], latlon[:, 1])
    return np.stack([latlon[:, 0] + dlat, latlon[:, 1] + dlon], axis=1)


def _gcj02_to_wgs84(latlon: FloatArray) -> FloatArray:
    """Invert GCJ-02 by fixed-point iteration: wgs = gcj - offset(wgs).

    The offset changes by well under 1% of itself across its own size, so each step
    gains about two digits; a handful of steps reach 1e-12 degrees.
    """
    target_lat, target_lon = latlon[:, 0], latlon[:, 1]
    lat, lon = target_lat.copy(), target_lon.copy()
    for _ in range(_INVERSE_MAX_ITER):
        dlat, dlon = _gcj_offset(lat, lon)
        new_lat, new_lon = target_lat - dlat, target_lon - dlon
        change = max(
            float(np.max(np.abs(new_lat - lat), initial=0.0)),
            float(np.max(np.abs(new_lon - lon), initial=0.0)),
        )
        lat, lon = new_lat, new_lon
        if change < _INVERSE_TOLERANCE_DEG:
            break
    return np.stack([lat, lon], axis=1)


def _gcj02_to_bd09(latlon: FloatArray) -> FloatArray:
    lat, lon = latlon[:, 0], latlon[:, 1]
    z = np.sqrt(lon * lon + lat * lat) + 0.00002 * np.sin(lat * _BD_X_PI)
    theta = np.arctan2(lat, lon) + 0.000003 * np.cos(lon * _BD_X_PI)
    return np.stack([z * np.sin(theta) + 0.006, z * np.cos(theta) + 0.0065], axis=1)


def _bd09_to_gcj02(latlon: FloatArray) -> FloatArray:
    """The closed-form approximate inverse, then refined against the forward transform."""
    y = latlon[:, 0] - 0.006
    x = latlon[:, 1] - 0.0065
    z = np.sqrt(x * x + y * y) - 0.00002 * np.sin(y * _BD_X_PI)
    theta = np.arctan2(y, x) - 0.000003 * np.cos(x * _BD_X_PI)
    gcj: FloatArray = np.stack([z * np.sin(theta), z * np.cos(theta)], axis=1)
    for _ in range(_INVERSE_MAX_ITER):
        error: FloatArray = latlon - _gcj02_to_bd09(gcj)
        gcj = np.asarray(gcj + error, dtype=np.float64)
        if float(np.max(np.abs(error), initial=0.0)) < _INVERSE_TOLERANCE_DEG:
            break
    return gcj


def to_wgs84(latlon: ArrayLike, system: CoordSystem) -> FloatArray:
    """Convert [n, 2] [lat, lon] from ``system`` to WGS-84 (always a new array)."""
    array = _as_latlon(latlon)
    if system == CoordSystem.WGS84:
        return array
    if system == CoordSystem.GCJ02:
        return _gcj02_to_wgs84(array)
    if system == CoordSystem.BD09:
        return _gcj02_to_wgs84(_bd09_to_gcj02(array))
    raise ValueError(f"unknown coordinate system {system!r}")


def from_wgs84(latlon: ArrayLike, system: CoordSystem) -> FloatArray:
    """Convert [n, 2] WGS-84 [lat, lon] into ``system`` (what a Chinese map app would show)."""
    array = _as_latlon(latlon)
    if system == CoordSystem.WGS84:
        return array
    if system == CoordSystem.GCJ02:
        return _wgs84_to_gcj02(array)
    if system == CoordSystem.BD09:
        return _gcj02_to_bd09(_wgs84_to_gcj02(array))
    raise ValueError(f"unknown coordinate system {system!r}")
