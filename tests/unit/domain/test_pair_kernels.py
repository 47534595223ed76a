"""dispatch_service.domain.pair_kernels against the numpy code it replaced: a wiring and
equivalence check, bit for bit.

The oracle below is `features.encode_pairs_batch`'s body as it was before the compiled
kernels (numpy's haversine, bearing, geohash zones, plane offsets and its block written
through fancy indexing, from the `geo` functions that still exist). The kernels must give
the same float32 rows on random simulator windows of every registered city and regime,
alone and in batches over several cities, and on hand-placed points (coincident riders,
points on geohash cell edges, the antimeridian, the poles). `_pairwise_sum` is checked
against ``np.add.reduce`` itself (its order matters from 3 values on), the barrier
detours by tests/unit/domain/test_map_features.py's own oracle.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import NUM_PAIR_FEATURES
from dispatch_service.domain import features, geo, map_features, pair_kernels
from dispatch_service.domain.candidates import joined, rider_distances
from dispatch_service.domain.cities import City, default_registry
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline.simulator import REGIMES, city_worlds, generate_regime_window

IntArray = NDArray[np.int64]

# numpy runs its float64 sin, cos and arcsin in AVX-512 loops where the CPU has them, and
# their last bit can differ from the C library's, which the kernels call (numba). Where numpy
# runs its baseline loops (a host without AVX-512, or NPY_DISABLE_CPU_FEATURES set as the
# training pins it) the kernels must give its values bit for bit; where it runs the AVX-512
# loops, its values differ by host, and the kernels must stay within a few units in the last
# place of each array's largest value (a sine near 0 may even change sign between the two).
_NUMPY_AVX512: bool = bool(np.core._multiarray_umath.__cpu_features__.get("AVX512_SKX"))
_ULPS_AVX512 = 8


def _numpys_float64(got: NDArray[np.float64], oracle: NDArray[np.float64]) -> None:
    """``got`` is numpy's ``oracle``: bit for bit, or within `_ULPS_AVX512` units in the
    last place of the array's largest value where numpy's own loops are AVX-512's."""
    if not _NUMPY_AVX512:
        assert got.tobytes() == oracle.tobytes()
        return
    assert got.shape == oracle.shape and got.dtype == oracle.dtype
    largest = float(np.max(np.abs(oracle), initial=1.0))
    step = float(np.spacing(largest))
    np.testing.assert_allclose(got, oracle, rtol=0.0, atol=_ULPS_AVX512 * step)


def _numpy_origins(
    cities: Sequence[City], order_window: IntArray, pair_order: IntArray
) -> tuple[float, float] | tuple[NDArray[np.float64], NDArray[np.float64]]:
    if len({id(city) for city in cities}) == 1:
        return cities[0].centre
    origins = np.array([city.centre for city in cities], dtype=np.float64)
    point_window = np.concatenate((order_window[pair_order], order_window, order_window))
    point_origin = origins[np.concatenate((point_window, point_window))]
    return point_origin[:, 0], point_origin[:, 1]


def _numpy_blocks(
    windows: Sequence[tuple[DispatchWindow, NDArray[np.int32]]],
    settings: features.EncoderSettings,
    cities: Sequence[City],
) -> list[NDArray[np.float32]]:
    """`encode_pairs_batch` before the kernels (its numpy expressions, unchanged)."""
    pair_orders, pair_riders, valids, sizes = [], [], [], []
    order_base = 0
    for window, candidates in windows:
        flat = candidates.reshape(-1).astype(np.int64)
        valid = (flat >= 0).nonzero()[0]
        valids.append(valid)
        sizes.append(flat.size)
        pair_orders.append(valid // max(candidates.shape[1], 1) + order_base)
        pair_riders.append(flat[valid])
        order_base += window.num_orders
    members = [window for window, _ in windows]
    chosen = list(zip(members, pair_riders, strict=True))
    o = joined(pair_orders)
    pairs, num_orders = o.size, order_base
    pickup = joined([w.pickup for w in members])
    dropoff = joined([w.dropoff for w in members])
    rider_position = joined([w.rider_position[r] for w, r in chosen])
    load = joined([w.rider_load[r] for w, r in chosen]).astype(np.float64)
    capacity = joined([w.rider_capacity[r] for w, r in chosen]).astype(np.float64)
    vehicle_code = joined([w.rider_vehicle[r] for w, r in chosen]).astype(np.int64)
    vehicle = vehicle_code[:, None] == features._VEHICLES
    order_window = np.repeat(np.arange(len(members)), [w.num_orders for w in members])
    start = np.concatenate((rider_position, pickup))
    end = np.concatenate((pickup[o], dropoff))
    km, bearing = geo.haversine_bearing(start[:, 0], start[:, 1], end[:, 0], end[:, 1])
    bearing_sin, bearing_cos = np.sin(bearing), np.cos(bearing)
    points = np.concatenate((start, dropoff))
    centre = geo.cell_centre_latlon(points, settings.zone_precision)
    both = np.concatenate((centre, points))
    east, north = geo.en_offset_km(both[:, 0], both[:, 1], _numpy_origins(cities, order_window, o))
    zones = points.shape[0]
    plane = np.empty((zones, 2))
    plane[:, 0], plane[:, 1] = east[zones:], north[zones:]
    east, north = east[:zones], north[:zones]
    road_pair, road_order = map_features.road_tables(cities, order_window, o, plane, vehicle_code)
    window_values = np.empty((len(members), 3), dtype=np.float64)
    for row, (window, city) in enumerate(zip(members, cities, strict=True)):
        hour, weekend = features.local_time(window.dispatch_time, city)
        hour_angle = 2.0 * np.pi * hour / 24.0
        window_values[row] = (float(np.sin(hour_angle)), float(np.cos(hour_angle)), weekend)
    dispatch_time = np.array([w.dispatch_time for w in members], dtype=np.float64)[order_window]
    created_at = joined([w.created_at for w in members]).astype(np.float64)
    age = np.maximum((dispatch_time - created_at) / 60.0, 0.0)
    promised = joined([w.promised_minutes for w in members]).astype(np.float64)
    constraints = joined([w.constraints for w in members]).astype(np.int64)
    flags = (constraints[:, None] & features._ORDER_FLAGS) != 0
    trip, pickup_zone, dropoff_zone = (
        slice(pairs, None),
        slice(pairs, -num_orders),
        slice(-num_orders, None),
    )
    per_order_rows = np.array(
        (
            km[trip], bearing_sin[trip], bearing_cos[trip],
            east[pickup_zone], north[pickup_zone], east[dropoff_zone], north[dropoff_zone],
            age, promised, promised - age, *flags.T, *road_order,
        ),
        dtype=np.float64,
    )  # fmt: skip
    per_pair_rows = np.array(
        (
            km[:pairs], bearing_sin[:pairs], bearing_cos[:pairs], east[:pairs], north[:pairs],
            load, capacity, load / np.maximum(capacity, 1.0), *vehicle.T, *road_pair,
        ),
        dtype=np.float64,
    )  # fmt: skip
    block = np.empty((pairs, NUM_PAIR_FEATURES), dtype=np.float32)
    block[:, features._PAIR_AT] = per_pair_rows.T
    block[:, features._ORDER_AT] = per_order_rows[:, o].T
    block[:, features._WINDOW_AT] = window_values[order_window[o]]
    out, first = [], 0
    for valid, size in zip(valids, sizes, strict=True):
        full = np.zeros((size, NUM_PAIR_FEATURES), dtype=np.float32)
        full[valid] = block[first : first + valid.size]
        first += valid.size
        out.append(full)
    return out


def _assert_same_blocks(
    windows: Sequence[DispatchWindow], cities: Sequence[City], precision: int = 7
) -> None:
    settings = features.EncoderSettings(zone_precision=precision)
    chosen = [(w, features.window_candidates(w, settings)) for w in windows]
    got = features.encode_pairs_batch(chosen, settings, cities)
    expected = _numpy_blocks(chosen, settings, cities)
    for rows, oracle in zip(got, expected, strict=True):
        assert rows.dtype == np.float32
        assert rows.shape == oracle.shape
        assert rows.tobytes() == oracle.tobytes()


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_simulated_windows_of_every_city_alone_and_in_batches(regime: str) -> None:
    registry, worlds = default_registry(), city_worlds()
    rng = np.random.default_rng(sum(map(ord, regime)))
    for city in registry.cities:
        window = generate_regime_window(rng, REGIMES[regime], worlds[city.id])
        _assert_same_blocks([window], [city])
    members = [registry.cities[i] for i in rng.integers(0, len(registry.cities), 5)]
    batch = [generate_regime_window(rng, REGIMES[regime], worlds[c.id]) for c in members]
    _assert_same_blocks(batch, members)


@pytest.mark.parametrize("precision", [1, 5, 7, 12])
def test_hand_placed_points_cell_edges_poles_and_antimeridian(precision: int) -> None:
    """Points exactly on geohash cell edges (multiples of the cell size), at the poles and
    on the antimeridian, riders on the pickup and at the drop-off: every zone and bearing
    as numpy gives them."""
    city = default_registry().cities[0]
    rng = np.random.default_rng(precision)
    window = generate_regime_window(rng, REGIMES["default"], city_worlds()[city.id])
    half, cells, step, _, _ = geo.geohash_grid(precision)
    riders = window.rider_position.copy()
    count = riders.shape[0]
    edge = rng.integers(0, cells + 1, (count, 2)) * step - half  # k * size - half: exact
    riders[:] = np.where(rng.random((count, 2)) < 0.8, edge, rng.choice([-1.0, 1.0], 2) * half)
    riders[0] = window.pickup[0]  # on the pickup: a zero-length leg
    riders[-1] = window.dropoff[0]
    placed = window.__class__(**{**window.__dict__, "rider_position": riders})
    _assert_same_blocks([placed], [city], precision)


@pytest.mark.parametrize("size", [*range(0, 20), 31, 64, 127, 128, 129, 200, 1000])
def test_pairwise_sum_adds_in_numpys_order(size: int) -> None:
    rng = np.random.default_rng(size)
    values = rng.random(size) * 10.0 ** rng.integers(-12, 12, size)  # order-sensitive sums
    got = pair_kernels._pairwise_sum(values)
    assert np.float64(got).tobytes() == np.add.reduce(values).tobytes()


def test_kernels_refuse_arrays_of_other_dtypes() -> None:
    """Compiled for one signature at import (never on a request): other dtypes are refused,
    not compiled."""
    with pytest.raises(TypeError):
        pair_kernels._pairwise_sum(np.arange(4, dtype=np.int64))


@pytest.mark.parametrize("seed", range(4))
def test_leg_geometry_gives_numpys_float64_values(seed: int) -> None:
    """Before the float32 rounding that hides most last-bit slips: the legs' km and
    bearings, the zones' and the points' plane offsets as `geo`'s numpy functions give
    them, with one origin and with one per point."""
    rng = np.random.default_rng(seed)
    pairs, orders = 300, 40
    scale = rng.choice([1e-6, 0.05, 5.0, 90.0])
    rider = np.column_stack((rng.uniform(-90, 90, pairs), rng.uniform(-180, 180, pairs)))
    rider[: pairs // 2] = rng.normal((31.2, 121.4), scale, (pairs // 2, 2)).clip(-90, 90)
    pickup = rng.normal((31.2, 121.4), scale, (orders, 2)).clip(-90, 90)
    dropoff = rng.normal((31.2, 121.4), scale, (orders, 2)).clip(-90, 90)
    pickup[0] = dropoff[0]  # a zero-length trip
    pair_order = rng.integers(0, orders, pairs)
    rider[1] = pickup[pair_order[1]]  # a rider on the pickup
    precision = int(rng.integers(1, 13))
    zones = pairs + 2 * orders
    per_point = rng.normal((31.2, 121.4), 0.5, (zones, 2))
    for origin_lat, origin_lon in (
        (np.array([31.23]), np.array([121.47])),
        (per_point[:, 0].copy(), per_point[:, 1].copy()),
    ):
        out = [np.empty(pairs + orders) for _ in range(3)] + [np.empty(zones) for _ in range(2)]
        plane = np.empty((zones, 2))
        pair_kernels.leg_geometry(
            (rider, np.arange(pairs), pair_order, pickup, dropoff),
            geo.geohash_grid(precision),
            (origin_lat, origin_lon, geo.EARTH_RADIUS_KM),
            (*out, plane),
        )
        start = np.concatenate((rider, pickup))
        end = np.concatenate((pickup[pair_order], dropoff))
        km, bearing = geo.haversine_bearing(start[:, 0], start[:, 1], end[:, 0], end[:, 1])
        points = np.concatenate((start, dropoff))
        centre = geo.cell_centre_latlon(points, precision)
        origin = (origin_lat, origin_lon) if origin_lat.size > 1 else (origin_lat[0], origin_lon[0])
        zone_east, zone_north = geo.en_offset_km(centre[:, 0], centre[:, 1], origin)
        east, north = geo.en_offset_km(points[:, 0], points[:, 1], origin)
        expected = (km, np.sin(bearing), np.cos(bearing), zone_east, zone_north)
        for got, oracle in zip(out, expected, strict=True):
            _numpys_float64(got, oracle)
        _numpys_float64(plane, np.column_stack((east, north)))


@pytest.mark.parametrize("seed", range(6))
def test_rank_candidates_is_numpys_lexsort_with_ties(seed: int) -> None:
    """`rank_candidates` against ``np.lexsort`` itself (the resolver's call before the
    kernel), on keys drawn from a few values so that every key ties somewhere: missing
    candidates, equal scores (0.0 and -0.0 among them), equal ETAs, on-time, costs and
    hashes, and the tie-break last; rows of width 0, 1 and 40."""
    rng = np.random.default_rng(seed)
    for rows, width in ((50, 16), (7, 40), (3, 1), (4, 0)):
        shape = (rows, width)
        invalid = rng.random(shape) < 0.2
        score = rng.choice([0.0, -0.0, 0.25, 0.5, 0.75], shape)
        objectives = rng.choice([0.0, 1.0, 2.5], (rows, width, 3))
        eta, ontime, cost = objectives[..., 0], objectives[..., 1], objectives[..., 2]
        rider_hash = rng.choice(np.array([3, 2**63 + 5, 7], dtype=np.uint64), shape)
        tie = rng.integers(0, 4, shape)
        order = np.empty(shape, dtype=np.int64)
        pair_kernels.rank_candidates((invalid, score, eta, ontime, cost, rider_hash), tie, order)
        keys = (rider_hash, cost, -ontime, eta, -score, invalid)
        assert order.tolist() == np.lexsort((tie, *keys), axis=-1).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_rider_distances_are_geos_haversine_on_read_only_arrays(seed: int) -> None:
    """`candidates.rider_distances` (`pair_distances`) against `geo.haversine_km` on the
    gathered points: riders repeated, coincident with a pickup, antipodal and polar, the
    arrays read-only (a frozen window's, a broadcast view's)."""
    rng = np.random.default_rng(seed)
    riders = rng.normal((31.2, 121.4), rng.choice([1e-7, 0.02, 3.0]), (60, 2))
    pickups = rng.normal((31.2, 121.4), 0.05, (5, 2))
    riders[0] = pickups[0]
    riders[1] = (-pickups[1, 0], pickups[1, 1] - 180.0)
    riders[2] = (90.0, 0.0)
    rider_at = np.broadcast_to(np.arange(60), (5, 60)).reshape(-1)
    pickup_at = np.repeat(np.arange(5), 60)
    for array in (riders, pickups):
        array.setflags(write=False)
    got = rider_distances(riders, rider_at, pickups, pickup_at)
    expected = geo.haversine_km(
        riders[rider_at, 0], riders[rider_at, 1], pickups[pickup_at, 0], pickups[pickup_at, 1]
    )
    _numpys_float64(got, expected)
