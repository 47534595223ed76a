"""Nearest-rider dispatch: nearest feasible rider, first come first served, capacity kept."""

from __future__ import annotations

from typing import Any

import numpy as np

from dispatch_contract import HARD_CONSTRAINTS, OrderConstraint, Vehicle
from dispatch_service.domain import geo
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline import simulator
from dispatch_service.offline.baseline import nearest_rider_assignment

CENTRE = (31.2304, 121.4737)  # Shanghai, People's Square


def east(km: float) -> list[float]:
    """A point ``km`` east of the city centre."""
    lon = CENTRE[1] + np.degrees(km / (geo.EARTH_RADIUS_KM * np.cos(np.radians(CENTRE[0]))))
    return [CENTRE[0], float(lon)]


def window(
    orders: list[list[float]],
    riders: list[list[float]],
    *,
    created_at: list[int] | None = None,
    constraints: list[int] | None = None,
    load: list[int] | None = None,
    capacity: list[int] | None = None,
    vehicle: list[int] | None = None,
    equipment: list[int] | None = None,
) -> DispatchWindow:
    b, r = len(orders), len(riders)

    def ids(prefix: str, n: int) -> Any:
        out = np.empty(n, dtype=object)
        out[:] = [f"{prefix}-{i}".encode() for i in range(n)]
        return out

    return DispatchWindow(
        order_ids=ids("o", b),
        order_user_ids=ids("u", b),
        pickup=np.asarray(orders, dtype=np.float64),
        dropoff=np.asarray(orders, dtype=np.float64),
        created_at=np.asarray(created_at or [1_700_000_000] * b, dtype=np.int64),
        promised_minutes=np.full(b, 30.0, dtype=np.float32),
        constraints=np.asarray(constraints or [0] * b, dtype=np.int32),
        rider_ids=ids("r", r),
        rider_position=np.asarray(riders, dtype=np.float64),
        rider_load=np.asarray(load or [0] * r, dtype=np.int32),
        rider_capacity=np.asarray(capacity or [1] * r, dtype=np.int32),
        rider_vehicle=np.asarray(vehicle or [Vehicle.EBIKE] * r, dtype=np.int32),
        rider_equipment=np.asarray(equipment or [0] * r, dtype=np.int32),
        dispatch_time=1_700_000_100,
    )


def test_nearest_rider_is_chosen() -> None:
    w = window([east(0.0)], [east(3.0), east(-0.5), east(1.0)])
    assigned = nearest_rider_assignment(w)
    assert assigned.dtype == np.int32
    assert assigned.tolist() == [1]


def test_equal_distances_go_to_the_lower_row() -> None:
    w = window([east(0.0)], [east(2.0), east(1.0), east(1.0)])
    assert nearest_rider_assignment(w).tolist() == [1]


def test_capacity_counts_this_windows_assignments() -> None:
    # Rider 0 is nearest but has one free slot; rider 1 has two; rider 2 is full.
    w = window(
        [east(0.0)] * 4,
        [east(0.1), east(2.0), east(0.05)],
        load=[1, 0, 3],
        capacity=[2, 2, 3],
    )
    assigned = nearest_rider_assignment(w)
    assert assigned.tolist() == [0, 1, 1, -1]
    counts = np.bincount(assigned[assigned >= 0], minlength=3)
    assert (counts <= w.rider_capacity - w.rider_load).all()


def test_first_created_order_is_served_first() -> None:
    # Order 1 is older, so it takes the only near rider although it comes second.
    w = window(
        [east(0.0), east(0.0)],
        [east(0.2), east(5.0)],
        created_at=[1_700_000_050, 1_700_000_000],
    )
    assert nearest_rider_assignment(w).tolist() == [1, 0]


def test_hard_constraints_are_respected() -> None:
    thermal, large = int(OrderConstraint.THERMAL_BOX), int(OrderConstraint.LARGE_ITEM)
    w = window(
        [east(0.0)] * 4,
        [east(0.1), east(0.5), east(1.0), east(2.0)],
        constraints=[thermal, large, thermal | large, int(OrderConstraint.FRAGILE)],
        vehicle=[Vehicle.EBIKE, Vehicle.EBIKE, Vehicle.CAR, Vehicle.CAR],
        equipment=[0, 1, 0, 1],
        capacity=[1, 1, 1, 1],
    )
    # thermal -> rider 1 (box); large -> rider 2 (car); both -> rider 3 (car with box);
    # fragile has no hard rule but every rider is taken, so nobody is left.
    assert nearest_rider_assignment(w).tolist() == [1, 2, 3, 0]


def test_no_feasible_rider_leaves_the_order_unassigned() -> None:
    w = window(
        [east(0.0), east(0.0)],
        [east(0.1)],
        constraints=[int(OrderConstraint.LARGE_ITEM), 0],
    )
    assert nearest_rider_assignment(w).tolist() == [-1, 0]


def test_simulated_windows_keep_every_rule() -> None:
    rng = np.random.default_rng(4)
    for _ in range(5):
        w = simulator.generate_window(rng, 64, 120)
        assigned = nearest_rider_assignment(w)
        taken = assigned[assigned >= 0]
        spare = w.rider_capacity - w.rider_load
        assert (np.bincount(taken, minlength=w.num_riders) <= spare).all()
        rows = np.flatnonzero(assigned >= 0)
        hard = w.constraints[rows] & HARD_CONSTRAINTS
        riders = assigned[rows]
        needs_box = (hard & OrderConstraint.THERMAL_BOX) != 0
        needs_car = (hard & OrderConstraint.LARGE_ITEM) != 0
        assert ((w.rider_equipment[riders] & 1) != 0)[needs_box].all()
        assert (w.rider_vehicle[riders] == Vehicle.CAR)[needs_car].all()
        # No feasible rider was nearer than the one chosen for the first order served.
        first = int(np.lexsort((np.arange(w.num_orders), w.created_at))[0])
        if assigned[first] >= 0:
            dist = geo.haversine_km(
                w.rider_position[:, 0], w.rider_position[:, 1], *w.pickup[first]
            )
            ok = spare > 0
            if w.constraints[first] & OrderConstraint.THERMAL_BOX:
                ok &= (w.rider_equipment & 1) != 0
            if w.constraints[first] & OrderConstraint.LARGE_ITEM:
                ok &= w.rider_vehicle == Vehicle.CAR
            assert dist[assigned[first]] == dist[ok].min()
