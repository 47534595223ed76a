"""The one feasibility rule, against hand-computed cases, and its three users agree with it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dispatch_contract import OrderConstraint, Vehicle
from dispatch_service.domain.feasibility import (
    THERMAL_EQUIPMENT_BIT,
    feasible,
    meets_hard_constraints,
    spare_slots,
)
from dispatch_service.domain.features import feasible_mask
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline.baseline import nearest_rider_assignment
from dispatch_service.offline.simulator import DEFAULT_CITY, expected_outcome, generate_window

BOX = THERMAL_EQUIPMENT_BIT
THERMAL = int(OrderConstraint.THERMAL_BOX)
LARGE = int(OrderConstraint.LARGE_ITEM)
FRAGILE = int(OrderConstraint.FRAGILE)
PRIORITY = int(OrderConstraint.PRIORITY)
EBIKE, CAR = int(Vehicle.EBIKE), int(Vehicle.CAR)

# (order constraints, rider equipment, rider vehicle, load, capacity, feasible): by hand.
CASES = [
    (0, 0, EBIKE, 0, 1, True),  # no constraint, one free slot
    (0, 0, EBIKE, 1, 1, False),  # full
    (0, 0, EBIKE, 2, 1, False),  # over capacity
    (0, 0, EBIKE, 0, 0, False),  # capacity 0
    (THERMAL, 0, CAR, 0, 3, False),  # thermal order, no box
    (THERMAL, BOX, EBIKE, 0, 3, True),  # thermal order, box
    (THERMAL, BOX | 2, EBIKE, 0, 3, True),  # other equipment bits do not matter
    (THERMAL, 2, EBIKE, 0, 3, False),  # ... nor stand in for the box
    (LARGE, BOX, EBIKE, 0, 3, False),  # large item on an e-bike
    (LARGE, 0, int(Vehicle.MOTORBIKE), 0, 3, False),  # ... or a motorbike
    (LARGE, 0, CAR, 0, 3, True),  # large item by car
    (THERMAL | LARGE, 0, CAR, 0, 3, False),  # both needed, box missing
    (THERMAL | LARGE, BOX, CAR, 2, 3, True),  # both met, one slot left
    (THERMAL | LARGE, BOX, CAR, 3, 3, False),  # both met, full
    (FRAGILE | PRIORITY, 0, EBIKE, 0, 1, True),  # soft constraints never block
]


@pytest.mark.parametrize(("flags", "equipment", "vehicle", "load", "capacity", "ok"), CASES)
def test_feasible_matches_hand_computed_cases(
    flags: int, equipment: int, vehicle: int, load: int, capacity: int, ok: bool
) -> None:
    assert bool(feasible(flags, equipment, vehicle, load, capacity)) is ok


def test_hard_constraints_ignore_capacity() -> None:
    assert bool(meets_hard_constraints(THERMAL | LARGE, BOX, CAR))
    assert not bool(meets_hard_constraints(THERMAL, 0, CAR))
    assert not bool(meets_hard_constraints(LARGE, BOX, EBIKE))


def test_feasible_broadcasts_orders_against_riders() -> None:
    flags = np.array([0, THERMAL, LARGE])[:, None]
    got = feasible(
        flags,
        np.array([0, BOX, BOX]),
        np.array([CAR, EBIKE, CAR]),
        np.array([0, 0, 4]),
        np.array([2, 2, 4]),
    )
    expected = np.array(
        [
            [True, True, False],  # the third rider is full
            [False, True, False],
            [True, False, False],
        ]
    )
    np.testing.assert_array_equal(got, expected)


def _hand_window() -> DispatchWindow:
    """Three orders, four riders; the feasible pairs are worked out by hand below."""
    window = generate_window(np.random.default_rng(3), num_orders=3, num_riders=4)
    window.constraints[:] = [0, THERMAL, LARGE | FRAGILE]
    window.rider_equipment[:] = [0, BOX, BOX, 0]
    window.rider_vehicle[:] = [EBIKE, EBIKE, CAR, CAR]
    window.rider_load[:] = [0, 1, 0, 2]
    window.rider_capacity[:] = [1, 2, 1, 2]
    return window


HAND_MASK = np.array(
    [
        [True, True, True, False],  # rider 3 is full
        [False, True, True, False],  # box: riders 1 and 2
        [False, False, True, False],  # car with room: rider 2
    ]
)


def test_encoder_mask_is_the_rule() -> None:
    np.testing.assert_array_equal(feasible_mask(_hand_window()), HAND_MASK)


def test_simulator_charges_a_violation_exactly_off_the_rule() -> None:
    window = _hand_window()
    orders, riders = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    free = dataclasses.replace(DEFAULT_CITY, violation_minutes=0.0, violation_cost_cny=0.0)
    _, _, cost = expected_outcome(window, orders.ravel(), riders.ravel())
    _, _, free_cost = expected_outcome(window, orders.ravel(), riders.ravel(), free)
    charged = (cost - free_cost).reshape(3, 4)
    # Broken pairs pay the hand-over (cost and minutes); feasible pairs pay nothing extra.
    np.testing.assert_allclose(charged[HAND_MASK], 0.0, atol=1e-9)
    assert (charged[~HAND_MASK] >= 15.0).all()


def test_baseline_only_assigns_feasible_riders_and_fills_capacity() -> None:
    window = _hand_window()
    given = nearest_rider_assignment(window)
    for order, rider in enumerate(given.tolist()):
        if rider >= 0:
            assert HAND_MASK[order, rider]
    # Rider 2 (the only choice of order 2) takes one order at most: capacity 1, load 0.
    assert int(np.sum(given == 2)) <= 1
    assert int(np.sum(given == 1)) <= 1  # load 1 of 2


def test_spare_slots_is_capacity_less_load_and_never_negative() -> None:
    # An overloaded rider (load above capacity, as a feature service may report) has none.
    got = spare_slots(np.array([0, 1, 3, 5], dtype=np.int32), np.array([2, 3, 3, 4]))
    assert got.dtype == np.int64
    assert got.tolist() == [2, 2, 0, 0]


def test_an_order_without_hard_constraints_is_judged_by_room_alone() -> None:
    load, capacity = np.array([0, 1, 2], np.int32), np.array([1, 1, 3], np.int32)
    equipment, vehicle = np.array([0, 1, 0], np.int32), np.array([0, 2, 1], np.int32)
    fragile = int(OrderConstraint.FRAGILE)  # a soft bit: no rider is ruled out by it
    for plain in (0, fragile):
        assert feasible(plain, equipment, vehicle, load, capacity).tolist() == [True, False, True]
    thermal = int(OrderConstraint.THERMAL_BOX)
    assert feasible(thermal, equipment, vehicle, load, capacity).tolist() == [False] * 3
    large = int(OrderConstraint.LARGE_ITEM)
    assert feasible(large, equipment, vehicle, load, capacity).tolist() == [False] * 3
    # one order against a [1, R] row of riders: the shape broadcasting gives, as before
    assert feasible(0, equipment[None], vehicle[None], load, capacity).shape == (1, 3)
