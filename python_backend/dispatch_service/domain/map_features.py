"""The map's feature columns: per order-rider pair and per order, the barriers a leg crosses,
the km their crossings add and the free-flow minutes of the route (`roads`).

`features.encode_pairs_batch` converts every point of a batch to its window's city plane
once (with the zones' centres: one `geo.en_offset_km` pass) and hands the points here. A
batch in one city (always a lone window) is read on that city's map in one pass over its
legs, without grouping: on a small window the count of numpy calls, not the arithmetic, is
the cost. A batch over several cities reads each city's legs on its own map. Each value is
the one `roads.leg_roads` and `roads.route_minutes` give for that leg in that city.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain import roads
from dispatch_service.domain.cities import City

__all__ = [
    "MAP_ORDER_COLUMNS",
    "MAP_PAIR_COLUMNS",
    "Columns",
    "road_tables",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# `road_tables`' columns, in order (`contracts.PAIR_FEATURE_NAMES` names them).
MAP_PAIR_COLUMNS: Final = (
    "approach_barrier_crossings",
    "approach_detour_km",
    "approach_route_minutes",
    "trip_route_minutes",
)
MAP_ORDER_COLUMNS: Final = ("trip_barrier_crossings", "trip_detour_km")


# The columns of one table, each [n] (n pairs or n orders).
Columns = tuple[NDArray[np.int64] | FloatArray, ...]


def road_tables(
    cities: Sequence[City],
    order_window: IntArray,
    pair_order: IntArray,
    plane: FloatArray,
    vehicle: IntArray,
) -> tuple[Columns, Columns]:
    """The map's columns: per pair, each [P] (`MAP_PAIR_COLUMNS`: approach crossings,
    detour km, route minutes, and the trip's route minutes for the pair's vehicle), per
    order, each [B] (`MAP_ORDER_COLUMNS`: trip crossings, detour km).

    ``cities``: each window's city; ``order_window`` [B]: each order's window;
    ``pair_order`` [P]: each pair's order; ``plane`` [P + 2B, 2]: (east_km, north_km) in
    its window's city plane of each pair's rider, then each order's pickup, then each
    order's drop-off; ``vehicle`` [P]: each pair's rider's vehicle. A pair's approach is
    rider -> pickup, an order's trip pickup -> drop-off.
    """
    pairs, orders = pair_order.size, order_window.size
    legs = pairs + orders
    start = plane[:legs]  # each pair's rider, then each order's pickup
    end = np.concatenate((plane[pairs + pair_order], plane[legs:]))
    found = {id(city): city for city in cities}
    if len(found) == 1:
        city = cities[0]
        crossings, detour, road_km = _legs(city, start, end)
        speed = city.speeds_kmh[vehicle]
    else:
        crossings = np.empty(legs, dtype=np.int64)
        detour = np.empty(legs, dtype=np.float64)
        road_km = np.empty(legs, dtype=np.float64)
        leg_window = np.concatenate((order_window[pair_order], order_window))
        for city in found.values():
            mine = np.flatnonzero([member is city for member in cities])
            rows = np.flatnonzero(np.isin(leg_window, mine))
            crossings[rows], detour[rows], road_km[rows] = _legs(city, start[rows], end[rows])
        speeds = np.stack([city.speeds_kmh for city in cities])
        speed = speeds[order_window[pair_order], vehicle]
    # the free-flow minutes of each pair's approach and of its order's trip, for its vehicle
    approach_minutes = road_km[:pairs] / speed * 60.0
    trip_minutes = road_km[pairs + pair_order] / speed * 60.0
    return (
        (crossings[:pairs], detour[:pairs], approach_minutes, trip_minutes),
        (crossings[pairs:], detour[pairs:]),
    )


def _legs(
    city: City, start: FloatArray, end: FloatArray
) -> tuple[IntArray, FloatArray, FloatArray]:
    """Per leg on the city's map: the barriers it crosses, their detour km and the road km
    (`roads.leg_roads`' values, without its [L, K] table)."""
    delta = end - start
    direct = np.sqrt(np.add.reduce(delta * delta, axis=1))  # np.sum without its wrapper
    crossed, detour = roads.barrier_detours(city, start, end, direct)
    crossings: IntArray = np.add.reduce(crossed, axis=1, dtype=np.int64)
    return crossings, detour, (direct + detour) * city.road_circuity
