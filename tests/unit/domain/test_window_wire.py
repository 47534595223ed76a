"""Contract v2: the packed window unpacks to the same window, and its errors name columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from window_helpers import assert_same_window, wire, with_addresses

from dispatch_contract import CoordSystem, pack_order_text, pack_window
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window import window_from_tensors, window_to_tensors
from dispatch_service.domain.window_wire import (
    order_created_at_from_wire,
    rider_counts_from_wire,
    user_ids_from_wire,
    window_from_wire,
    window_tensors_from_wire,
    window_to_wire,
)
from dispatch_service.offline.simulator import generate_window

Tensors = dict[str, NDArray[Any]]


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


def test_of_several_bad_integer_columns_the_first_column_is_named() -> None:
    # The whole-number columns are checked together; an error still names the first bad
    # column in column order (then its first bad row), as the per-column check did.
    tensors = wire()
    tensors["RIDER_FIELDS"][4, 5] = 0.5  # equipment
    tensors["RIDER_FIELDS"][6, 3] = np.inf  # capacity: an earlier column, a later row
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert str(caught.value) == (
        "RIDER_FIELDS[capacity]: must be finite, got NaN or infinity (row 6)"
    )
    with pytest.raises(DispatchInputError, match=r"RIDER_FIELDS\[capacity\].*\(row 6\)"):
        rider_counts_from_wire(tensors)


@pytest.mark.parametrize(
    ("column", "value", "ok"),
    [(4, 2.0**62, True), (4, 2.0**62 * 1.5, False), (6, 2.0**31 - 1, True), (6, 2.0**31, False)],
)
def test_each_integer_column_keeps_its_own_limit(column: int, value: float, ok: bool) -> None:
    tensors = wire()  # created_at (column 4) is INT64, constraints (column 6) INT32
    tensors["ORDER_FIELDS"][1, column] = value
    tensors["WINDOW_FIELDS"][0] = 2.0**62  # created_at after dispatch_time is another rule
    if ok:
        window_tensors_from_wire(tensors)
        return
    with pytest.raises(DispatchInputError, match=r"must be a whole number.*\(row 1\)"):
        window_tensors_from_wire(tensors)


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


def test_order_creation_times_are_the_created_at_column() -> None:
    tensors = wire(orders=3)
    tensors["ORDER_FIELDS"][:, 4] = [1_764_399_700, 1_764_399_820, 2.0**62]
    created_at = order_created_at_from_wire(tensors)
    assert created_at.dtype == np.int64
    assert created_at.tolist() == [1_764_399_700, 1_764_399_820, 2**62]
    tensors["ORDER_FIELDS"][1, 4] = 0.5
    with pytest.raises(DispatchInputError, match=r"ORDER_FIELDS\[created_at\].*\(row 1\)"):
        order_created_at_from_wire(tensors)
    with pytest.raises(DispatchInputError, match="ORDER_FIELDS: must have shape"):
        order_created_at_from_wire({"ORDER_FIELDS": np.zeros((3, 6))})


# ---- ORDER_TEXT: user ids and, optionally, addresses -----------------------------------------


def test_a_window_without_addresses_sends_only_the_user_id_column() -> None:
    tensors = wire()
    assert tensors["ORDER_TEXT"].shape == (5, 1)
    window = window_from_wire(tensors)
    assert window.pickup_address is None and window.city is None
    assert not window.needs_geocoding


def test_addresses_unpack_per_row_and_nan_rows_are_kept_for_the_geocoder() -> None:
    tensors = with_addresses(wire(), [1, 3])
    window = window_from_wire(tensors)
    assert window.needs_geocoding
    assert np.isnan(window.pickup[[1, 3]]).all() and np.isfinite(window.pickup[[0, 2, 4]]).all()
    assert window.pickup_address is not None and window.city is not None
    assert window.pickup_address.tolist() == [b"", "上海市徐汇区徐家汇".encode(), b"",
                                             "上海市徐汇区徐家汇".encode(), b""]  # fmt: skip
    assert window.city[1] == "上海".encode()
    # the round trip packs the same four columns back
    np.testing.assert_array_equal(window_to_wire(window)["ORDER_TEXT"], tensors["ORDER_TEXT"])


def test_a_row_with_both_keeps_its_coordinates() -> None:
    tensors = with_addresses(wire(), [2])
    tensors["ORDER_FIELDS"][2, 0:2] = [31.2, 121.45]
    window = window_from_wire(tensors)
    assert not window.needs_geocoding
    np.testing.assert_allclose(window.pickup[2], [31.2, 121.45])


def test_user_ids_are_the_first_column() -> None:
    tensors = with_addresses(wire(), [0])
    np.testing.assert_array_equal(user_ids_from_wire(tensors), wire()["ORDER_TEXT"][:, 0])
    window = window_from_wire(tensors)
    np.testing.assert_array_equal(window.order_user_ids, wire()["ORDER_TEXT"][:, 0])


@pytest.mark.parametrize(
    ("end", "tensor", "names"),
    [
        ("pickup", "ORDER_FIELDS[pickup_lat, pickup_lon]", "ORDER_PICKUP_ADDRESS"),
        ("dropoff", "ORDER_FIELDS[dropoff_lat, dropoff_lon]", "ORDER_DROPOFF_ADDRESS"),
    ],
)
def test_nan_coordinates_without_an_address_name_field_rule_and_row(
    end: str, tensor: str, names: str
) -> None:
    tensors = wire()
    lat = 0 if end == "pickup" else 2
    tensors["ORDER_FIELDS"][4, lat : lat + 2] = np.nan
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == tensor
    assert caught.value.code == "missing"
    assert "row 4" in caught.value.rule and "give coordinates or an address" in caught.value.rule


def test_half_nan_coordinates_are_not_finite_even_with_an_address() -> None:
    tensors = with_addresses(wire(), [1])
    tensors["ORDER_FIELDS"][1, 0] = 31.2  # lat given, lon NaN
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == "ORDER_FIELDS[pickup_lat, pickup_lon]"
    assert caught.value.code == "not_finite"


@pytest.mark.parametrize(
    ("column", "value", "field", "code", "rule"),
    [
        (1, b"\xff\xfe", "ORDER_TEXT[pickup_address]", "dtype", "must be valid UTF-8, row 2"),
        (2, "路".encode() * 86, "ORDER_TEXT[dropoff_address]", "id_length",
         "must be at most 256 bytes of UTF-8, row 2 has 258"),
        (3, b"x" * 65, "ORDER_TEXT[city]", "id_length",
         "must be at most 64 bytes of UTF-8, row 2 has 65"),
    ],
)  # fmt: skip
def test_bad_address_text_names_column_rule_and_row(
    column: int, value: bytes, field: str, code: str, rule: str
) -> None:
    tensors = with_addresses(wire(), [1])
    tensors["ORDER_TEXT"][2, column] = value  # a row with coordinates: still checked
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert (caught.value.tensor, caught.value.code) == (field, code)
    assert caught.value.rule.startswith(rule)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (np.array([b"u1", b"u2"], dtype=object), "must have shape [*, 1..4]"),
        (np.full((5, 5), b"u", dtype=object), "must have shape [*, 1..4]"),
        (np.zeros((5, 1), np.float32), "must be BYTES"),
    ],
)
def test_a_malformed_order_text_names_the_tensor(value: NDArray[Any], rule: str) -> None:
    tensors = wire()
    tensors["ORDER_TEXT"] = value
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == "ORDER_TEXT"
    assert caught.value.rule.startswith(rule)


def test_pack_order_text_drops_trailing_empty_columns() -> None:
    users = np.array([b"u1", b"u2"], dtype=object)
    assert pack_order_text({"ORDER_USER_IDS": users}).shape == (2, 1)
    pickup_only = {"ORDER_USER_IDS": users, "ORDER_PICKUP_ADDRESS": [b"a", b""]}
    assert pack_order_text(pickup_only).tolist() == [[b"u1", b"a"], [b"u2", b""]]
    city_only = {"ORDER_USER_IDS": users, "ORDER_CITY": [b"", "上海".encode()]}
    assert pack_order_text(city_only).tolist() == [
        [b"u1", b"", b"", b""],
        [b"u2", b"", b"", "上海".encode()],
    ]


@pytest.mark.parametrize(("seed", "orders", "riders"), [(0, 1, 20), (1, 1, 1), (2, 64, 200)])
def test_the_usual_request_builds_the_window_the_full_checks_build(
    seed: int, orders: int, riders: int
) -> None:
    """A WGS-84 request without addresses takes the short path (`_usual_window`); its
    window is the one the full checks of the unpacked tensors build, byte for byte."""
    tensors = window_to_wire(generate_window(np.random.default_rng(seed), orders, riders))
    got = window_from_wire(tensors)
    expected = window_from_tensors(window_tensors_from_wire(tensors))
    assert_same_window(got, expected)
    for name in ("pickup", "dropoff", "rider_position", "rider_load", "rider_equipment"):
        value = getattr(got, name)
        assert value.flags.c_contiguous, name
        assert value.tobytes() == getattr(expected, name).tobytes(), name
    assert not np.shares_memory(got.pickup, tensors["ORDER_FIELDS"])


@pytest.mark.parametrize(
    ("column", "row", "value", "named"),
    [
        ("ORDER_FIELDS", (0, 5), 1e-50, "ORDER_FIELDS[promised_minutes]"),  # 0 as FP32
        ("ORDER_FIELDS", (0, 4), 2e9, "ORDER_FIELDS[created_at]"),  # after the dispatch time
        ("ORDER_FIELDS", (0, 6), 1 << 20, "ORDER_FIELDS[constraints]"),
        ("ORDER_FIELDS", (0, 1), 181.0, "ORDER_FIELDS[pickup_lat, pickup_lon]"),
        ("RIDER_FIELDS", (2, 4), 3.0, "RIDER_FIELDS[vehicle]"),
        ("RIDER_FIELDS", (2, 2), 1001.0, "RIDER_FIELDS[load]"),
        ("RIDER_FIELDS", (2, 5), -1.0, "RIDER_FIELDS[equipment]"),
        ("WINDOW_FIELDS", (0,), 1.5e9 + 0.5, "WINDOW_FIELDS[dispatch_time]"),
    ],
)
def test_a_usual_request_breaking_a_value_rule_gets_the_full_checks_error(
    column: str, row: tuple[int, ...], value: float, named: str
) -> None:
    tensors = window_to_wire(generate_window(np.random.default_rng(4), 3, 5))
    tensors[column][row] = value
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == named


@pytest.mark.parametrize(
    ("column", "row", "value"),
    [
        ("ORDER_FIELDS", (0, 5), 240.0),  # promised minutes at their limit
        ("ORDER_FIELDS", (0, 5), 240.00000001),  # above it as FP64, 240 as FP32
        ("ORDER_FIELDS", (0, 5), 1e-40),  # a subnormal FP32, still above 0
        ("ORDER_FIELDS", (0, 0), -90.0),
        ("ORDER_FIELDS", (1, 3), 180.0),
        ("RIDER_FIELDS", (2, 2), 1000.0),  # load at its limit
        ("RIDER_FIELDS", (2, 4), 2.0),  # the last vehicle
        ("RIDER_FIELDS", (2, 5), float(2**31 - 1)),  # equipment: any INT32 >= 0
    ],
)
def test_a_usual_request_at_a_rules_edge_is_served_as_the_full_checks_serve_it(
    column: str, row: tuple[int, ...], value: float
) -> None:
    """Values on the edge of a rule (or past it only before the FP32 conversion) are
    accepted, with the window the full checks of the unpacked tensors build."""
    tensors = window_to_wire(generate_window(np.random.default_rng(4), 3, 5))
    tensors[column][row] = value
    assert_same_window(
        window_from_wire(tensors), window_from_tensors(window_tensors_from_wire(tensors))
    )


def test_an_order_created_up_to_the_clock_skew_after_the_dispatch_time_is_served() -> None:
    tensors = window_to_wire(generate_window(np.random.default_rng(4), 3, 5))
    tensors["ORDER_FIELDS"][0, 4] = tensors["WINDOW_FIELDS"][0] + 300
    assert window_from_wire(tensors).created_at[0] == tensors["WINDOW_FIELDS"][0] + 300
    tensors["ORDER_FIELDS"][0, 4] += 1
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == "ORDER_FIELDS[created_at]"


def test_repeated_ids_on_the_usual_path_are_refused() -> None:
    tensors = window_to_wire(generate_window(np.random.default_rng(5), 3, 5))
    tensors["RIDER_IDS"][4] = tensors["RIDER_IDS"][1]
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert str(caught.value) == "RIDER_IDS: ids must be unique, row 4 repeats row 1"
