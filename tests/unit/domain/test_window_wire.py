"""Contract v2: the packed window unpacks to the same window, and its errors name columns."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import CoordSystem, pack_order_text, pack_window
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window import (
    LATEST_TIME,
    order_created_at_from_wire,
    rider_counts_from_wire,
    user_ids_from_wire,
    window_from_tensors,
    window_from_wire,
    window_tensors_from_wire,
    window_to_tensors,
    window_to_wire,
    windows_from_wire,
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


# ---- ORDER_TEXT: user ids and, optionally, addresses (issue 13) ----------------------------


def with_addresses(tensors: Tensors, rows: list[int], end: str = "pickup") -> Tensors:
    """``tensors`` with the ``end`` point of ``rows`` sent as an address (coordinates NaN)."""
    out = {name: np.array(value, copy=True) for name, value in tensors.items()}
    count = len(out["ORDER_IDS"])
    text = np.full((count, 4), b"", dtype=object)
    text[:, 0] = out["ORDER_TEXT"][:, 0]
    column = 1 if end == "pickup" else 2
    lat = 0 if end == "pickup" else 2
    for row in rows:
        text[row, column] = "上海市徐汇区徐家汇".encode()
        text[row, 3] = "上海".encode()
        out["ORDER_FIELDS"][row, lat : lat + 2] = np.nan
    out["ORDER_TEXT"] = text
    return out


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


# ---- a batch of windows (one Triton execute) ---------------------------------------------


def alone(tensors: Tensors) -> Any:
    try:
        return window_from_wire(tensors)
    except DispatchInputError as exc:
        return exc


def assert_same_outcome(got: Any, expected: Any) -> None:
    if isinstance(expected, DispatchInputError):
        assert isinstance(got, DispatchInputError), got
        assert (got.tensor, got.rule, got.code) == (expected.tensor, expected.rule, expected.code)
    else:
        assert not isinstance(got, Exception), got
        assert_same_window(got, expected)


def _set(name: str, at: tuple[int, ...], value: Any) -> Any:
    def change(tensors: Tensors) -> None:
        tensors[name][at] = value

    return change


def _created_in_2100(tensors: Tensors) -> None:
    # within the clock skew of a window stamped one second before 2100: the year 2100 is out
    tensors["WINDOW_FIELDS"][0] = LATEST_TIME - 1
    tensors["ORDER_FIELDS"][:, 4] = LATEST_TIME


def _text_ids(tensors: Tensors) -> None:  # str ids: accepted, encoded as UTF-8
    tensors["ORDER_IDS"] = np.array([i.decode() for i in tensors["ORDER_IDS"]], dtype=object)


def _one_text_row_short(tensors: Tensors) -> None:
    tensors["ORDER_TEXT"] = tensors["ORDER_TEXT"][:-1]


def _order_fields_fp32(tensors: Tensors) -> None:
    tensors["ORDER_FIELDS"] = tensors["ORDER_FIELDS"].astype(np.float32)


def _no_rider_fields(tensors: Tensors) -> None:
    del tensors["RIDER_FIELDS"]


# Each changes one window of a batch: a broken rule (the window's error must be its own,
# named as when it is sent alone) or a window of another kind (answered as when alone).
CHANGES = {
    "nothing": lambda tensors: None,
    "nan pickup without an address": _set("ORDER_FIELDS", (0, 0), np.nan),
    "fraction in a rider's load": _set("RIDER_FIELDS", (0, 2), 1.5),
    "rider capacity above the limit": _set("RIDER_FIELDS", (1, 3), 1001.0),
    "latitude out of range": _set("RIDER_FIELDS", (0, 0), 91.0),
    "promised minutes 0": _set("ORDER_FIELDS", (0, 5), 0.0),
    "unknown constraint bit": _set("ORDER_FIELDS", (0, 6), 1024.0),
    "created far after the window": _set("ORDER_FIELDS", (0, 4), 2_000_000_000.0),
    "created in the year 2100": _created_in_2100,
    "duplicate order id": _set("ORDER_IDS", (1,), b"order-0"),
    "duplicate rider id": _set("RIDER_IDS", (1,), b"rider-0"),
    "empty rider id": _set("RIDER_IDS", (0,), b""),
    "rider id not UTF-8": _set("RIDER_IDS", (0,), b"\xff"),
    "order ids as text": _text_ids,
    "unknown coordinate system": _set("WINDOW_FIELDS", (1,), 7.0),
    "dispatch time with a fraction": _set("WINDOW_FIELDS", (0,), 1.7e9 + 0.5),
    "order text one row short": _one_text_row_short,
    "order fields as FP32": _order_fields_fp32,
    "rider fields missing": _no_rider_fields,
    "addresses": lambda tensors: tensors.update(with_addresses(tensors, [1])),
}


def batch_of_windows(change: str) -> list[Tensors]:
    """Windows of mixed sizes and coordinate systems, the fourth one changed."""
    batch = []
    for seed, (orders, riders) in enumerate([(1, 20), (5, 9), (3, 2), (12, 30), (1, 1), (7, 11)]):
        tensors = wire(seed, orders, riders)
        tensors["ORDER_IDS"] = np.array([f"order-{i}".encode() for i in range(orders)], object)
        tensors["RIDER_IDS"] = np.array([f"rider-{i}".encode() for i in range(riders)], object)
        # the same numbers, read in another datum: windows of one batch may differ
        tensors["WINDOW_FIELDS"][1] = float(list(CoordSystem)[seed % len(CoordSystem)])
        batch.append(tensors)
    CHANGES[change](batch[3])
    return batch


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_window_of_a_batch_gets_what_it_gets_alone(change: str) -> None:
    batch = batch_of_windows(change)
    expected = [alone(tensors) for tensors in batch]
    got = windows_from_wire(batch)
    assert len(got) == len(batch)
    for one, other in zip(got, expected, strict=True):
        assert_same_outcome(one, other)
    broken = isinstance(expected[3], DispatchInputError)
    assert broken != (change in ("nothing", "order ids as text", "addresses")), expected[3]
    assert not any(isinstance(e, Exception) for i, e in enumerate(expected) if i != 3)


def test_a_window_stamped_in_2100_is_refused_even_within_the_clock_skew() -> None:
    """The quick check let created_at == 2100-01-01 through when the window's own time was
    within 300 s of it; the rule by rule check refuses it."""
    tensors = wire()
    _created_in_2100(tensors)
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == "ORDER_FIELDS[created_at]"
    assert caught.value.rule.startswith("must be a unix time in seconds within")


def test_a_batch_window_does_not_alias_its_request() -> None:
    batch = batch_of_windows("nothing")
    before = [{name: np.array(value, copy=True) for name, value in t.items()} for t in batch]
    for window in windows_from_wire(batch):
        assert not isinstance(window, Exception)
        window.pickup[:] = 0.0
        window.rider_load[:] = 0
    for tensors, kept in zip(batch, before, strict=True):
        for name, value in kept.items():
            np.testing.assert_array_equal(tensors[name], value, err_msg=name)
