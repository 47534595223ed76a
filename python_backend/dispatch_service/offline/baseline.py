"""Nearest-rider dispatch: the rule operators compare the model against, and its fallback.

The rule as dispatch teams run it: orders are served first come, first served (creation
time, then row), and each takes the rider nearest to its pickup in straight-line
(haversine) distance among those who may carry it: the hard constraints hold (thermal box,
car for large items) and the rider still has spare capacity, counting the orders this very
window has already given them. It knows nothing about rivers, traffic, vehicle speed or
load, which is exactly what the learned model is meant to add.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain import geo
from dispatch_service.domain.feasibility import feasible
from dispatch_service.domain.window import DispatchWindow

__all__ = [
    "nearest_rider_assignment",
]


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
