"""May this rider carry this order: the one rule serving, the baseline and the simulator share.

A pair is feasible when the rider meets the order's hard constraints (a thermal box for
THERMAL_BOX, a car for LARGE_ITEM) and still has spare capacity (load below capacity).
The encoder keeps only feasible candidates, the nearest-rider baseline picks among them,
and the simulator charges a violation to any other pair: one definition keeps the three
from drifting apart.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import OrderConstraint, Vehicle

__all__ = [
    "THERMAL_EQUIPMENT_BIT",
    "feasible",
    "meets_hard_constraints",
    "spare_slots",
]

# Bit of RIDER_EQUIPMENT that says the rider carries a thermal box.
THERMAL_EQUIPMENT_BIT: Final = 1
# The order bits `meets_hard_constraints` reads.
_HARD_BITS: Final = int(OrderConstraint.THERMAL_BOX) | int(OrderConstraint.LARGE_ITEM)


def meets_hard_constraints(
    constraints: ArrayLike, rider_equipment: ArrayLike, rider_vehicle: ArrayLike
) -> NDArray[np.bool_]:
    """Element-wise (numpy broadcasting): does the rider meet the order's hard constraints."""
    flags = np.asarray(constraints, dtype=np.int64)
    has_box = (np.asarray(rider_equipment, dtype=np.int64) & THERMAL_EQUIPMENT_BIT) != 0
    is_car = np.asarray(rider_vehicle, dtype=np.int64) == int(Vehicle.CAR)
    needs_box = (flags & int(OrderConstraint.THERMAL_BOX)) != 0
    needs_car = (flags & int(OrderConstraint.LARGE_ITEM)) != 0
    return np.asarray((has_box | ~needs_box) & (is_car | ~needs_car))


def feasible(
    constraints: ArrayLike,
    rider_equipment: ArrayLike,
    rider_vehicle: ArrayLike,
    rider_load: ArrayLike,
    rider_capacity: ArrayLike,
) -> NDArray[np.bool_]:
    """Element-wise (numpy broadcasting): hard constraints met and load below capacity."""
    load = np.asarray(rider_load, dtype=np.int64)
    capacity = np.asarray(rider_capacity, dtype=np.int64)
    room = load < capacity
    if (
        type(constraints) is int
        and not constraints & _HARD_BITS
        and np.shape(rider_equipment) == np.shape(rider_vehicle) == room.shape
    ):  # an order with no hard constraint (the encoder's usual one): room alone decides
        return np.asarray(room)
    return np.asarray(meets_hard_constraints(constraints, rider_equipment, rider_vehicle) & room)


def spare_slots(rider_load: ArrayLike, rider_capacity: ArrayLike) -> NDArray[np.int64]:
    """int64, element-wise: how many new orders a rider may still take (never negative)."""
    load = np.asarray(rider_load, dtype=np.int64)
    capacity = np.asarray(rider_capacity, dtype=np.int64)
    return np.asarray(np.maximum(capacity - load, 0), dtype=np.int64)
