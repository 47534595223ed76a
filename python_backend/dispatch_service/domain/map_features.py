"""The map's feature columns: per order-rider pair and per order, the barriers a leg crosses,
the km their crossings add and the free-flow minutes of the route (`roads`).

`features.encode_pairs_batch` converts every point of a batch to its window's city plane
once (with the zones' centres: one `geo.en_offset_km` pass) and hands the points here. A
batch in one city (always a lone window) is read on that city's map in one pass over its
legs, without grouping, in one compiled loop after the segment cuts
(`pair_kernels.map_columns`): on a small window the count of numpy calls, not the
arithmetic, is the cost. A batch over several cities reads each city's legs on its own
map. Each value is the one `roads.leg_roads` and `roads.route_minutes` give for that leg
in that city.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain import pair_kernels, planar
from dispatch_service.domain.cities import City

__all__ = [
    "MAP_ORDER_COLUMNS",
    "MAP_PAIR_COLUMNS",
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


def road_tables(
    cities: Sequence[City],
    order_window: IntArray,
    pair_order: IntArray,
    plane: FloatArray,
    vehicle: IntArray,
) -> tuple[FloatArray, FloatArray]:
    """The map's columns as float64 tables: per pair [4, P] (`MAP_PAIR_COLUMNS`: approach
    crossings, detour km, route minutes, and the trip's route minutes for the pair's
    vehicle), per order [2, B] (`MAP_ORDER_COLUMNS`: trip crossings, detour km).

    ``cities``: each window's city; ``order_window`` [B]: each order's window;
    ``pair_order`` [P]: each pair's order; ``plane`` [P + 2B, 2]: (east_km, north_km) in
    its window's city plane of each pair's rider, then each order's pickup, then each
    order's drop-off; ``vehicle`` [P]: each pair's rider's vehicle. A pair's approach is
    rider -> pickup, an order's trip pickup -> drop-off. Each city's legs go through
    `pair_kernels.map_columns` once, after their segment cuts (`planar.segment_cuts`).
    """
    pairs, orders = pair_order.size, order_window.size
    legs = pairs + orders
    start = plane[:legs]  # each pair's rider, then each order's pickup
    trip = pairs + pair_order  # each pair's order's trip: its leg, and its pickup's point
    end = np.concatenate((plane[trip], plane[legs:]))
    pair_table = np.empty((len(MAP_PAIR_COLUMNS), pairs))
    order_table = np.empty((len(MAP_ORDER_COLUMNS), orders))
    found = {id(city): city for city in cities}
    if len(found) == 1:
        city = cities[0]
        rows = (np.arange(pairs), trip, city.speeds_kmh[vehicle], np.arange(orders))
        _city_columns(city, start, end, rows, (pair_table, order_table))
        return pair_table, order_table
    pair_window = order_window[pair_order]
    for city in found.values():
        mine = np.flatnonzero([member is city for member in cities])
        pair_rows = np.flatnonzero(np.isin(pair_window, mine))
        order_rows = np.flatnonzero(np.isin(order_window, mine))
        leg_rows = np.concatenate((pair_rows, pairs + order_rows))
        trip = pair_rows.size + np.searchsorted(order_rows, pair_order[pair_rows])
        rows = (pair_rows, trip, city.speeds_kmh[vehicle[pair_rows]], order_rows)
        _city_columns(city, start[leg_rows], end[leg_rows], rows, (pair_table, order_table))
    return pair_table, order_table


def _city_columns(
    city: City,
    start: FloatArray,
    end: FloatArray,
    rows: tuple[IntArray, IntArray, FloatArray, IntArray],
    tables: tuple[FloatArray, FloatArray],
) -> None:
    """One city's legs (its pairs' approaches, then its orders' trips) written to the tables
    at ``rows`` (`pair_kernels.map_columns`)."""
    network = city.network
    if city.barriers and start.shape[0]:
        cuts = planar.segment_cuts(
            start, end, network.segment_start, network.segment_end, network.segment_lines
        )
    else:
        cuts = np.zeros((start.shape[0], 0), dtype=np.bool_)
    segments = (network.segment_first, network.crossings, network.crossing_first)
    pair_kernels.map_columns(cuts, segments, (start, end, city.road_circuity), rows, tables)
