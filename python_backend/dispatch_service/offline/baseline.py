"""The baselines the model is judged against: nearest-rider, distance matching, rule ETA.

Nearest-rider dispatch is the rule operators compare the model against, and its fallback.

The rule as dispatch teams run it: orders are served first come, first served (creation
time, then row), and each takes the rider nearest to its pickup in straight-line
(haversine) distance among those who may carry it: the hard constraints hold (thermal box,
car for large items) and the rider still has spare capacity, counting the orders this very
window has already given them. It knows nothing about rivers, traffic, vehicle speed or
load, which is exactly what the learned model is meant to add.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from dispatch_contract import PAIR_FEATURE_NAMES
from dispatch_service.domain import geo
from dispatch_service.domain.feasibility import feasible, spare_slots
from dispatch_service.domain.features import feasible_mask
from dispatch_service.domain.window import DispatchWindow

__all__ = [
    "NOMINAL_SPEED_KMH",
    "RULE_CIRCUITY",
    "RULE_STOP_MINUTES",
    "distance_matching_assignment",
    "nearest_rider_assignment",
    "rule_objectives",
]

# The rule ETA: straight-line km x 1.3 / vehicle speed + 3 min per carried order.
RULE_CIRCUITY: Final = 1.3
RULE_STOP_MINUTES: Final = 3.0
NOMINAL_SPEED_KMH: Final = (17.0, 24.0, 30.0)  # e-bike, motorbike, car: free-flow speeds
# Unassigned in distance matching costs more than any B straight-line kilometres can.
_UNMATCHED_KM: Final = 1e5
_FORBIDDEN_KM: Final = 1e9


def nearest_rider_assignment(window: DispatchWindow) -> NDArray[np.int32]:
    """int32 [B]: the rider row given to each order, -1 when no feasible rider is left.

    Ties in distance go to the lower rider row. One vectorised pass over the riders per
    order (B <= 1024), so memory stays O(R) even for the largest windows.
    """
    num_orders = window.num_orders
    out = np.full(num_orders, -1, dtype=np.int32)
    if num_orders == 0 or window.num_riders == 0:
        return out
    given = np.zeros(window.num_riders, dtype=np.int64)  # orders this window gave each rider
    load = window.rider_load.astype(np.int64)

    lat = window.rider_position[:, 0]
    lon = window.rider_position[:, 1]
    queue = np.lexsort((np.arange(num_orders), window.created_at))
    for b in queue.tolist():
        ok = feasible(
            window.constraints[b],
            window.rider_equipment,
            window.rider_vehicle,
            load + given,
            window.rider_capacity,
        )
        if not ok.any():
            continue
        dist = geo.haversine_km(lat, lon, window.pickup[b, 0], window.pickup[b, 1])
        rider = int(np.argmin(np.where(ok, dist, np.inf)))  # first minimum: lowest row
        out[b] = rider
        given[rider] += 1
    return out


def distance_matching_assignment(window: DispatchWindow) -> NDArray[np.int32]:
    """int32 [B]: maximum-cardinality, minimum-total-distance assignment (scipy).

    Every feasible rider (hard constraints, spare capacity) of every order, straight-line
    distance rider -> pickup; rider r offers ``spare_r`` interchangeable slots, each order a
    private "unassigned" column dearer than any B distances together, so the optimum
    serves the most orders and, among those, drives the fewest kilometres.
    """
    num_orders = window.num_orders
    out = np.full(num_orders, -1, dtype=np.int32)
    spare = spare_slots(window.rider_load, window.rider_capacity)
    feasible = feasible_mask(window)
    if num_orders == 0 or not feasible.any():
        return out
    slot_rider = np.repeat(np.arange(window.num_riders), np.minimum(spare, num_orders))
    dist = geo.haversine_km(
        window.pickup[:, None, 0],
        window.pickup[:, None, 1],
        window.rider_position[None, :, 0],
        window.rider_position[None, :, 1],
    )
    km = np.where(feasible, dist, _FORBIDDEN_KM)[:, slot_rider]
    unmatched = np.full((num_orders, num_orders), _FORBIDDEN_KM)
    np.fill_diagonal(unmatched, _UNMATCHED_KM)
    rows, cols = linear_sum_assignment(np.concatenate([km, unmatched], axis=1))
    real = cols < slot_rider.size
    chosen = rows[real]
    riders = slot_rider[cols[real]]
    ok = feasible[chosen, riders]
    out[chosen[ok]] = riders[ok]
    return out


_PICKUP_KM = PAIR_FEATURE_NAMES.index("pickup_distance_km")
_TRIP_KM = PAIR_FEATURE_NAMES.index("trip_distance_km")
_LOAD = PAIR_FEATURE_NAMES.index("rider_load")
_AGE = PAIR_FEATURE_NAMES.index("order_age_minutes")
_PROMISED = PAIR_FEATURE_NAMES.index("promised_minutes")
_VEHICLE = [PAIR_FEATURE_NAMES.index(f"vehicle_{name}") for name in ("ebike", "motorbike", "car")]


def rule_objectives(features: NDArray[np.float32]) -> NDArray[np.float32]:
    """[P, 3] objectives of the rule ETA from pair features, for the project's resolver.

    ETA = (rider -> pickup + pickup -> drop-off straight-line km) x 1.3 / nominal vehicle
    speed + 3 min per carried order; on time = a logistic of the slack left by that ETA
    (scale 5 minutes); cost = CNY 5 + 1.25 per road km + 0.25 per minute, the riders' pay
    rule. It reads only what the features hold, so stacked orders re-score like the model's.
    """
    f = features.astype(np.float64)
    road_km = (f[:, _PICKUP_KM] + f[:, _TRIP_KM]) * RULE_CIRCUITY
    speed = f[:, _VEHICLE] @ np.asarray(NOMINAL_SPEED_KMH)
    eta = road_km / np.maximum(speed, 1.0) * 60.0 + RULE_STOP_MINUTES * f[:, _LOAD]
    slack = f[:, _PROMISED] - f[:, _AGE] - eta
    ontime = 1.0 / (1.0 + np.exp(-np.clip(slack / 5.0, -50.0, 50.0)))
    cost = 5.0 + 1.25 * road_km + 0.25 * eta
    out: NDArray[np.float32] = np.stack([eta, ontime, cost], axis=1).astype(np.float32)
    return out
