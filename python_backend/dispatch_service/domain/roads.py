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

from dispatch_service.domain import pair_kernels, planar
from dispatch_service.domain.cities import City

__all__ = [
    "LegRoads",
    "barrier_detours",
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
    crossed = np.empty((legs, len(city.barriers)), dtype=np.bool_)
    detour = np.empty(legs, dtype=np.float64)
    pair_kernels.barrier_detours(
        cuts,
        (network.segment_first, network.crossings, network.crossing_first),
        (start, end, direct),
        (crossed, detour),
    )
    return crossed, detour


def route_minutes(city: City, road_km: FloatArray, vehicle: NDArray[np.int64]) -> FloatArray:
    """Free-flow minutes of ``road_km`` for each leg's vehicle (no traffic, no stops)."""
    return np.asarray(road_km / city.speeds_kmh[vehicle] * 60.0)
