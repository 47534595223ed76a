"""What a city's map says about a leg: the barriers it crosses, the detour through their
crossings, and the free-flow minutes a routing engine would quote.

The encoder feeds these to the model (one graph for every city: the map is data, not
constants in the graph), and the simulator prices legs with the same geometry. A leg
whose ends lie on different sides of a barrier goes through that barrier's best crossing
(shortest start -> crossing -> end); detours of several barriers add up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain import planar
from dispatch_service.domain.cities import City, RoadNetwork

__all__ = [
    "LegRoads",
    "barrier_detours",
    "leg_roads",
    "route_minutes",
]

FloatArray = NDArray[np.float64]
# Legs up to this many (a small window's) go through the detours all at once; more legs
# only the rows that cross a barrier (the same values).
_EVERY_LEG: Final = 256


@dataclass(frozen=True)
class LegRoads:
    """Per leg: which barriers it crosses ([L, K], K = the city's barriers), the straight
    km, and the km the crossings add to it."""

    crossed: NDArray[np.bool_]
    direct_km: FloatArray
    detour_km: FloatArray

    @property
    def crossings(self) -> NDArray[np.int64]:
        return np.asarray(np.count_nonzero(self.crossed, axis=1), dtype=np.int64)

    def road_km(self, city: City) -> FloatArray:
        return np.asarray((self.direct_km + self.detour_km) * city.road_circuity)


def leg_roads(city: City, start: FloatArray, end: FloatArray) -> LegRoads:
    """Legs from ``start`` [L, 2] to ``end`` [L, 2], (east_km, north_km) of the city's plane.

    Every barrier in one pass (`cities.RoadNetwork`): the segments each leg cuts, their
    parity per barrier, and the best crossing of each barrier a leg crosses.
    """
    delta = end - start
    direct = np.sqrt(np.sum(delta * delta, axis=1))
    crossed, detour = barrier_detours(city, start, end, direct)
    return LegRoads(crossed=crossed, direct_km=direct, detour_km=detour)


def barrier_detours(
    city: City, start: FloatArray, end: FloatArray, direct: FloatArray
) -> tuple[NDArray[np.bool_], FloatArray]:
    """`leg_roads`' barriers of legs ``start`` -> ``end`` whose straight km are ``direct``:
    which barriers each leg crosses [L, K] and the km their crossings add [L]."""
    network = city.network
    legs = start.shape[0]
    if not city.barriers or legs == 0:
        return np.zeros((legs, len(city.barriers)), dtype=np.bool_), np.zeros(legs)
    cuts = planar.segment_cuts(
        start, end, network.segment_start, network.segment_end, network.segment_lines
    )
    # a leg crosses a barrier when it cuts an odd number of the barrier's segments
    crossed = np.asarray(np.logical_xor.reduceat(cuts, network.segment_first, axis=1))  # [L, K]
    if legs <= _EVERY_LEG:  # a small window: every leg at once, no gathers
        return crossed, _detours(network, start, end, direct, crossed)
    detour = np.zeros(legs, dtype=np.float64)
    rows = np.flatnonzero(np.logical_or.reduce(crossed, axis=1))
    if rows.size:
        detour[rows] = _detours(network, start[rows], end[rows], direct[rows], crossed[rows])
    return crossed, detour


def _detours(
    network: RoadNetwork,
    start: FloatArray,
    end: FloatArray,
    direct: FloatArray,
    crossed: NDArray[np.bool_],
) -> FloatArray:
    """[L] km the barriers ``crossed`` [L, K] add to legs ``start`` -> ``end``: per barrier
    crossed, the best of its crossings (start -> crossing -> end) less the straight km; 0
    for a leg that crosses none."""
    # np.add.reduce is np.sum without its Python wrapper (a small window's cost is calls)
    to_start = start[:, None, :] - network.crossings[None, :, :]
    to_end = network.crossings[None, :, :] - end[:, None, :]
    via = np.sqrt(np.add.reduce(to_start * to_start, axis=2)) + np.sqrt(
        np.add.reduce(to_end * to_end, axis=2)
    )  # [L, C] km start -> crossing -> end
    best = np.minimum.reduceat(via, network.crossing_first, axis=1)  # [L, K]
    extra = np.maximum(best - direct[:, None], 0.0)
    detour: FloatArray = np.add.reduce(np.where(crossed, extra, 0.0), axis=1)
    return detour


def route_minutes(city: City, road_km: FloatArray, vehicle: NDArray[np.int64]) -> FloatArray:
    """Free-flow minutes of ``road_km`` for each leg's vehicle (no traffic, no stops)."""
    return np.asarray(road_km / city.speeds_kmh[vehicle] * 60.0)
