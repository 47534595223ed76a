"""dispatch_service.domain.map_features against the general path it replaced, bit for bit.

The reference below is the encoder's map code as it was before the one-pass path: each
city's points converted on their own (`City.plane`), its legs read by a leg-roads pass
that tests the segments' sides with normals built per call, takes each barrier's parity
by an integer product with a segment-membership table and computes detours on the
crossing rows only, then `roads.route_minutes`. The fast path must give the same float64
values on random windows of every registered city, on batches over several cities and on
legs placed on and next to barriers (vertices, crossings, the courses themselves) and the
cities' borders (the detours now a compiled loop, `domain.pair_kernels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import PAIR_FEATURE_NAMES
from dispatch_service.domain import features, map_features, roads
from dispatch_service.domain.cities import City, default_registry
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline import simulator

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def _old_segment_cuts(
    start: FloatArray, end: FloatArray, seg_start: FloatArray, seg_end: FloatArray
) -> NDArray[np.bool_]:
    leg_normal = np.stack((end[:, 1] - start[:, 1], start[:, 0] - end[:, 0]), axis=1)
    leg_offset = np.sum(leg_normal * start, axis=1)[:, None]
    seg_normal = np.stack((seg_end[:, 1] - seg_start[:, 1], seg_start[:, 0] - seg_end[:, 0]), 1)
    seg_offset = np.sum(seg_normal * seg_start, axis=1)[None, :]
    p_left = leg_normal @ seg_start.T < leg_offset
    q_left = leg_normal @ seg_end.T < leg_offset
    a_left = start @ seg_normal.T < seg_offset
    b_left = end @ seg_normal.T < seg_offset
    return np.asarray((p_left != q_left) & (a_left != b_left))


def _old_leg_roads(
    city: City, start: FloatArray, end: FloatArray
) -> tuple[IntArray, FloatArray, FloatArray]:
    """(crossings [L], direct km [L], detour km [L]) as the general path computed them."""
    delta = end - start
    direct = np.sqrt(np.sum(delta * delta, axis=1))
    network = city.network
    detour = np.zeros(start.shape[0], dtype=np.float64)
    if not city.barriers or start.shape[0] == 0:
        return np.zeros(start.shape[0], dtype=np.int64), direct, detour
    counts = [barrier.course.shape[0] - 1 for barrier in city.barriers]
    membership = np.zeros((sum(counts), len(counts)), dtype=np.int64)
    membership[np.arange(sum(counts)), np.repeat(np.arange(len(counts)), counts)] = 1
    cuts = _old_segment_cuts(start, end, network.segment_start, network.segment_end)
    crossed = (cuts.astype(np.int64) @ membership) % 2 == 1
    rows = np.flatnonzero(crossed.any(axis=1))
    if rows.size:
        to_start = start[rows, None, :] - network.crossings[None, :, :]
        to_end = network.crossings[None, :, :] - end[rows, None, :]
        via = np.sqrt(np.sum(to_start * to_start, axis=2)) + np.sqrt(
            np.sum(to_end * to_end, axis=2)
        )
        best = np.minimum.reduceat(via, network.crossing_first, axis=1)
        extra = np.maximum(best - direct[rows, None], 0.0)
        detour[rows] = np.sum(np.where(crossed[rows], extra, 0.0), axis=1)
    return np.count_nonzero(crossed, axis=1), direct, detour


def _old_tables(
    cities: Sequence[City],
    order_window: IntArray,
    pair_order: IntArray,
    plane: FloatArray,
    vehicle: IntArray,
) -> tuple[FloatArray, FloatArray]:
    """The general path's [P, 4] and [B, 2] tables, from the same points in the plane."""
    pairs, orders = pair_order.size, order_window.size
    riders_en, pickup_en, dropoff_en = plane[:pairs], plane[pairs:-orders], plane[-orders:]
    pair_table = np.empty((pairs, 4))
    order_table = np.empty((orders, 2))
    pair_window = order_window[pair_order]
    for city in {id(city): city for city in cities}.values():
        mine = np.flatnonzero([member is city for member in cities])
        order_rows = np.flatnonzero(np.isin(order_window, mine))
        pair_rows = np.flatnonzero(np.isin(pair_window, mine))
        local = np.searchsorted(order_rows, pair_order[pair_rows])
        start = np.concatenate((riders_en[pair_rows], pickup_en[order_rows]))
        end = np.concatenate((pickup_en[order_rows][local], dropoff_en[order_rows]))
        crossings, direct, detour = _old_leg_roads(city, start, end)
        road_km = (direct + detour) * city.road_circuity
        approach, trip = slice(None, pair_rows.size), slice(pair_rows.size, None)
        vehicles = vehicle[pair_rows]
        order_table[order_rows, 0] = crossings[trip]
        order_table[order_rows, 1] = detour[trip]
        pair_table[pair_rows, 0] = crossings[approach]
        pair_table[pair_rows, 1] = detour[approach]
        pair_table[pair_rows, 2] = roads.route_minutes(city, road_km[approach], vehicles)
        pair_table[pair_rows, 3] = roads.route_minutes(city, road_km[trip][local], vehicles)
    return pair_table, order_table


def _fast_tables(
    cities: Sequence[City],
    order_window: IntArray,
    pair_order: IntArray,
    plane: FloatArray,
    vehicle: IntArray,
) -> tuple[FloatArray, FloatArray]:
    pair, order = map_features.road_tables(cities, order_window, pair_order, plane, vehicle)
    return np.column_stack(pair).astype(np.float64), np.column_stack(order).astype(np.float64)


def _assert_same(
    cities: Sequence[City],
    order_window: IntArray,
    pair_order: IntArray,
    plane: FloatArray,
    vehicle: IntArray,
) -> None:
    fast = _fast_tables(cities, order_window, pair_order, plane, vehicle)
    old = _old_tables(cities, order_window, pair_order, plane, vehicle)
    for got, expected in zip(fast, old, strict=True):
        assert got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()


def _batch(
    rng: np.random.Generator, cities: Sequence[City], points_of: dict[str, FloatArray]
) -> tuple[IntArray, IntArray, FloatArray, IntArray]:
    """A batch of one window per city: (order_window, pair_order, plane, vehicle), each
    point drawn from its city's ``points_of`` (plane coordinates)."""
    orders = [int(rng.integers(1, 6)) for _ in cities]
    order_window = np.repeat(np.arange(len(cities)), orders)
    pair_order = np.sort(rng.integers(0, order_window.size, int(rng.integers(1, 40))))
    pair_city = [cities[w] for w in order_window[pair_order]]
    order_city = [cities[w] for w in order_window]

    def draw(owners: Sequence[City]) -> FloatArray:
        out = np.empty((len(owners), 2))
        for row, city in enumerate(owners):
            pool = points_of[city.id]
            out[row] = pool[rng.integers(pool.shape[0])]
        return out

    plane = np.concatenate((draw(pair_city), draw(order_city), draw(order_city)))
    vehicle = rng.integers(0, 3, pair_order.size)
    return order_window, pair_order, plane, vehicle


def _edge_points(city: City, rng: np.random.Generator) -> FloatArray:
    """Points on and next to the city's barriers (vertices, crossings, points along the
    courses, a hair either side) and near its border, plus some anywhere in the city."""
    network = city.network
    vertices = np.concatenate((network.segment_start, network.segment_end))
    t = rng.uniform(0.0, 1.0, (64, 1))
    pick = rng.integers(0, network.segment_start.shape[0], 64)
    along = network.segment_start[pick] + t * (
        network.segment_end[pick] - network.segment_start[pick]
    )
    exact = np.concatenate((vertices, network.crossings, along))
    hair = np.concatenate([exact + rng.normal(0.0, scale, exact.shape) for scale in (1e-12, 1e-6)])
    border = city.plane(city.area) * (1.0 + rng.choice([-1e-9, 0.0, 1e-9], (city.area.shape[0], 1)))
    anywhere = city.plane(city.area).mean(axis=0) + rng.normal(0.0, 8.0, (64, 2))
    return np.concatenate((exact, hair, border, anywhere))


@pytest.mark.parametrize("seed", range(6))
def test_legs_on_and_next_to_barriers_and_borders_give_the_general_paths_values(seed: int) -> None:
    registry = default_registry()
    rng = np.random.default_rng(seed)
    points_of = {city.id: _edge_points(city, rng) for city in registry.cities}
    for city in registry.cities:  # one window (a lone request), then every city at once
        _assert_same([city], *_batch(rng, [city], points_of))
    for _ in range(5):
        members = [registry.cities[i] for i in rng.integers(0, 4, int(rng.integers(2, 6)))]
        _assert_same(members, *_batch(rng, members, points_of))


def test_zero_length_legs_and_a_city_without_barriers() -> None:
    registry = default_registry()
    city = registry.get("beijing")
    crossing = city.network.crossings[:1]
    plane = np.concatenate((crossing, crossing, crossing))  # rider at the pickup at the drop-off
    _assert_same([city], np.zeros(1, np.int64), np.zeros(1, np.int64), plane, np.array([2]))
    bare = default_registry().cities[0]
    plain = City(
        id="plain",
        name="Plain",
        aliases=(),
        timezone="Etc/UTC",
        centre=bare.centre,
        area=bare.area,
        speeds_kmh=bare.speeds_kmh,
        road_circuity=1.3,
        barriers=(),
    )
    rng = np.random.default_rng(3)
    batch = _batch(rng, [plain, city], {"plain": rng.normal(0, 5, (30, 2)), city.id: crossing})
    _assert_same([plain, city], *batch)


def _simulated(rng: np.random.Generator, city: City) -> DispatchWindow:
    world = simulator.city_worlds()[city.id]
    return simulator.generate_window(
        rng, int(rng.choice([1, 3, 12])), int(rng.choice([1, 20, 80])), config=world
    )


_MAP_AT = [
    PAIR_FEATURE_NAMES.index(name)
    for name in (*map_features.MAP_PAIR_COLUMNS, *map_features.MAP_ORDER_COLUMNS)
]


@pytest.mark.parametrize("seed", range(4))
def test_encoded_windows_carry_the_general_paths_map_columns(seed: int) -> None:
    """End to end: `encode_pairs_batch` (its one plane conversion for zones and points)
    writes the general path's values, each window's points in its own city's plane."""
    registry = default_registry()
    rng = np.random.default_rng(100 + seed)
    settings = features.EncoderSettings()
    cities = [registry.cities[i] for i in rng.integers(0, 4, 4)]
    windows = [_simulated(rng, city) for city in cities]
    chosen = [(w, features.window_candidates(w, settings)) for w in windows]
    encoded = features.encode_pairs_batch(chosen, settings, cities)
    for (window, candidates), city, rows in zip(chosen, cities, encoded, strict=True):
        alone = features.encode_pairs(window, candidates, settings, city)
        assert alone.tobytes() == rows.tobytes()  # batched or alone, the same rows
        flat = candidates.reshape(-1).astype(np.int64)
        valid = np.flatnonzero(flat >= 0)
        pair_order = valid // candidates.shape[1]
        riders = flat[valid]
        latlon = np.concatenate((window.rider_position[riders], window.pickup, window.dropoff))
        pair, order = _old_tables(
            [city],
            np.zeros(window.num_orders, np.int64),
            pair_order,
            city.plane(latlon),
            window.rider_vehicle[riders].astype(np.int64),
        )
        expected = np.column_stack((pair, order[pair_order])).astype(np.float32)
        assert rows[valid][:, _MAP_AT].tobytes() == expected.tobytes()
