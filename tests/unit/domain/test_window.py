"""Behaviour of dispatch_service.domain.window: the one gate every request passes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, WINDOW_INPUTS, CoordSystem
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import geo
from dispatch_service.domain.window import (
    EARLIEST_TIME,
    LATEST_TIME,
    MAX_CLOCK_SKEW_S,
    MAX_RIDER_LOAD,
    DispatchWindow,
    WindowLimits,
    parse_objective_weights,
    window_from_tensors,
    window_to_tensors,
)
from dispatch_service.offline.simulator import generate_window

Tensors = dict[str, NDArray[Any]]

NUM_ORDERS = 6
NUM_RIDERS = 9
REQUIRED = tuple(spec.name for spec in WINDOW_INPUTS if not spec.optional)
ORDER_TENSORS = (
    "ORDER_USER_IDS",
    "ORDER_PICKUP",
    "ORDER_DROPOFF",
    "ORDER_CREATED_AT",
    "ORDER_PROMISED_MINUTES",
    "ORDER_CONSTRAINTS",
)
RIDER_TENSORS = (
    "RIDER_POSITION",
    "RIDER_LOAD",
    "RIDER_CAPACITY",
    "RIDER_VEHICLE",
    "RIDER_EQUIPMENT",
)
COORDINATE_TENSORS = ("ORDER_PICKUP", "ORDER_DROPOFF", "RIDER_POSITION")
ID_TENSORS = ("ORDER_IDS", "ORDER_USER_IDS", "RIDER_IDS")


def valid_tensors(seed: int = 0, orders: int = NUM_ORDERS, riders: int = NUM_RIDERS) -> Tensors:
    """Request tensors of a simulated window; every array is a private copy."""
    window = generate_window(np.random.default_rng(seed), orders, riders)
    return {name: np.array(value, copy=True) for name, value in window_to_tensors(window).items()}


def rejection(tensors: Tensors, limits: WindowLimits | None = None) -> DispatchInputError:
    with pytest.raises(DispatchInputError) as info:
        window_from_tensors(tensors, limits)
    return info.value


def assert_rejected(
    tensors: Tensors, tensor: str, *rule_parts: str, limits: WindowLimits | None = None
) -> DispatchInputError:
    error = rejection(tensors, limits)
    assert error.tensor == tensor, str(error)
    assert str(error).startswith(f"{tensor}: ")
    for part in rule_parts:
        assert part in error.rule, f"{part!r} not in {error.rule!r}"
    return error


def ids(*values: bytes | str) -> NDArray[np.object_]:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


# ---- a valid window ------------------------------------------------------------------


def test_a_simulated_window_is_accepted_and_round_trips() -> None:
    original = generate_window(np.random.default_rng(3), NUM_ORDERS, NUM_RIDERS)
    window = window_from_tensors(window_to_tensors(original))

    assert isinstance(window, DispatchWindow)
    assert window.num_orders == NUM_ORDERS
    assert window.num_riders == NUM_RIDERS
    assert window.coord_system is CoordSystem.WGS84
    assert window.dispatch_time == original.dispatch_time
    for name in ("order_ids", "order_user_ids", "rider_ids"):
        assert getattr(window, name).tolist() == getattr(original, name).tolist()
    for name in (
        "pickup",
        "dropoff",
        "created_at",
        "promised_minutes",
        "constraints",
        "rider_position",
        "rider_load",
        "rider_capacity",
        "rider_vehicle",
        "rider_equipment",
    ):
        np.testing.assert_array_equal(getattr(window, name), getattr(original, name), name)

    again = window_to_tensors(window)
    first = window_to_tensors(original)
    assert again.keys() == first.keys()
    for name in first:
        assert again[name].dtype == first[name].dtype, name
        np.testing.assert_array_equal(again[name], first[name], name)


def test_window_has_the_contract_dtypes() -> None:
    window = window_from_tensors(valid_tensors())
    assert window.pickup.dtype == np.float64
    assert window.rider_position.dtype == np.float64
    assert window.created_at.dtype == np.int64
    assert window.promised_minutes.dtype == np.float32
    assert window.constraints.dtype == np.int32
    for name in ("rider_load", "rider_capacity", "rider_vehicle", "rider_equipment"):
        assert getattr(window, name).dtype == np.int32
    assert all(isinstance(value, bytes) for value in window.order_ids.tolist())
    assert isinstance(window.dispatch_time, int)


def test_window_tensors_cover_every_required_input() -> None:
    assert set(valid_tensors()) == set(REQUIRED)


def test_optional_objective_weights_may_be_absent_or_present() -> None:
    tensors = valid_tensors()
    tensors["OBJECTIVE_WEIGHTS"] = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    assert window_from_tensors(tensors).num_orders == NUM_ORDERS


def test_str_and_fixed_width_ids_are_accepted_as_utf8_bytes() -> None:
    tensors = valid_tensors(orders=2)
    tensors["ORDER_IDS"] = np.array(["première", "second"])  # numpy unicode 'U'
    tensors["ORDER_USER_IDS"] = np.array([b"u1", b"u2"])  # numpy bytes 'S'
    window = window_from_tensors(tensors)
    assert window.order_ids.tolist() == ["première".encode(), b"second"]
    assert window.order_user_ids.tolist() == [b"u1", b"u2"]


def test_user_ids_may_repeat() -> None:
    tensors = valid_tensors(orders=3)
    tensors["ORDER_USER_IDS"] = ids(b"same", b"same", b"same")
    assert window_from_tensors(tensors).order_user_ids.tolist() == [b"same"] * 3


def test_a_window_at_the_limits_is_accepted() -> None:
    tensors = valid_tensors(orders=3, riders=4)
    limits = WindowLimits(max_orders=3, max_riders=4, max_id_bytes=64)
    tensors["ORDER_IDS"] = ids("a" * 64, "é" * 32, b"c")  # 64 bytes each for the first two
    window = window_from_tensors(tensors, limits)
    assert (window.num_orders, window.num_riders) == (3, 4)


def test_boundary_values_are_accepted() -> None:
    tensors = valid_tensors(orders=2, riders=2)
    now = int(tensors["DISPATCH_TIME"][0])
    tensors["ORDER_PICKUP"] = np.array([[90.0, 180.0], [-90.0, -180.0]])
    tensors["ORDER_DROPOFF"] = np.array([[0.0, 0.0], [-90.0, 180.0]])
    tensors["ORDER_PROMISED_MINUTES"] = np.array([240.0, 0.01], dtype=np.float32)
    tensors["ORDER_CREATED_AT"] = np.array([now + MAX_CLOCK_SKEW_S, EARLIEST_TIME], dtype=np.int64)
    tensors["ORDER_CONSTRAINTS"] = np.array([15, 0], dtype=np.int32)
    tensors["RIDER_LOAD"] = np.array([0, MAX_RIDER_LOAD], dtype=np.int32)
    tensors["RIDER_CAPACITY"] = np.array([0, MAX_RIDER_LOAD], dtype=np.int32)
    tensors["RIDER_VEHICLE"] = np.array([0, 2], dtype=np.int32)
    tensors["RIDER_EQUIPMENT"] = np.array([0, 1], dtype=np.int32)
    window = window_from_tensors(tensors)
    np.testing.assert_array_equal(window.pickup, tensors["ORDER_PICKUP"])
    assert window.created_at.tolist() == [now + MAX_CLOCK_SKEW_S, EARLIEST_TIME]


# ---- presence, dtype and shape -------------------------------------------------------


@pytest.mark.parametrize("name", REQUIRED)
def test_a_missing_tensor_is_named(name: str) -> None:
    tensors = valid_tensors()
    del tensors[name]
    assert_rejected(tensors, name, "is required but missing")


@pytest.mark.parametrize("name", REQUIRED)
def test_a_tensor_given_as_none_is_missing(name: str) -> None:
    tensors: dict[str, Any] = valid_tensors()
    tensors[name] = None
    assert_rejected(tensors, name, "is required but missing")


WRONG_DTYPES: dict[str, tuple[NDArray[Any], str]] = {
    "ORDER_IDS": (np.arange(NUM_ORDERS, dtype=np.int64), "must be BYTES"),
    "ORDER_USER_IDS": (np.zeros(NUM_ORDERS, dtype=np.float32), "must be BYTES"),
    "RIDER_IDS": (np.arange(NUM_RIDERS, dtype=np.int32), "must be BYTES"),
    "COORD_SYSTEM": (np.array([0], dtype=np.int32), "must be BYTES"),
    "ORDER_PICKUP": (np.zeros((NUM_ORDERS, 2), dtype=np.float32), "must be FP64"),
    "ORDER_DROPOFF": (np.zeros((NUM_ORDERS, 2), dtype=np.int64), "must be FP64"),
    "ORDER_CREATED_AT": (np.zeros(NUM_ORDERS, dtype=np.int32), "must be INT64"),
    "ORDER_PROMISED_MINUTES": (np.ones(NUM_ORDERS, dtype=np.float64), "must be FP32"),
    "ORDER_CONSTRAINTS": (np.zeros(NUM_ORDERS, dtype=np.int64), "must be INT32"),
    "RIDER_POSITION": (np.zeros((NUM_RIDERS, 2), dtype=np.float32), "must be FP64"),
    "RIDER_LOAD": (np.zeros(NUM_RIDERS, dtype=np.int64), "must be INT32"),
    "RIDER_CAPACITY": (np.zeros(NUM_RIDERS, dtype=np.uint32), "must be INT32"),
    "RIDER_VEHICLE": (np.zeros(NUM_RIDERS, dtype=np.int16), "must be INT32"),
    "RIDER_EQUIPMENT": (np.zeros(NUM_RIDERS, dtype=np.bool_), "must be INT32"),
    "DISPATCH_TIME": (np.array([1.7e9], dtype=np.float64), "must be INT64"),
}


@pytest.mark.parametrize("name", sorted(WRONG_DTYPES))
def test_a_wrong_dtype_is_named(name: str) -> None:
    assert set(WRONG_DTYPES) == set(REQUIRED)
    tensors = valid_tensors()
    value, rule = WRONG_DTYPES[name]
    tensors[name] = value
    error = assert_rejected(tensors, name, rule)
    assert str(value.dtype) in error.rule


WRONG_SHAPES: dict[str, tuple[NDArray[Any], str]] = {
    "ORDER_IDS": (ids(*[f"o{i}" for i in range(4)]).reshape(2, 2), "dimension"),
    "ORDER_PICKUP": (np.zeros(NUM_ORDERS, dtype=np.float64), "dimension"),
    "ORDER_DROPOFF": (np.zeros((NUM_ORDERS, 3), dtype=np.float64), "shape [*, 2]"),
    "ORDER_CREATED_AT": (np.zeros((NUM_ORDERS, 1), dtype=np.int64), "dimension"),
    "RIDER_POSITION": (np.zeros((NUM_RIDERS, 1), dtype=np.float64), "shape [*, 2]"),
    "RIDER_LOAD": (np.zeros((NUM_RIDERS, 2), dtype=np.int32), "dimension"),
    "COORD_SYSTEM": (np.array([b"WGS84", b"WGS84"], dtype=object), "shape [1]"),
    "DISPATCH_TIME": (np.array([1_700_000_000, 1_700_000_001], dtype=np.int64), "shape [1]"),
}


@pytest.mark.parametrize("name", sorted(WRONG_SHAPES))
def test_a_wrong_rank_or_shape_is_named(name: str) -> None:
    tensors = valid_tensors()
    value, rule = WRONG_SHAPES[name]
    tensors[name] = value
    error = assert_rejected(tensors, name, rule)
    assert str(value.shape) in error.rule


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COORD_SYSTEM", np.array(b"WGS84", dtype=object)),
        ("DISPATCH_TIME", np.array(1_700_000_000, dtype=np.int64)),
        ("COORD_SYSTEM", np.array([[b"WGS84"]], dtype=object)),
        ("DISPATCH_TIME", np.zeros(0, dtype=np.int64)),
    ],
    ids=["coord-scalar", "time-scalar", "coord-2d", "time-empty"],
)
def test_window_scalars_must_have_shape_one(name: str, value: NDArray[Any]) -> None:
    tensors = valid_tensors()
    tensors[name] = value
    assert_rejected(tensors, name, "[1]")


@pytest.mark.parametrize("name", ORDER_TENSORS)
def test_order_tensors_must_match_the_order_count(name: str) -> None:
    tensors = valid_tensors()
    tensors[name] = tensors[name][:-1]
    assert_rejected(tensors, name, f"must have {NUM_ORDERS} rows like ORDER_IDS", "got 5")


@pytest.mark.parametrize("name", RIDER_TENSORS)
def test_rider_tensors_must_match_the_rider_count(name: str) -> None:
    tensors = valid_tensors()
    tensors[name] = np.concatenate([tensors[name], tensors[name][:1]])
    assert_rejected(
        tensors, name, f"must have {NUM_RIDERS} rows like RIDER_IDS", f"got {NUM_RIDERS + 1}"
    )


# ---- counts --------------------------------------------------------------------------


def test_a_window_without_orders_is_rejected() -> None:
    tensors = valid_tensors()
    tensors["ORDER_IDS"] = ids()
    assert_rejected(tensors, "ORDER_IDS", "between 1 and 1024", "got 0")


def test_a_window_without_riders_is_rejected() -> None:
    tensors = valid_tensors()
    tensors["RIDER_IDS"] = ids()
    assert_rejected(tensors, "RIDER_IDS", "between 1 and 8192", "got 0")


def test_too_many_orders_are_rejected() -> None:
    limits = WindowLimits(max_orders=5, max_riders=100)
    assert window_from_tensors(valid_tensors(orders=5), limits).num_orders == 5
    assert_rejected(valid_tensors(orders=6), "ORDER_IDS", "between 1 and 5", "got 6", limits=limits)


def test_too_many_riders_are_rejected() -> None:
    limits = WindowLimits(max_orders=100, max_riders=7)
    assert window_from_tensors(valid_tensors(riders=7), limits).num_riders == 7
    assert_rejected(valid_tensors(riders=8), "RIDER_IDS", "between 1 and 7", "got 8", limits=limits)


# ---- ids -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ID_TENSORS)
@pytest.mark.parametrize("empty", [b"", ""], ids=["bytes", "str"])
def test_empty_ids_are_rejected(name: str, empty: bytes | str) -> None:
    tensors = valid_tensors()
    tensors[name] = tensors[name].copy()
    tensors[name][2] = empty
    assert_rejected(tensors, name, "must not be empty", "(row 2)")


@pytest.mark.parametrize("name", ID_TENSORS)
@pytest.mark.parametrize(
    ("long_id", "size"),
    [(b"x" * 65, 65), ("y" * 65, 65), ("é" * 33, 66)],
    ids=["bytes", "str", "multibyte-str"],
)
def test_over_long_ids_are_rejected(name: str, long_id: bytes | str, size: int) -> None:
    tensors = valid_tensors()
    tensors[name] = tensors[name].copy()
    tensors[name][1] = long_id
    assert_rejected(tensors, name, "at most 64 bytes", f"row 1 has {size}")


def test_id_limit_comes_from_window_limits() -> None:
    tensors = valid_tensors(orders=2)
    tensors["ORDER_IDS"] = ids(b"abcd", b"abcde")
    limits = WindowLimits(max_id_bytes=4)
    assert_rejected(tensors, "ORDER_IDS", "at most 4 bytes", "row 1 has 5", limits=limits)


@pytest.mark.parametrize("name", ["ORDER_IDS", "RIDER_IDS"])
def test_duplicate_ids_are_rejected(name: str) -> None:
    tensors = valid_tensors()
    tensors[name] = tensors[name].copy()
    tensors[name][4] = tensors[name][1]
    assert_rejected(tensors, name, "ids must be unique", "row 4 repeats row 1")


def test_a_str_id_and_the_same_bytes_id_are_duplicates() -> None:
    tensors = valid_tensors(orders=2)
    tensors["ORDER_IDS"] = ids("order-1", b"order-1")
    assert_rejected(tensors, "ORDER_IDS", "must be unique", "row 1 repeats row 0")


@pytest.mark.parametrize(("items", "row"), [([1, 2], 0), ([b"a", None], 1)], ids=["ints", "none"])
def test_ids_that_are_neither_bytes_nor_str_are_rejected(items: list[Any], row: int) -> None:
    tensors = valid_tensors(orders=2)
    order_ids = np.empty(2, dtype=object)
    order_ids[:] = items
    tensors["ORDER_IDS"] = order_ids
    assert_rejected(tensors, "ORDER_IDS", f"ids must be bytes or text (row {row})")


# ---- values --------------------------------------------------------------------------


@pytest.mark.parametrize("name", COORDINATE_TENSORS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("column", [0, 1], ids=["lat", "lon"])
def test_coordinates_must_be_finite(name: str, bad: float, column: int) -> None:
    tensors = valid_tensors()
    tensors[name][3, column] = bad
    assert_rejected(tensors, name, "must be finite", "(row 3)")


@pytest.mark.parametrize("name", COORDINATE_TENSORS)
@pytest.mark.parametrize("lat", [90.0001, -91.0])
def test_latitude_must_be_in_range(name: str, lat: float) -> None:
    tensors = valid_tensors()
    tensors[name][2, 0] = lat
    assert_rejected(tensors, name, "latitude must be within [-90.0, 90.0] (row 2)")


@pytest.mark.parametrize("name", COORDINATE_TENSORS)
@pytest.mark.parametrize("lon", [180.5, -200.0])
def test_longitude_must_be_in_range(name: str, lon: float) -> None:
    tensors = valid_tensors()
    tensors[name][1, 1] = lon
    assert_rejected(tensors, name, "longitude must be within [-180.0, 180.0] (row 1)")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_promised_minutes_must_be_finite(bad: float) -> None:
    tensors = valid_tensors()
    tensors["ORDER_PROMISED_MINUTES"][4] = bad
    assert_rejected(tensors, "ORDER_PROMISED_MINUTES", "must be finite", "(row 4)")


@pytest.mark.parametrize("minutes", [0.0, -5.0, 240.01, 1000.0])
def test_promised_minutes_must_be_in_range(minutes: float) -> None:
    tensors = valid_tensors()
    tensors["ORDER_PROMISED_MINUTES"][2] = minutes
    assert_rejected(tensors, "ORDER_PROMISED_MINUTES", "must be within (0, 240] minutes (row 2)")


def test_created_at_may_not_be_far_after_the_dispatch_time() -> None:
    tensors = valid_tensors()
    now = int(tensors["DISPATCH_TIME"][0])
    tensors["ORDER_CREATED_AT"][3] = now + MAX_CLOCK_SKEW_S + 1
    assert_rejected(
        tensors, "ORDER_CREATED_AT", f"not be more than {MAX_CLOCK_SKEW_S} s after", "(row 3)"
    )


@pytest.mark.parametrize("when", [-1, 0, EARLIEST_TIME - 1])
def test_created_at_must_lie_after_2000(when: int) -> None:
    tensors = valid_tensors()
    tensors["ORDER_CREATED_AT"][1] = when
    assert_rejected(tensors, "ORDER_CREATED_AT", "within [946684800, 4102444800)", "row 1")


@pytest.mark.parametrize("bits", [16, 1 << 30, -1, 15 | 32])
def test_unknown_constraint_bits_are_rejected(bits: int) -> None:
    tensors = valid_tensors()
    tensors["ORDER_CONSTRAINTS"][5] = bits
    assert_rejected(tensors, "ORDER_CONSTRAINTS", "only bits 0xf are defined (row 5)")


def test_rider_equipment_must_not_be_negative() -> None:
    tensors = valid_tensors()
    tensors["RIDER_EQUIPMENT"][6] = -2
    assert_rejected(tensors, "RIDER_EQUIPMENT", "must be >= 0", "(row 6)")


@pytest.mark.parametrize("name", ["RIDER_LOAD", "RIDER_CAPACITY"])
@pytest.mark.parametrize("value", [-2, MAX_RIDER_LOAD + 1, 2**31 - 1, -(2**31)])
def test_rider_load_and_capacity_must_be_plausible(name: str, value: int) -> None:
    # -4294967295 sent over HTTP JSON arrives wrapped as 1; a bound catches what still looks
    # like a number, the wrap itself only a patched Triton's parser refuses.
    tensors = valid_tensors()
    tensors[name][6] = value
    assert_rejected(tensors, name, f"must be within [0, {MAX_RIDER_LOAD}]", "(row 6)")


@pytest.mark.parametrize("vehicle", [-1, 3, 99])
def test_unknown_vehicles_are_rejected(vehicle: int) -> None:
    tensors = valid_tensors()
    tensors["RIDER_VEHICLE"][7] = vehicle
    assert_rejected(tensors, "RIDER_VEHICLE", "must be 0 (e-bike), 1 (motorbike) or 2 (car)")


@pytest.mark.parametrize(
    "when", [0, -1_700_000_000, EARLIEST_TIME - 1, LATEST_TIME, 2**63 - 1, -(2**63)]
)
def test_dispatch_time_must_lie_in_this_century(when: int) -> None:
    tensors = valid_tensors()
    tensors["DISPATCH_TIME"] = np.array([when], dtype=np.int64)
    assert_rejected(tensors, "DISPATCH_TIME", "unix time in seconds within", "2000-01-01")


def test_the_century_bounds_are_the_dates_they_name() -> None:
    import datetime as dt

    utc = dt.UTC
    assert dt.datetime.fromtimestamp(EARLIEST_TIME, utc) == dt.datetime(2000, 1, 1, tzinfo=utc)
    assert dt.datetime.fromtimestamp(LATEST_TIME, utc) == dt.datetime(2100, 1, 1, tzinfo=utc)


@pytest.mark.parametrize("name", ["ORDER_IDS", "ORDER_USER_IDS", "RIDER_IDS"])
@pytest.mark.parametrize(
    "bad", [b"\xff", b"ok\xc3", b"\xc3(", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]
)
def test_ids_must_be_valid_utf8(name: str, bad: bytes) -> None:
    tensors = valid_tensors()
    tensors[name] = tensors[name].copy()
    tensors[name][3] = bad
    assert_rejected(tensors, name, "ids must be valid UTF-8, row 3")


def test_utf8_split_across_two_ids_is_still_refused() -> None:
    # Each half is invalid alone; joined they would be "é": the check must see ids apart.
    tensors = valid_tensors()
    tensors["RIDER_IDS"] = tensors["RIDER_IDS"].copy()
    tensors["RIDER_IDS"][0], tensors["RIDER_IDS"][1] = b"a\xc3", b"\xa9b"
    assert_rejected(tensors, "RIDER_IDS", "ids must be valid UTF-8, row 0")


def test_multibyte_utf8_ids_are_accepted() -> None:
    tensors = valid_tensors()
    tensors["RIDER_IDS"] = tensors["RIDER_IDS"].copy()
    tensors["RIDER_IDS"][0] = "骑手-7".encode()
    tensors["RIDER_IDS"][1] = "🚲".encode()
    window = window_from_tensors(tensors)
    assert window.rider_ids[0].decode() == "骑手-7"


# ---- coordinate systems --------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [b"UTM", "WGS 84", b"", "EPSG:4326"], ids=["utm", "space", "empty", "epsg"]
)
def test_unknown_coordinate_systems_are_rejected(value: bytes | str) -> None:
    tensors = valid_tensors()
    tensors["COORD_SYSTEM"] = ids(value)
    assert_rejected(tensors, "COORD_SYSTEM", "must be one of WGS84, GCJ02, BD09")


@pytest.mark.parametrize(
    ("spelling", "system"),
    [
        ("wgs84", CoordSystem.WGS84),
        ("GCJ-02", CoordSystem.GCJ02),
        (b"BD09", CoordSystem.BD09),
        (b" gcj02 ", CoordSystem.GCJ02),
        ("bd-09", CoordSystem.BD09),
    ],
)
def test_coordinate_system_spellings(spelling: bytes | str, system: CoordSystem) -> None:
    tensors = valid_tensors()
    tensors["COORD_SYSTEM"] = ids(spelling)
    assert window_from_tensors(tensors).coord_system is system


def test_fixed_width_coordinate_system_arrays_are_accepted() -> None:
    tensors = valid_tensors()
    tensors["COORD_SYSTEM"] = np.array([b"GCJ02"])
    assert window_from_tensors(tensors).coord_system is CoordSystem.GCJ02
    tensors["COORD_SYSTEM"] = np.array(["bd09"])
    assert window_from_tensors(tensors).coord_system is CoordSystem.BD09


@pytest.mark.parametrize("system", [CoordSystem.GCJ02, CoordSystem.BD09])
def test_chinese_datums_are_converted_to_wgs84(system: CoordSystem) -> None:
    tensors = valid_tensors()
    tensors["COORD_SYSTEM"] = ids(system.name.encode())
    window = window_from_tensors(tensors)

    assert window.coord_system is system
    for name, field in [
        ("ORDER_PICKUP", "pickup"),
        ("ORDER_DROPOFF", "dropoff"),
        ("RIDER_POSITION", "rider_position"),
    ]:
        converted = getattr(window, field)
        np.testing.assert_array_equal(converted, geo.to_wgs84(tensors[name], system))
        # Shanghai is inside mainland China, so the datums differ by hundreds of metres.
        assert np.abs(converted - tensors[name]).max() > 1e-3


def test_wgs84_coordinates_pass_through_unchanged() -> None:
    tensors = valid_tensors()
    window = window_from_tensors(tensors)
    np.testing.assert_array_equal(window.pickup, tensors["ORDER_PICKUP"])
    np.testing.assert_array_equal(window.rider_position, tensors["RIDER_POSITION"])


def test_round_trip_of_a_converted_window_is_labelled_wgs84() -> None:
    original = valid_tensors()
    gcj = dict(original)
    gcj["COORD_SYSTEM"] = ids(b"GCJ02")
    gcj["ORDER_PICKUP"] = geo.from_wgs84(original["ORDER_PICKUP"], CoordSystem.GCJ02)
    resent = window_to_tensors(window_from_tensors(gcj))
    assert resent["COORD_SYSTEM"].tolist() == [b"WGS84"]
    np.testing.assert_allclose(resent["ORDER_PICKUP"], original["ORDER_PICKUP"], atol=1e-6)


def test_the_input_arrays_are_not_modified() -> None:
    tensors = valid_tensors()
    tensors["COORD_SYSTEM"] = ids(b"BD09")
    before = {name: value.copy() for name, value in tensors.items()}
    window_from_tensors(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, before[name], name)


# ---- objective weights ---------------------------------------------------------------


def test_default_objective_weights_when_absent() -> None:
    weights = parse_objective_weights(None)
    assert weights.dtype == np.float64
    np.testing.assert_array_equal(weights, np.asarray(DEFAULT_OBJECTIVE_WEIGHTS))


def test_given_objective_weights_are_returned_as_float64() -> None:
    weights = parse_objective_weights(np.array([0.0, 2.0, 1.0], dtype=np.float32))
    assert weights.dtype == np.float64
    assert weights.tolist() == [0.0, 2.0, 1.0]


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (np.array([0.4, 0.4, 0.2], dtype=np.float64), "must be FP32, got float64"),
        (np.array([1, 1, 1], dtype=np.int32), "must be FP32, got int32"),
        (np.array([0.5, 0.5], dtype=np.float32), "must have shape [3], got (2,)"),
        (np.array([[0.4, 0.4, 0.2]], dtype=np.float32), "must have shape [3], got (1, 3)"),
        (np.array([0.4, np.nan, 0.2], dtype=np.float32), "must be finite"),
        (np.array([0.4, np.inf, 0.2], dtype=np.float32), "must be finite"),
        (np.array([0.4, -np.inf, 0.2], dtype=np.float32), "must be finite"),
        (np.array([-0.0, 0.0, 0.0], dtype=np.float32), "must be >= 0 with a positive sum"),
        (np.array([0.6, -0.1, 0.5], dtype=np.float32), "must be >= 0 with a positive sum"),
        (np.array([0.0, 0.0, 0.0], dtype=np.float32), "must be >= 0 with a positive sum"),
    ],
    ids=["fp64", "int32", "short", "2d", "nan", "inf", "-inf", "-zero-sum", "negative", "zero-sum"],
)
def test_bad_objective_weights_are_rejected(value: NDArray[Any], rule: str) -> None:
    with pytest.raises(DispatchInputError) as info:
        parse_objective_weights(value)
    assert info.value.tensor == "OBJECTIVE_WEIGHTS"
    assert rule in info.value.rule


def test_the_first_broken_rule_is_reported_when_several_are() -> None:
    # Good windows skip the rule-by-rule pass; a bad one still reports rules in order.
    tensors = valid_tensors()
    tensors["RIDER_VEHICLE"][0] = 7
    tensors["ORDER_CREATED_AT"][2] = -1
    assert_rejected(tensors, "ORDER_CREATED_AT", "within [946684800", "row 2")
    tensors["ORDER_DROPOFF"][4, 1] = np.nan
    tensors["ORDER_DROPOFF"][1, 0] = 95.0
    assert_rejected(tensors, "ORDER_DROPOFF", "must be finite", "(row 4)")


def test_window_ids_are_copies_of_the_input() -> None:
    tensors = valid_tensors()
    window = window_from_tensors(tensors)
    assert window.rider_ids is not tensors["RIDER_IDS"]
    assert window.rider_ids.dtype == object and window.rider_ids.shape == tensors["RIDER_IDS"].shape
    tensors["RIDER_IDS"][0] = b"changed"
    assert window.rider_ids[0] != b"changed"


# ---- the one objective-weights rule ----------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "code"),
    [
        ([1.0, 1.0], "shape"),
        ([np.nan, 1.0, 1.0], "not_finite"),
        ([np.inf, 1.0, 1.0], "not_finite"),
        ([-0.5, 1.0, 1.0], "range"),
        ([0.0, 0.0, 0.0], "range"),
    ],
)
def test_wire_and_resolver_judge_weights_by_the_same_rule(weights: list[float], code: str) -> None:
    from dispatch_service.domain.scoring import score_pairs

    with pytest.raises(DispatchInputError) as wire:
        parse_objective_weights(np.asarray(weights, dtype=np.float32))
    with pytest.raises(DispatchInputError) as direct:
        score_pairs(np.ones((2, 3)), np.asarray(weights, dtype=np.float64))
    assert wire.value.tensor == direct.value.tensor == "OBJECTIVE_WEIGHTS"
    assert wire.value.code == direct.value.code == code
    assert wire.value.rule == direct.value.rule


def test_good_weights_pass_unchanged() -> None:
    assert parse_objective_weights(np.array([0.0, 0.0, 2.0], np.float32)).tolist() == [0, 0, 2]
    assert parse_objective_weights(None).tolist() == list(DEFAULT_OBJECTIVE_WEIGHTS)
