"""Road columns derived inside the graph from the zone coordinates: does a leg cross the
river, and how far out of its way does the best crossing take it.

The river decides up to 5 minutes and several kilometres of a pair's travel, but from the
zone coordinates a ReLU network has to learn both banks' outline and then an XOR of two
points' sides; it learned it slowly: a quarter of the pairs (those that cross) carried 58 %
of the ETA error of a model trained without these columns. The map is what a routing engine
would know of the city -- the river's course and where it can be crossed
(`simulator.CityConfig`, the city the models are trained for) -- not how long a crossing
takes, congestion, or which vehicle may use which crossing: the network still learns those.

The served input is unchanged (PAIR_FEATURES [batch, 28]); the exported graph computes the
same columns with the same float32 operations (`export._road_nodes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import NUM_PAIR_FEATURES, PAIR_FEATURE_NAMES
from dispatch_service.offline import simulator
from dispatch_service.offline.training.data import F32

__all__ = [
    "LEGS",
    "POINTS",
    "ROAD_FEATURES",
    "RoadMap",
    "road_columns",
]

ROAD_FEATURES: Final = (
    "approach_crosses_river",  # rider zone and pickup zone on different banks: 1, else 0
    "trip_crosses_river",  # pickup zone and drop-off zone
    "approach_detour_km",  # via the best crossing minus straight, zone centre to centre
    "trip_detour_km",
)


def _columns(name: str) -> tuple[int, int]:
    """Columns (east, north) of a zone centre in PAIR_FEATURES."""
    return (
        PAIR_FEATURE_NAMES.index(f"{name}_zone_east_km"),
        PAIR_FEATURE_NAMES.index(f"{name}_zone_north_km"),
    )


# The zone centres, and the legs between them: approach (rider -> pickup), trip (pickup ->
# drop-off), as indices into POINTS.
POINTS: Final = tuple(_columns(name) for name in ("rider", "pickup", "dropoff"))
LEGS: Final = ((0, 1), (1, 2))


@dataclass(frozen=True, eq=False)
class RoadMap:
    """The map as the constant matrices of a few matrix products over the feature rows.

    Selecting and differencing columns by products with 0 / +1 / -1 matrices is exact in
    float32, and products and row-wise operations are what ONNX Runtime runs fastest (a
    column-minus-row broadcast per point cost more than the network itself). The river's
    east coordinate at north n is ``base_east + sum_k slope_change_k * relu(n - knot_k)``:
    exactly `simulator.river_east_km` (flat beyond both ends).
    """

    hinge_w: F32  # [F, P*K] each point's north km into K columns
    hinge_b: F32  # [P*K] minus the knots
    slope_block: F32  # [P*K, P] slope changes, block-diagonal
    base_east: float
    east_w: F32  # [F, P] each point's east km
    crossing_e_w: F32  # [F, P*C] each point's east km into C columns
    crossing_e_b: F32  # [P*C] minus the crossings' east km
    crossing_n_w: F32
    crossing_n_b: F32
    leg_sums: F32  # [P*C, L*C] km start -> crossing -> end, per leg and crossing
    bank_diff: F32  # [P, L] +1 at a leg's start, -1 at its end
    leg_de_w: F32  # [F, L] end minus start, east km
    leg_dn_w: F32  # [F, L] north km

    @property
    def crossings(self) -> int:
        return self.crossing_e_b.size // len(POINTS)

    @classmethod
    def of(cls, city: simulator.CityConfig = simulator.DEFAULT_CITY) -> RoadMap:
        north = np.asarray(city.river_north_km, dtype=np.float64)
        east = np.asarray(city.river_east_km, dtype=np.float64)
        slopes = np.diff(east) / np.diff(north)
        change = np.concatenate((slopes, [0.0])) - np.concatenate(([0.0], slopes))
        crossings = simulator.crossings_en(city)
        f, k, c, n_points, n_legs = (
            NUM_PAIR_FEATURES,
            north.size,
            len(crossings),
            len(POINTS),
            len(LEGS),
        )
        hinge_w = np.zeros((f, n_points * k))
        slope_block = np.zeros((n_points * k, n_points))
        east_w = np.zeros((f, n_points))
        crossing_e_w = np.zeros((f, n_points * c))
        crossing_n_w = np.zeros((f, n_points * c))
        for p, (e_col, n_col) in enumerate(POINTS):
            hinge_w[n_col, p * k : (p + 1) * k] = 1.0
            slope_block[p * k : (p + 1) * k, p] = change
            east_w[e_col, p] = 1.0
            crossing_e_w[e_col, p * c : (p + 1) * c] = 1.0
            crossing_n_w[n_col, p * c : (p + 1) * c] = 1.0
        leg_sums = np.zeros((n_points * c, n_legs * c))
        bank_diff = np.zeros((n_points, n_legs))
        leg_de_w = np.zeros((f, n_legs))
        leg_dn_w = np.zeros((f, n_legs))
        for leg, (a, b) in enumerate(LEGS):
            for point in (a, b):
                leg_sums[point * c : (point + 1) * c, leg * c : (leg + 1) * c] = np.eye(c)
            bank_diff[a, leg], bank_diff[b, leg] = 1.0, -1.0
            for w, axis in ((leg_de_w, 0), (leg_dn_w, 1)):
                w[POINTS[b][axis], leg], w[POINTS[a][axis], leg] = 1.0, -1.0

        def f32(a: NDArray[np.float64]) -> F32:
            return np.ascontiguousarray(a, dtype=np.float32)

        return cls(
            hinge_w=f32(hinge_w),
            hinge_b=f32(-np.tile(north, n_points)),
            slope_block=f32(slope_block),
            base_east=float(east[0]),
            east_w=f32(east_w),
            crossing_e_w=f32(crossing_e_w),
            crossing_e_b=f32(-np.tile(crossings[:, 0], n_points)),
            crossing_n_w=f32(crossing_n_w),
            crossing_n_b=f32(-np.tile(crossings[:, 1], n_points)),
            leg_sums=f32(leg_sums),
            bank_diff=f32(bank_diff),
            leg_de_w=f32(leg_de_w),
            leg_dn_w=f32(leg_dn_w),
        )


def _hypot(de: F32, dn: F32) -> F32:
    out: F32 = np.sqrt(de * de + dn * dn)
    return out


def road_columns(x: F32, road: RoadMap) -> F32:
    """[n, len(ROAD_FEATURES)] of raw feature rows ``x`` [n, 28], in float32."""
    hinges = np.maximum(x @ road.hinge_w + road.hinge_b, np.float32(0.0))
    river = hinges @ road.slope_block + np.float32(road.base_east)  # [n, P]
    bank = (x @ road.east_w > river).astype(np.float32)  # 1.0 east of the river
    to_crossings = _hypot(
        x @ road.crossing_e_w + road.crossing_e_b, x @ road.crossing_n_w + road.crossing_n_b
    )  # [n, P*C]
    via = (to_crossings @ road.leg_sums).reshape(x.shape[0], len(LEGS), road.crossings)
    best = np.min(via, axis=2)  # [n, L]
    crosses = np.abs(bank @ road.bank_diff)
    direct = _hypot(x @ road.leg_de_w, x @ road.leg_dn_w)
    out: F32 = np.concatenate([crosses, crosses * (best - direct)], axis=1).astype(np.float32)
    return out
