"""What a city's map says about a leg: the barriers it crosses, the detour through their
crossings, and the free-flow minutes a routing engine would quote.

The encoder feeds these to the model (one graph for every city: the map is data, not
constants in the graph), and the simulator prices legs with the same geometry. A leg
whose ends lie on different sides of a barrier goes through that barrier's best crossing
(shortest start -> crossing -> end); detours of several barriers add up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain import planar
from dispatch_service.domain.cities import City

__all__ = [
    "LegRoads",
    "leg_roads",
    "route_minutes",
]

FloatArray = NDArray[np.float64]


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
    network = city.network
    detour = np.zeros(start.shape[0], dtype=np.float64)
    if not city.barriers or start.shape[0] == 0:
        crossed = np.zeros((start.shape[0], len(city.barriers)), dtype=np.bool_)
        return LegRoads(crossed=crossed, direct_km=direct, detour_km=detour)
    cuts = planar.segment_cuts(start, end, network.segment_start, network.segment_end)
    crossed = (cuts.astype(np.int64) @ network.segment_barrier) % 2 == 1  # [L, K]
    rows = np.flatnonzero(crossed.any(axis=1))
    if rows.size:
        to_start = start[rows, None, :] - network.crossings[None, :, :]
        to_end = network.crossings[None, :, :] - end[rows, None, :]
        via = np.sqrt(np.sum(to_start * to_start, axis=2)) + np.sqrt(
            np.sum(to_end * to_end, axis=2)
        )  # [r, C] km start -> crossing -> end
        best = np.minimum.reduceat(via, network.crossing_first, axis=1)  # [r, K]
        extra = np.maximum(best - direct[rows, None], 0.0)
        detour[rows] = np.sum(np.where(crossed[rows], extra, 0.0), axis=1)
    return LegRoads(crossed=crossed, direct_km=direct, detour_km=detour)


def route_minutes(city: City, road_km: FloatArray, vehicle: NDArray[np.int64]) -> FloatArray:
    """Free-flow minutes of ``road_km`` for each leg's vehicle (no traffic, no stops)."""
    return np.asarray(road_km / city.speeds_kmh[vehicle] * 60.0)
