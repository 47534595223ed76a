"""Contract v2: the packed window unpacks to the same window, and its errors name columns."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import CoordSystem, pack_window
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window import (
    rider_counts_from_wire,
    window_from_tensors,
    window_from_wire,
    window_to_tensors,
    window_to_wire,
)
from dispatch_service.offline.simulator import generate_window

Tensors = dict[str, NDArray[Any]]


def wire(seed: int = 0, orders: int = 5, riders: int = 9) -> Tensors:
    return dict(window_to_wire(generate_window(np.random.default_rng(seed), orders, riders)))


def assert_same_window(a: Any, b: Any) -> None:
    for field in dataclasses.fields(a):
        left, right = getattr(a, field.name), getattr(b, field.name)
        if isinstance(left, np.ndarray):
            assert left.dtype == right.dtype, field.name
            np.testing.assert_array_equal(left, right, err_msg=field.name)
        else:
            assert left == right, field.name


@pytest.mark.parametrize("coord", ["WGS84", "GCJ02", "BD09"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_packed_window_is_the_window_of_the_separate_tensors(seed: int, coord: str) -> None:
    tensors = dict(window_to_tensors(generate_window(np.random.default_rng(seed), 7, 11)))
    tensors["COORD_SYSTEM"] = np.array([coord.encode()], dtype=object)
    expected = window_from_tensors(tensors)
    got = window_from_wire(pack_window(tensors))
    assert got.coord_system == CoordSystem[coord]
    assert_same_window(got, expected)


def test_a_fraction_in_an_integer_column_names_the_column_and_row() -> None:
    tensors = wire()
    tensors["ORDER_FIELDS"][3, 6] = 1.5  # constraints
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == "ORDER_FIELDS[constraints]"
    assert caught.value.rule.startswith("must be a whole number")
    assert caught.value.rule.endswith("(row 3)")
    assert caught.value.code == "range"


def test_nan_in_an_integer_column_is_not_finite() -> None:
    tensors = wire()
    tensors["RIDER_FIELDS"][2, 3] = np.nan  # capacity
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert (
        str(caught.value) == "RIDER_FIELDS[capacity]: must be finite, got NaN or infinity (row 2)"
    )
    assert caught.value.code == "not_finite"


def test_value_rules_are_those_of_the_separate_tensors_renamed_to_their_column() -> None:
    tensors = wire()
    tensors["ORDER_FIELDS"][1, 5] = 500.0  # promised_minutes
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == "ORDER_FIELDS[promised_minutes]"
    assert caught.value.rule == "must be within (0, 240] minutes (row 1)"
    tensors = wire()
    tensors["RIDER_FIELDS"][4, 0] = -91.0  # lat
    with pytest.raises(DispatchInputError, match=r"RIDER_FIELDS\[lat, lon\]: latitude"):
        window_from_wire(tensors)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ORDER_FIELDS", np.zeros((5, 6)), r"ORDER_FIELDS: must have shape \[\*, 7\] \(columns "),
        ("RIDER_FIELDS", np.zeros((9, 6), np.float32), "RIDER_FIELDS: must be FP64, got float32"),
        ("WINDOW_FIELDS", np.zeros(3), r"WINDOW_FIELDS: must have shape \[2\]"),
        ("WINDOW_FIELDS", np.array([1.7e9, 3.0]), r"WINDOW_FIELDS\[coord_system\]: must be one of"),
        ("WINDOW_FIELDS", np.array([1.7e9 + 0.5, 0.0]), r"WINDOW_FIELDS\[dispatch_time\]: must"),
        ("ORDER_FIELDS", None, "ORDER_FIELDS: is required but missing"),
    ],
)
def test_malformed_matrices_name_the_tensor_and_the_rule(
    name: str, value: NDArray[Any] | None, message: str
) -> None:
    tensors: dict[str, Any] = wire()
    tensors[name] = value
    with pytest.raises(DispatchInputError, match=message):
        window_from_wire(tensors)


def test_rider_counts_are_the_load_and_capacity_columns() -> None:
    tensors = wire(riders=4)
    tensors["RIDER_FIELDS"][:, 2] = [0, 1, 2, 3]
    tensors["RIDER_FIELDS"][:, 3] = [4, 4, 5, 5]
    load, capacity = rider_counts_from_wire(tensors)
    assert load.dtype == capacity.dtype == np.int32
    assert (load.tolist(), capacity.tolist()) == ([0, 1, 2, 3], [4, 4, 5, 5])
