"""The pair encoder's per-element arithmetic, compiled with numba: one loop per table
(and the resolver's per-order ranking).

Why: `features.encode_pairs_batch` computed each column as a chain of numpy calls (a small
window paid ~40 of them, each a microsecond or so over a handful of values; a large one a
pass over memory per call), and wrote its block through transposed fancy-indexed copies.
Here the legs' distances and bearings, the zones' cells and every point's place in the
city plane are one loop (`leg_geometry`), the block one more (`write_block`), and the
map's columns of each city's legs (`map_columns`: barriers crossed, detours, road minutes;
`barrier_detours` gives the simulator the same detours) a third;
the candidate ranking's rider-to-pickup distances one more (`pair_distances`), and the
resolver ranks each order's candidates for its Top-K list in another (`rank_candidates`,
a stable sort by the keys ``np.lexsort`` compared).

The same values, bit for bit, as the numpy expressions they replace (kept as the oracle in
tests/unit/domain/test_pair_kernels.py): each element goes through the same IEEE operations
in the same order (no fused multiply-add, no reassociation: numba's default, not
``fastmath``), and the transcendental functions are the C library's (``sin``, ``cos``,
``asin``, ``atan2``), which numpy's float64 loops call on a CPU without AVX-512 as well.
A sum over barriers follows numpy's pairwise order (`_pairwise_sum`). The segment-side
tests (`planar.segment_cuts`) stay numpy's matrix products: OpenBLAS fuses their
multiply-adds in an order that depends on the CPU and the shapes.

The kernels are compiled with explicit signatures when this module is imported (from
numba's cache in ``__pycache__`` after the first time), so a model pays for them at load,
never on a request; the callers hand them arrays of exactly those dtypes.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from dispatch_service.domain.kernel_types import (
    B_2D,
    F8,
    F8_2D,
    I8,
    I8_2D,
    INTP,
    OUT_F8,
    OUT_F8_2D,
    U8_2D,
    compiled,
    inlined,
)
from dispatch_service.domain.kernel_types import numba_types as _types

__all__ = [
    "barrier_detours",
    "haversine",
    "leg_geometry",
    "map_columns",
    "pair_distances",
    "rank_candidates",
    "write_block",
]

_TWO_PI: Final = 2.0 * math.pi


@compiled(_types.float64(_types.float64, _types.UniTuple(F8, 5), _types.intp))
def _cell_centre(value: float, grid: Any, axis: int) -> float:
    """One coordinate's geohash cell centre on ``grid`` (`geo.geohash_grid`) along ``axis``
    (0: lat, 1: lon), as `geo._quantise` and `geo.cell_centre_latlon` compute it."""
    half, cells, step, top, per_degree = (
        grid[0][axis], grid[1][axis], grid[2][axis], grid[3][axis], grid[4][axis]
    )  # fmt: skip
    q = np.floor((value + half) * per_degree)
    q = top if q > top else (q if q >= 0.0 else 0.0)  # np.fmin(np.fmax(q, 0), top), NaN to 0
    if q > 0.0 and value <= q * step - half:
        q -= 1.0
    if q < top and value > (q + 1.0) * step - half:
        q += 1.0
    return float(half * (2.0 * q + 1.0 - cells) / cells)


@compiled(
    _types.float64(_types.float64, _types.float64, _types.float64, _types.float64, _types.float64)
)
def haversine(lat1: float, lon1: float, lat2: float, lon2: float, radius: float) -> float:
    """`geo.haversine_km` of one pair of points, on a sphere of ``radius`` km."""
    phi1 = math.radians(lat1)
    phi2 = math.radians(lat2)
    half_dphi = math.sin((phi2 - phi1) * 0.5)
    half_dlam = math.sin(math.radians(lon2 - lon1) * 0.5)
    a = half_dphi * half_dphi + math.cos(phi1) * math.cos(phi2) * (half_dlam * half_dlam)
    return float(2.0 * radius * math.asin(math.sqrt(min(max(a, 0.0), 1.0))))


@compiled(_types.void(_types.Tuple((F8_2D, I8)), _types.Tuple((F8_2D, I8)), _types.float64, OUT_F8))
def pair_distances(first: Any, second: Any, radius: float, km: Any) -> None:
    """``km[i]``: `geo.haversine_km` from point ``index[i]`` of ``first`` (points [n, 2],
    index [k]) to point ``index[i]`` of ``second`` (likewise), bit for bit its values: the
    candidate ranking's distances without gathering the points first."""
    points, index = first
    others, other_index = second
    for i in range(km.shape[0]):
        a, b = index[i], other_index[i]
        km[i] = haversine(points[a, 0], points[a, 1], others[b, 0], others[b, 1], radius)


# (the riders' positions [R, 2], each pair's rider [P] and order [P], pickups [B, 2],
# drop-offs [B, 2])
_POINTS: Final = _types.Tuple((F8_2D, I8, I8, F8_2D, F8_2D))
# (origin lat [1 or Z], origin lon [1 or Z], the earth's radius in km)
_ORIGIN: Final = _types.Tuple((F8, F8, _types.float64))
# (km, bearing sine, bearing cosine [L]; zone east, zone north [Z]; plane [Z, 2])
_GEOMETRY: Final = _types.Tuple((*[OUT_F8] * 5, OUT_F8_2D))


@inlined
def _latitude(lat: float) -> tuple[float, float, float]:
    """A latitude in radians, its cosine and its sine, as `geo.haversine_bearing` takes them."""
    phi = math.radians(lat)
    return phi, math.cos(phi), math.sin(phi)


@inlined
def _point_plane(
    lat: float, lon: float, grid: Any, origin: tuple[float, float, float]
) -> tuple[float, float, float, float]:
    """A point's geohash zone's centre on ``grid`` and the point itself in the city plane
    (``origin``: its lat, lon and the earth's radius): zone east, north, point east, north."""
    lat0, lon0, radius = origin
    centre_lat = _cell_centre(lat, grid, 0)
    centre_lon = _cell_centre(lon, grid, 1)
    # `geo.en_offset_km` of the zone's centre, then of the point
    mean_lat = math.radians((centre_lat + lat0) * 0.5)
    zone_east = radius * math.radians(centre_lon - lon0) * math.cos(mean_lat)
    zone_north = radius * math.radians(centre_lat - lat0)
    mean_lat = math.radians((lat + lat0) * 0.5)
    east = radius * math.radians(lon - lon0) * math.cos(mean_lat)
    north = radius * math.radians(lat - lat0)
    return zone_east, zone_north, east, north


@compiled(_types.void(_POINTS, _types.UniTuple(F8, 5), _ORIGIN, _GEOMETRY))
def leg_geometry(points: Any, grid: Any, origin: Any, out: Any) -> None:
    """Per leg (each pair's rider -> its order's pickup, then each order's pickup -> its
    drop-off): its km (`geo.haversine_km`), the sine and cosine of its bearing
    (`geo.bearing_rad`); per point (the pairs' riders, the pickups, the drop-offs): its
    geohash zone's centre on ``grid`` (`geo.geohash_grid`) and the point itself in the city
    plane (`geo.en_offset_km` from the origin: one for all, or one per point; every pair
    of one rider has that rider's window's).

    ``points``, ``origin``, ``out``: the tuples `_POINTS`, `_ORIGIN`, `_GEOMETRY` describe;
    ``out`` is written. A rider listed for several orders, and a pickup shared by its
    order's pairs, has its latitude's sine and cosine, its zone and its plane offsets
    computed once (the same operations on the same values: the same bits)."""
    riders, pair_rider, pair_order, pickup, dropoff = points
    origin_lat, origin_lon, radius = origin
    km, bearing_sin, bearing_cos, zone_east, zone_north, plane = out
    pairs = pair_order.shape[0]
    orders = pickup.shape[0]
    legs = pairs + orders
    per_point = origin_lat.shape[0] > 1
    # each rider's latitude terms and place (filled at its first pair: `placed`), each
    # pickup's latitude terms
    placed = np.zeros(riders.shape[0], dtype=np.bool_)
    rider_terms = np.empty((riders.shape[0], 7))
    pickup_terms = np.empty((orders, 3))
    for order in range(orders):
        pickup_terms[order, 0], pickup_terms[order, 1], pickup_terms[order, 2] = _latitude(
            pickup[order, 0]
        )
    for leg in range(legs):
        if leg < pairs:
            rider, order = pair_rider[leg], pair_order[leg]
            lat1, lon1 = riders[rider, 0], riders[rider, 1]
            if not placed[rider]:
                placed[rider] = True
                at = leg if per_point else 0
                terms = rider_terms[rider]
                terms[0], terms[1], terms[2] = _latitude(lat1)
                terms[3], terms[4], terms[5], terms[6] = _point_plane(
                    lat1, lon1, grid, (origin_lat[at], origin_lon[at], radius)
                )
            phi1, cos_phi1, sin_phi1 = (
                rider_terms[rider, 0],
                rider_terms[rider, 1],
                rider_terms[rider, 2],
            )
            lon2 = pickup[order, 1]
            phi2, cos_phi2, sin_phi2 = (
                pickup_terms[order, 0],
                pickup_terms[order, 1],
                pickup_terms[order, 2],
            )
        else:
            order = leg - pairs
            lon1 = pickup[order, 1]
            phi1, cos_phi1, sin_phi1 = (
                pickup_terms[order, 0],
                pickup_terms[order, 1],
                pickup_terms[order, 2],
            )
            lon2 = dropoff[order, 1]
            phi2, cos_phi2, sin_phi2 = _latitude(dropoff[order, 0])
        # `geo.haversine_bearing`
        dlam = math.radians(lon2 - lon1)
        half_dphi = math.sin((phi2 - phi1) * 0.5)
        half_dlam = math.sin(dlam * 0.5)
        a = half_dphi * half_dphi + cos_phi1 * cos_phi2 * (half_dlam * half_dlam)
        a = min(max(a, 0.0), 1.0)
        km[leg] = 2.0 * radius * math.asin(math.sqrt(a))
        y = math.sin(dlam) * cos_phi2
        x = cos_phi1 * sin_phi2 - sin_phi1 * cos_phi2 * math.cos(dlam)
        # np.mod: the C remainder, moved into [0, 2 pi) (numpy's npy_divmod)
        bearing = np.fmod(math.atan2(y, x), _TWO_PI)
        if bearing != 0.0:
            if bearing < 0.0:
                bearing += _TWO_PI
        else:
            bearing = 0.0
        bearing_sin[leg] = math.sin(bearing)
        bearing_cos[leg] = math.cos(bearing)
    for point in range(legs + orders):
        if point < pairs:
            terms = rider_terms[pair_rider[point]]
            zone_east[point], zone_north[point] = terms[3], terms[4]
            plane[point, 0], plane[point, 1] = terms[5], terms[6]
            continue
        if point < legs:
            lat, lon = pickup[point - pairs, 0], pickup[point - pairs, 1]
        else:
            lat, lon = dropoff[point - legs, 0], dropoff[point - legs, 1]
        at = point if per_point else 0
        zone_east[point], zone_north[point], plane[point, 0], plane[point, 1] = _point_plane(
            lat, lon, grid, (origin_lat[at], origin_lon[at], radius)
        )


# (pair columns, order columns, window columns, vehicle codes, order flag bits)
_LAYOUT: Final = _types.UniTuple(I8, 5)
# (each pair's order, its rider's vehicle, load, capacity; the map's columns [4, P])
_PAIRS: Final = _types.Tuple((I8, I8, F8, F8, F8_2D))
# (each order's window, created_at, promised minutes, constraints; the map's columns
# [2, B]; each window's dispatch time and its hour and weekend values [W, 3])
_ORDERS: Final = _types.Tuple((I8, I8, F8, I8, F8_2D, F8, F8_2D))


@compiled(
    _types.void(_types.float32[:, :], _LAYOUT, _types.Tuple((*[F8] * 5, F8_2D)), _PAIRS, _ORDERS)
)
def write_block(block: Any, layout: Any, geometry: Any, pairs: Any, orders: Any) -> None:
    """The float32 block [P, F] of `features.encode_pairs_batch`: each pair's columns, its
    order's and its window's at their places in ``layout`` (`features._PAIR_COLUMNS`,
    `_ORDER_COLUMNS`, `_WINDOW_COLUMNS`, in order), each value the float64 the numpy
    expressions gave, rounded to float32. ``geometry``: `leg_geometry`'s output;
    ``pairs``, ``orders``: the tuples `_PAIRS` and `_ORDERS` describe."""
    pair_at, order_at, window_at, vehicles, order_flags = layout
    km, bearing_sin, bearing_cos, zone_east, zone_north, _ = geometry
    pair_order, vehicle, load, capacity, pair_roads = pairs
    order_window, created_at, promised, constraints, order_roads, dispatch_time, window_values = (
        orders
    )
    num_pairs = pair_order.shape[0]
    num_orders = order_window.shape[0]
    for p in range(num_pairs):
        row = block[p]
        row[pair_at[0]] = km[p]
        row[pair_at[1]] = bearing_sin[p]
        row[pair_at[2]] = bearing_cos[p]
        row[pair_at[3]] = zone_east[p]
        row[pair_at[4]] = zone_north[p]
        row[pair_at[5]] = load[p]
        row[pair_at[6]] = capacity[p]
        row[pair_at[7]] = load[p] / max(capacity[p], 1.0)
        for v in range(vehicles.shape[0]):
            row[pair_at[8 + v]] = 1.0 if vehicle[p] == vehicles[v] else 0.0
        for c in range(pair_roads.shape[0]):
            row[pair_at[11 + c]] = pair_roads[c, p]
        b = pair_order[p]
        trip, pickup_zone, dropoff_zone = num_pairs + b, num_pairs + b, num_pairs + num_orders + b
        row[order_at[0]] = km[trip]
        row[order_at[1]] = bearing_sin[trip]
        row[order_at[2]] = bearing_cos[trip]
        row[order_at[3]] = zone_east[pickup_zone]
        row[order_at[4]] = zone_north[pickup_zone]
        row[order_at[5]] = zone_east[dropoff_zone]
        row[order_at[6]] = zone_north[dropoff_zone]
        w = order_window[b]
        age = max((dispatch_time[w] - np.float64(created_at[b])) / 60.0, 0.0)
        row[order_at[7]] = age
        row[order_at[8]] = promised[b]
        row[order_at[9]] = promised[b] - age
        for f in range(order_flags.shape[0]):
            row[order_at[10 + f]] = 1.0 if (constraints[b] & order_flags[f]) != 0 else 0.0
        for c in range(order_roads.shape[0]):
            row[order_at[14 + c]] = order_roads[c, b]
        for c in range(window_at.shape[0]):
            row[window_at[c]] = window_values[w, c]


@compiled(_types.float64(OUT_F8))
def _pairwise_sum(values: Any) -> float:
    """``np.add.reduce`` of a contiguous float64 row, in numpy's order (its pairwise
    summation: sequential below 8 values, eight running sums up to 128, halves above)."""
    n = values.shape[0]
    if n < 8:
        total = 0.0
        for i in range(n):
            total += values[i]
        return float(total)
    if n <= 128:
        r = values[:8].copy()
        i = 8
        while i < n - (n % 8):
            for j in range(8):
                r[j] += values[i + j]
            i += 8
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            total += values[i]
            i += 1
        return float(total)
    half = n // 2
    half -= half % 8
    return float(_pairwise_sum(values[:half]) + _pairwise_sum(values[half:]))


# (each barrier's first segment [K], every crossing [C, 2], each barrier's first crossing [K])
_NETWORK: Final = _types.Tuple((INTP, F8_2D, INTP))
# (the legs' starts [L, 2], ends [L, 2], straight km [L])
_LEGS: Final = _types.Tuple((F8_2D, F8_2D, F8))


@compiled(
    _types.float64(
        B_2D,
        _NETWORK,
        _types.UniTuple(_types.float64, 5),
        _types.intp,
        _types.Tuple((_types.boolean[:], OUT_F8)),
    )
)
def _leg_barriers(cuts: Any, network: Any, leg: Any, at: int, rows: Any) -> float:
    """One leg's row of `barrier_detours`: ``crossed`` [K] written, its detour km returned.
    ``leg``: (start east, start north, end east, end north, straight km); ``at``: its row of
    ``cuts``; ``rows``: (``crossed`` [K], ``extra`` [K] scratch)."""
    crossed, extra = rows
    segment_first, crossings, crossing_first = network
    sx, sy, ex, ey, direct = leg
    segments = cuts.shape[1]
    barriers = segment_first.shape[0]
    points = crossings.shape[0]
    any_crossed = False
    for k in range(barriers):
        first = segment_first[k]
        last = segment_first[k + 1] if k + 1 < barriers else segments
        parity = cuts[at, first]
        for s in range(first + 1, last):  # reduceat: one segment where last <= first
            parity = parity != cuts[at, s]
        crossed[k] = parity
        any_crossed = any_crossed or parity
    if not any_crossed:
        return 0.0
    for k in range(barriers):
        extra[k] = 0.0
        if not crossed[k]:
            continue
        first = crossing_first[k]
        last = crossing_first[k + 1] if k + 1 < barriers else points
        best = np.inf
        for c in range(first, max(last, first + 1)):
            to_start_x, to_start_y = sx - crossings[c, 0], sy - crossings[c, 1]
            to_end_x, to_end_y = crossings[c, 0] - ex, crossings[c, 1] - ey
            via = math.sqrt(to_start_x * to_start_x + to_start_y * to_start_y) + math.sqrt(
                to_end_x * to_end_x + to_end_y * to_end_y
            )
            best = min(best, via)
        extra[k] = max(best - direct, 0.0)
    return float(_pairwise_sum(extra))


@compiled(_types.void(B_2D, _NETWORK, _LEGS, _types.Tuple((_types.boolean[:, :], OUT_F8))))
def barrier_detours(cuts: Any, network: Any, legs: Any, out: Any) -> None:
    """`roads.barrier_detours` from the legs' segment cuts [L, S] (`planar.segment_cuts`),
    ``network`` and ``legs`` the tuples `_NETWORK` and `_LEGS` describe, into ``out``:
    ``crossed`` [L, K], whether leg l cuts an odd number of barrier k's segments
    (``np.logical_xor.reduceat`` over ``segment_first``), and ``detour`` [L], the km the
    crossed barriers add: per barrier, the best of its crossings (start -> crossing -> end,
    ``np.minimum.reduceat`` over ``crossing_first``) less the straight km ``direct``, at
    least 0, summed over the barriers as ``np.add.reduce`` sums them."""
    start, end, direct = legs
    crossed, detour = out
    extra = np.zeros(network[0].shape[0])
    for at in range(cuts.shape[0]):
        leg = (start[at, 0], start[at, 1], end[at, 0], end[at, 1], direct[at])
        detour[at] = _leg_barriers(cuts, network, leg, at, (crossed[at], extra))


# (each pair's row in the tables [Pc], its trip's leg [Pc], its vehicle's speed [Pc] km/h;
# each order's row in the tables [Bc])
_MAP_ROWS: Final = _types.Tuple((I8, I8, F8, I8))


@compiled(
    _types.void(
        B_2D,
        _NETWORK,
        _types.Tuple((F8_2D, F8_2D, _types.float64)),
        _MAP_ROWS,
        _types.Tuple((OUT_F8_2D, OUT_F8_2D)),
    )
)
def map_columns(cuts: Any, network: Any, legs: Any, rows: Any, out: Any) -> None:
    """`map_features.road_tables`' columns of one city's legs (``legs``: starts [Lc, 2],
    ends [Lc, 2] in its plane, its road circuity; the Pc pairs' approaches, then the Bc
    orders' trips) from their segment cuts [Lc, S]: per leg the barriers it crosses, their
    detour km (`barrier_detours`), its road km ``(straight + detour) * circuity``; written
    to ``out``'s pair table [4, P] (crossings, detour, approach minutes, the trip's minutes
    for the pair's vehicle) and order table [2, B] (crossings, detour) at ``rows``."""
    start, end, circuity = legs
    pair_rows, pair_trip, speed, order_rows = rows
    pair_table, order_table = out
    pairs = pair_rows.shape[0]
    barriers = network[0].shape[0]
    crossed = np.zeros(barriers, dtype=np.bool_)
    extra = np.zeros(barriers)
    road_km = np.empty(cuts.shape[0])
    for at in range(cuts.shape[0]):
        dx, dy = end[at, 0] - start[at, 0], end[at, 1] - start[at, 1]
        direct = math.sqrt(dx * dx + dy * dy)
        leg = (start[at, 0], start[at, 1], end[at, 0], end[at, 1], direct)
        detour = _leg_barriers(cuts, network, leg, at, (crossed, extra)) if barriers else 0.0
        count = 0.0
        for k in range(barriers):
            count += 1.0 if crossed[k] else 0.0
        road_km[at] = (direct + detour) * circuity
        if at < pairs:
            row = pair_rows[at]
            pair_table[0, row], pair_table[1, row] = count, detour
            pair_table[2, row] = road_km[at] / speed[at] * 60.0
        else:
            row = order_rows[at - pairs]
            order_table[0, row], order_table[1, row] = count, detour
    for p in range(pairs):
        pair_table[3, pair_rows[p]] = road_km[pair_trip[p]] / speed[p] * 60.0


# (invalid [B, N] (a missing candidate), score, ETA, on-time, cost [B, N], rider id hash [B, N])
_RANK_KEYS: Final = _types.Tuple((B_2D, *[F8_2D] * 4, U8_2D))


@compiled(_types.boolean(_RANK_KEYS, I8_2D, _types.intp, _types.int64, _types.int64))
def _ranks_before(keys: Any, tie: Any, b: int, x: int, y: int) -> bool:
    """Whether column ``x`` of row ``b`` comes strictly before column ``y`` (`rank_candidates`)."""
    invalid, score, eta, ontime, cost, rider_hash = keys
    if invalid[b, x] != invalid[b, y]:
        return bool(invalid[b, y])
    if score[b, x] != score[b, y]:
        return bool(score[b, x] > score[b, y])
    if eta[b, x] != eta[b, y]:
        return bool(eta[b, x] < eta[b, y])
    if ontime[b, x] != ontime[b, y]:
        return bool(ontime[b, x] > ontime[b, y])
    if cost[b, x] != cost[b, y]:
        return bool(cost[b, x] < cost[b, y])
    if rider_hash[b, x] != rider_hash[b, y]:
        return bool(rider_hash[b, x] < rider_hash[b, y])
    return bool(tie[b, x] < tie[b, y])


@compiled(_types.void(_RANK_KEYS, I8_2D, _types.int64[:, ::1]))
def rank_candidates(keys: Any, tie: Any, order: Any) -> None:
    """Each order's candidate columns ranked into ``order`` [B, N] exactly as
    ``np.lexsort((tie, hash, cost, -ontime, eta, -score, invalid), axis=-1)`` ranks them
    (the resolver's Top-K keys): valid first, score descending, ETA ascending, on-time
    descending, cost ascending, id hash, then ``tie``; a stable insertion sort of each row
    (a row is a few dozen candidates), so columns equal in every key keep their order."""
    rows, width = keys[0].shape
    for b in range(rows):
        for j in range(width):
            order[b, j] = j
        for j in range(1, width):
            moving = order[b, j]
            at = j
            while at > 0 and _ranks_before(keys, tie, b, moving, order[b, at - 1]):
                order[b, at] = order[b, at - 1]
                at -= 1
            order[b, at] = moving
