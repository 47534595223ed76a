"""A dispatch window: validated, typed, in WGS-84.

`window_from_tensors` is the one gate every request passes: it checks each rule of the
contract and names the tensor and the rule when one is broken. Downstream code may
assume a `DispatchWindow` is well formed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    DEFAULT_OBJECTIVE_WEIGHTS,
    KNOWN_CONSTRAINTS,
    MAX_ADDRESS_BYTES,
    MAX_CITY_BYTES,
    MAX_ID_BYTES,
    MAX_ORDERS,
    MAX_RIDERS,
    OBJECTIVES,
    ORDER_FIELD_COLUMNS,
    ORDER_FIELD_SOURCES,
    ORDER_FIELDS,
    ORDER_TEXT,
    ORDER_TEXT_COLUMNS,
    ORDER_TEXT_SOURCES,
    RIDER_FIELD_COLUMNS,
    RIDER_FIELD_SOURCES,
    RIDER_FIELDS,
    WINDOW_FIELD_COLUMNS,
    WINDOW_FIELDS,
    WINDOW_INPUTS,
    CoordSystem,
    TensorSpec,
    Vehicle,
    pack_window,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import geo

__all__ = [
    "EARLIEST_TIME",
    "LATEST_TIME",
    "MAX_CLOCK_SKEW_S",
    "MAX_PROMISED_MINUTES",
    "MAX_RIDER_LOAD",
    "USER_IDS_FIELD",
    "Counts",
    "DispatchWindow",
    "Values",
    "WindowLimits",
    "check_id_text",
    "check_objective_weights",
    "check_rider_counts",
    "check_times",
    "decode_text",
    "order_created_at_from_wire",
    "order_text_from_wire",
    "parse_coord_system",
    "parse_objective_weights",
    "rider_counts_from_wire",
    "user_ids_from_wire",
    "window_from_tensors",
    "window_from_wire",
    "window_tensors_from_wire",
    "window_to_tensors",
    "window_to_wire",
    "windows_from_wire",
    "wire_field",
    "wire_name",
]

MAX_PROMISED_MINUTES = 240.0
# Orders may be stamped a little after the window's time by a skewed clock; not more.
MAX_CLOCK_SKEW_S = 300
# Plausible bounds (issue 10): a rider's load and capacity (orders) and every timestamp.
# Larger values are typing errors or wrapped integers (HTTP JSON wraps INT32 silently).
MAX_RIDER_LOAD = 1000
EARLIEST_TIME = 946_684_800  # 2000-01-01T00:00:00Z
LATEST_TIME = 4_102_444_800  # 2100-01-01T00:00:00Z


@dataclass(frozen=True)
class WindowLimits:
    max_orders: int = MAX_ORDERS
    max_riders: int = MAX_RIDERS
    max_id_bytes: int = MAX_ID_BYTES

    def __post_init__(self) -> None:
        # Above the contract's limits a window would not fit dispatch_model's batch.
        for name, value, ceiling in (
            ("max_orders", self.max_orders, MAX_ORDERS),
            ("max_riders", self.max_riders, MAX_RIDERS),
            ("max_id_bytes", self.max_id_bytes, MAX_ID_BYTES),
        ):
            if not 1 <= value <= ceiling:
                raise ValueError(f"{name} must be within [1, {ceiling}], got {value}")


@dataclass(frozen=True)
class DispatchWindow:
    """B orders and R riders; coordinates already converted to WGS-84 [lat, lon]."""

    order_ids: NDArray[np.object_]
    order_user_ids: NDArray[np.object_]
    pickup: NDArray[np.float64]
    dropoff: NDArray[np.float64]
    created_at: NDArray[np.int64]
    promised_minutes: NDArray[np.float32]
    constraints: NDArray[np.int32]
    rider_ids: NDArray[np.object_]
    rider_position: NDArray[np.float64]
    rider_load: NDArray[np.int32]
    rider_capacity: NDArray[np.int32]
    rider_vehicle: NDArray[np.int32]
    rider_equipment: NDArray[np.int32]
    dispatch_time: int
    coord_system: CoordSystem = CoordSystem.WGS84
    # Per order, UTF-8 bytes (b"" = not given); None when the request sent no such column.
    # A pickup / drop-off row that is NaN has its address: the encoder geocodes it.
    pickup_address: NDArray[np.object_] | None = None
    dropoff_address: NDArray[np.object_] | None = None
    city: NDArray[np.object_] | None = None

    @property
    def num_orders(self) -> int:
        return int(self.order_ids.shape[0])

    @property
    def needs_geocoding(self) -> bool:
        """True when some pickup or drop-off came as an address instead of coordinates."""
        return bool(np.isnan(self.pickup).any() or np.isnan(self.dropoff).any())

    @property
    def num_riders(self) -> int:
        return int(self.rider_ids.shape[0])


_SPECS = {spec.name: spec for spec in WINDOW_INPUTS}
# Per tensor: the spec, its numpy dtype (None for BYTES) and its fixed (axis, size) dims,
# looked up once here rather than on every request.
_FETCH = {
    spec.name: (
        spec,
        None if spec.triton_dtype == "BYTES" else spec.numpy_dtype,
        tuple((axis, dim) for axis, dim in enumerate(spec.dims) if dim != -1),
    )
    for spec in WINDOW_INPUTS
}
_LATLON_LIMITS = np.array([90.0, 180.0])


def _fetch(tensors: Mapping[str, Any], name: str) -> NDArray[Any]:
    spec, dtype, fixed = _FETCH[name]
    value = tensors.get(name)
    if value is None:
        raise DispatchInputError(name, "is required but missing", "missing")
    array = np.asarray(value)
    if dtype is None or array.dtype != dtype:
        _check_dtype(spec, array)
    if array.ndim != len(spec.dims):
        raise DispatchInputError(
            name,
            f"must have {len(spec.dims)} dimension(s) {_dims(spec)}, got shape {array.shape}",
            "shape",
        )
    for axis, dim in fixed:
        if array.shape[axis] != dim:
            raise DispatchInputError(
                name, f"must have shape {_dims(spec)}, got {array.shape}", "shape"
            )
    return array


def _dims(spec: TensorSpec) -> str:
    return "[" + ", ".join("*" if d == -1 else str(d) for d in spec.dims) + "]"


def _check_dtype(spec: TensorSpec, array: NDArray[Any]) -> None:
    if spec.triton_dtype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise DispatchInputError(spec.name, f"must be BYTES, got {array.dtype}", "dtype")
        return
    if array.dtype != spec.numpy_dtype:
        raise DispatchInputError(
            spec.name, f"must be {spec.triton_dtype}, got {array.dtype}", "dtype"
        )


def _ids(tensors: Mapping[str, Any], name: str, max_bytes: int) -> NDArray[np.object_]:
    raw = _fetch(tensors, name)
    items = raw.tolist()
    taken = _taken_as_sent(items, 1, max_bytes)
    if taken is not None:
        return taken
    out = np.empty(raw.shape[0], dtype=object)
    for i, item in enumerate(items):
        if not isinstance(item, str | bytes):
            raise DispatchInputError(name, f"ids must be bytes or text (row {i})", "dtype")
        value = item.encode("utf-8") if isinstance(item, str) else item
        if not value:
            raise DispatchInputError(name, f"ids must not be empty (row {i})", "id_length")
        if len(value) > max_bytes:
            raise DispatchInputError(
                name,
                f"ids must be at most {max_bytes} bytes, row {i} has {len(value)}",
                "id_length",
            )
        check_id_text(name, i, value)
        out[i] = value
    return out


def _taken_as_sent(items: list[Any], min_bytes: int, max_bytes: int) -> NDArray[np.object_] | None:
    """The usual request: UTF-8 bytes of [min_bytes, max_bytes] each, taken as they are (as
    an object array); None when an item needs the checks one by one."""
    if not all(type(item) is bytes for item in items):
        return None
    lengths = list(map(len, items))
    if lengths and (min(lengths) < min_bytes or max(lengths) > max_bytes):
        return None
    if not _all_utf8(items):
        return None
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _all_utf8(items: list[bytes]) -> bool:
    """True when every id is valid UTF-8: one decode of the ids joined by NUL (a byte no
    multi-byte sequence can end or continue with, so no sequence spans two ids)."""
    try:
        b"\0".join(items).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_id_text(name: str, row: int, value: bytes) -> None:
    """Ids are text: valid UTF-8, or an HTTP JSON answer carrying them is not valid JSON."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DispatchInputError(
            name, f"ids must be valid UTF-8, row {row} is not (byte {exc.start})", "dtype"
        ) from None


def decode_text(name: str, row: int, value: str | bytes, limit: int) -> str:
    """The rule for free text (addresses, cities): UTF-8 of at most ``limit`` bytes."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
    elif isinstance(value, bytes):
        data = value
    else:
        raise DispatchInputError(name, f"must be bytes or text (row {row})", "dtype")
    if len(data) > limit:
        raise DispatchInputError(
            name, f"must be at most {limit} bytes of UTF-8, row {row} has {len(data)}", "id_length"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DispatchInputError(
            name, f"must be valid UTF-8, row {row} is not (byte {exc.start})", "dtype"
        ) from None


def _texts(
    tensors: Mapping[str, Any], name: str, limit: int, rows: int
) -> NDArray[np.object_] | None:
    """An optional text column as UTF-8 bytes (b"" = not given); None when absent."""
    if tensors.get(name) is None:
        return None
    raw = _fetch(tensors, name)
    if raw.shape[0] != rows:
        raise DispatchInputError(
            name, f"must have {rows} rows like ORDER_IDS, got {raw.shape[0]}", "shape"
        )
    items = raw.tolist()
    taken = _taken_as_sent(items, 0, limit)
    if taken is not None:
        return taken
    out = np.empty(rows, dtype=object)
    for i, item in enumerate(items):
        out[i] = decode_text(name, i, item, limit).encode("utf-8")
    return out


def _located(
    name: str,
    points: NDArray[np.float64],
    addresses: NDArray[np.object_] | None,
    address_name: str,
) -> NDArray[np.float64]:
    """``points`` with the rows to be geocoded (both NaN, address given) set to 0 for the
    value checks; a NaN row without an address is refused here, naming both fields."""
    if points.ndim != 2 or not np.isnan(points).any():
        return points
    missing = np.isnan(points).all(axis=1)
    if not missing.any():
        return points  # half-NaN rows: `_latlon` refuses them as not finite
    given = (
        np.zeros(missing.shape, dtype=bool)
        if addresses is None
        else np.array([len(a) > 0 for a in addresses.tolist()], dtype=bool)
    )
    bare = missing & ~given
    if bare.any():
        row = int(np.argmax(bare))
        raise DispatchInputError(
            name,
            f"is NaN in row {row}, which has no {address_name}: give coordinates or an address",
            "missing",
        )
    checked = points.copy()
    checked[missing] = 0.0
    return checked


def _finite(name: str, array: NDArray[Any]) -> None:
    bad = ~np.isfinite(array)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise DispatchInputError(
            name, f"must be finite, got NaN or infinity (row {row})", "not_finite"
        )


def _in_range(name: str, array: NDArray[Any], low: float, high: float, what: str) -> None:
    bad = (array < low) | (array > high)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise DispatchInputError(
            name, f"{what} must be within [{low}, {high}] (row {row})", "range"
        )


def _latlon(name: str, array: NDArray[np.float64]) -> None:
    _finite(name, array)
    _in_range(name, array[:, 0], -90.0, 90.0, "latitude")
    _in_range(name, array[:, 1], -180.0, 180.0, "longitude")


def _at_least(name: str, array: NDArray[Any], low: int) -> None:
    bad = array < low
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise DispatchInputError(name, f"must be >= {low} (row {row})", "range")


def _distinct(ids: NDArray[np.object_]) -> bool:
    values = ids.tolist()
    return len(set(values)) == len(values)


def _unique(name: str, ids: NDArray[np.object_]) -> None:
    if _distinct(ids):
        return
    seen: dict[bytes, int] = {}
    for i, value in enumerate(ids.tolist()):
        if value in seen:
            raise DispatchInputError(
                name, f"ids must be unique, row {i} repeats row {seen[value]}", "unique"
            )
        seen[value] = i


def _count(name: str, n: int, limit: int) -> None:
    if n < 1 or n > limit:
        raise DispatchInputError(name, f"must hold between 1 and {limit} entries, got {n}", "count")


def _same_length(names: tuple[str, ...], arrays: tuple[NDArray[Any], ...], n: int) -> None:
    for name, array in zip(names, arrays, strict=True):
        if array.shape[0] != n:
            raise DispatchInputError(
                name, f"must have {n} rows like {names[0]}, got {array.shape[0]}", "shape"
            )


def parse_coord_system(value: Any) -> CoordSystem:
    raw = np.asarray(value).reshape(-1)
    text = raw[0]
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    key = str(text).strip().upper().replace("-", "")
    try:
        return CoordSystem[key]
    except KeyError:
        allowed = ", ".join(c.name for c in CoordSystem)
        raise DispatchInputError(
            "COORD_SYSTEM", f"must be one of {allowed}", "unknown_value"
        ) from None


def parse_objective_weights(value: Any | None) -> NDArray[np.float64]:
    """Per-request weights (latency, on-time, cost); the defaults when absent."""
    if value is None:
        return np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float64)
    weights = np.asarray(value)
    if weights.dtype != np.float32:
        raise DispatchInputError("OBJECTIVE_WEIGHTS", f"must be FP32, got {weights.dtype}", "dtype")
    return check_objective_weights(weights.astype(np.float64))


def check_objective_weights(weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """The one rule for objective weights: shape [3], finite, >= 0, with a positive sum.

    `parse_objective_weights` (the wire) and the resolver both apply it, so a request and a
    direct library call are judged alike. Returns ``weights`` unchanged.
    """
    if weights.shape != (len(OBJECTIVES),):
        raise DispatchInputError(
            "OBJECTIVE_WEIGHTS",
            f"must have shape [{len(OBJECTIVES)}], got {weights.shape}",
            "shape",
        )
    _finite("OBJECTIVE_WEIGHTS", weights)
    if (weights < 0).any() or float(weights.sum()) <= 0.0:
        raise DispatchInputError(
            "OBJECTIVE_WEIGHTS", "weights must be >= 0 with a positive sum", "range"
        )
    return weights


Values = tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]
Counts = tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]]


def _values_plausible(
    values: Values, counts: Counts, dispatch_time: int | NDArray[np.int64]
) -> bool:
    """One cheap pass that is True only if every rule of `_check_values` holds.

    A good request (nearly all of them) costs a handful of numpy calls; a bad one is
    then checked rule by rule, so the first broken rule is still the one reported.
    ``dispatch_time``: the window's, or per order (the orders of several windows at once).
    """
    pickup, dropoff, position, promised, created_at, constraints = values
    load, capacity, equipment, vehicle = counts
    return bool(
        (np.abs(pickup) <= _LATLON_LIMITS).all()  # also False for NaN and infinity
        and (np.abs(dropoff) <= _LATLON_LIMITS).all()
        and (np.abs(position) <= _LATLON_LIMITS).all()
        and ((promised > 0) & (promised <= MAX_PROMISED_MINUTES)).all()
        and int(created_at.min()) >= EARLIEST_TIME
        and int(created_at.max()) < LATEST_TIME  # check_times' bound: the year 2100 is out
        and (created_at <= dispatch_time + MAX_CLOCK_SKEW_S).all()
        and not (constraints & ~KNOWN_CONSTRAINTS).any()  # a negative value has high bits
        and min(int(load.min()), int(capacity.min()), int(equipment.min()), int(vehicle.min())) >= 0
        and max(int(load.max()), int(capacity.max())) <= MAX_RIDER_LOAD
        and int(vehicle.max()) <= max(Vehicle)
    )


def check_times(name: str, seconds: NDArray[Any]) -> None:
    """Unix times must lie within [2000-01-01, 2100-01-01) (INT64_MAX was served)."""
    bad = (seconds < EARLIEST_TIME) | (seconds >= LATEST_TIME)
    if bad.any():
        row = int(np.argmax(bad))
        raise DispatchInputError(
            name,
            f"must be a unix time in seconds within [{EARLIEST_TIME}, {LATEST_TIME}) "
            f"(2000-01-01 to 2100-01-01), row {row} is {int(seconds.reshape(-1)[row])}",
            "range",
        )


def check_rider_counts(name: str, counts: NDArray[Any]) -> None:
    """A rider's load or capacity (orders) must lie within [0, MAX_RIDER_LOAD]."""
    bad = (counts < 0) | (counts > MAX_RIDER_LOAD)
    if bad.any():
        row = int(np.argmax(bad))
        raise DispatchInputError(name, f"must be within [0, {MAX_RIDER_LOAD}] (row {row})", "range")


def _check_values(values: Values, counts: Counts, dispatch_time: int) -> None:
    """Every value rule in turn; raises DispatchInputError naming the first one broken."""
    pickup, dropoff, position, promised, created_at, constraints = values
    load, capacity, equipment, vehicle = counts
    _latlon("ORDER_PICKUP", pickup)
    _latlon("ORDER_DROPOFF", dropoff)
    _latlon("RIDER_POSITION", position)
    _finite("ORDER_PROMISED_MINUTES", promised)
    bad_promise = (promised <= 0) | (promised > MAX_PROMISED_MINUTES)
    if bad_promise.any():
        row = int(np.argmax(bad_promise))
        raise DispatchInputError(
            "ORDER_PROMISED_MINUTES",
            f"must be within (0, {MAX_PROMISED_MINUTES:g}] minutes (row {row})",
            "range",
        )
    check_times("ORDER_CREATED_AT", created_at)
    late = created_at > dispatch_time + MAX_CLOCK_SKEW_S
    if late.any():
        row = int(np.argmax(late))
        raise DispatchInputError(
            "ORDER_CREATED_AT",
            f"must not be more than {MAX_CLOCK_SKEW_S} s after DISPATCH_TIME (row {row})",
            "range",
        )
    unknown = (constraints < 0) | ((constraints & ~KNOWN_CONSTRAINTS) != 0)
    if unknown.any():
        row = int(np.argmax(unknown))
        raise DispatchInputError(
            "ORDER_CONSTRAINTS",
            f"only bits {KNOWN_CONSTRAINTS:#x} are defined (row {row})",
            "unknown_value",
        )
    check_rider_counts("RIDER_LOAD", load)
    check_rider_counts("RIDER_CAPACITY", capacity)
    _at_least("RIDER_EQUIPMENT", equipment, 0)
    bad_vehicle = (vehicle < 0) | (vehicle > max(Vehicle))
    if bad_vehicle.any():
        row = int(np.argmax(bad_vehicle))
        raise DispatchInputError(
            "RIDER_VEHICLE",
            f"must be 0 (e-bike), 1 (motorbike) or 2 (car) (row {row})",
            "unknown_value",
        )


def window_from_tensors(
    tensors: Mapping[str, Any], limits: WindowLimits | None = None
) -> DispatchWindow:
    """Validate raw request tensors and build a WGS-84 window (or raise DispatchInputError)."""
    limits = limits or WindowLimits()
    order_ids = _ids(tensors, "ORDER_IDS", limits.max_id_bytes)
    num_orders = order_ids.shape[0]
    _count("ORDER_IDS", num_orders, limits.max_orders)
    user_ids = _ids(tensors, "ORDER_USER_IDS", limits.max_id_bytes)
    pickup = _fetch(tensors, "ORDER_PICKUP")
    dropoff = _fetch(tensors, "ORDER_DROPOFF")
    created_at = _fetch(tensors, "ORDER_CREATED_AT")
    promised = _fetch(tensors, "ORDER_PROMISED_MINUTES")
    constraints = _fetch(tensors, "ORDER_CONSTRAINTS")
    order_names = (
        "ORDER_IDS",
        "ORDER_USER_IDS",
        "ORDER_PICKUP",
        "ORDER_DROPOFF",
        "ORDER_CREATED_AT",
        "ORDER_PROMISED_MINUTES",
        "ORDER_CONSTRAINTS",
    )
    _same_length(
        order_names,
        (order_ids, user_ids, pickup, dropoff, created_at, promised, constraints),
        num_orders,
    )
    pickup_address = _texts(tensors, "ORDER_PICKUP_ADDRESS", MAX_ADDRESS_BYTES, num_orders)
    dropoff_address = _texts(tensors, "ORDER_DROPOFF_ADDRESS", MAX_ADDRESS_BYTES, num_orders)
    city = _texts(tensors, "ORDER_CITY", MAX_CITY_BYTES, num_orders)

    rider_ids = _ids(tensors, "RIDER_IDS", limits.max_id_bytes)
    num_riders = rider_ids.shape[0]
    _count("RIDER_IDS", num_riders, limits.max_riders)
    position = _fetch(tensors, "RIDER_POSITION")
    load = _fetch(tensors, "RIDER_LOAD")
    capacity = _fetch(tensors, "RIDER_CAPACITY")
    vehicle = _fetch(tensors, "RIDER_VEHICLE")
    equipment = _fetch(tensors, "RIDER_EQUIPMENT")
    rider_names = (
        "RIDER_IDS",
        "RIDER_POSITION",
        "RIDER_LOAD",
        "RIDER_CAPACITY",
        "RIDER_VEHICLE",
        "RIDER_EQUIPMENT",
    )
    _same_length(rider_names, (rider_ids, position, load, capacity, vehicle, equipment), num_riders)

    coord_system = parse_coord_system(_fetch(tensors, "COORD_SYSTEM"))
    time_tensor = _fetch(tensors, "DISPATCH_TIME")
    check_times("DISPATCH_TIME", time_tensor)
    dispatch_time = int(time_tensor[0])

    _unique("ORDER_IDS", order_ids)
    _unique("RIDER_IDS", rider_ids)
    values = (
        _located("ORDER_PICKUP", pickup, pickup_address, "pickup address"),
        _located("ORDER_DROPOFF", dropoff, dropoff_address, "drop-off address"),
        position,
        promised,
        created_at,
        constraints,
    )
    counts = (load, capacity, equipment, vehicle)
    if not _values_plausible(values, counts, dispatch_time):
        _check_values(values, counts, dispatch_time)

    return DispatchWindow(
        order_ids=order_ids,
        order_user_ids=user_ids,
        # to_wgs84 always returns a new float64 array: the window never aliases the input.
        pickup=geo.to_wgs84(pickup, coord_system),
        dropoff=geo.to_wgs84(dropoff, coord_system),
        created_at=created_at.astype(np.int64),
        promised_minutes=promised.astype(np.float32),
        constraints=constraints.astype(np.int32),
        rider_ids=rider_ids,
        rider_position=geo.to_wgs84(position, coord_system),
        rider_load=load.astype(np.int32),
        rider_capacity=capacity.astype(np.int32),
        rider_vehicle=vehicle.astype(np.int32),
        rider_equipment=equipment.astype(np.int32),
        dispatch_time=dispatch_time,
        coord_system=coord_system,
        pickup_address=pickup_address,
        dropoff_address=dropoff_address,
        city=city,
    )


def window_to_tensors(window: DispatchWindow) -> dict[str, NDArray[Any]]:
    """The request tensors for a window (coordinates sent as WGS-84)."""
    text = {
        name: value
        for name, value in (
            ("ORDER_PICKUP_ADDRESS", window.pickup_address),
            ("ORDER_DROPOFF_ADDRESS", window.dropoff_address),
            ("ORDER_CITY", window.city),
        )
        if value is not None
    }
    return {
        **text,
        "ORDER_IDS": window.order_ids,
        "ORDER_USER_IDS": window.order_user_ids,
        "ORDER_PICKUP": window.pickup.astype(np.float64),
        "ORDER_DROPOFF": window.dropoff.astype(np.float64),
        "ORDER_CREATED_AT": window.created_at.astype(np.int64),
        "ORDER_PROMISED_MINUTES": window.promised_minutes.astype(np.float32),
        "ORDER_CONSTRAINTS": window.constraints.astype(np.int32),
        "RIDER_IDS": window.rider_ids,
        "RIDER_POSITION": window.rider_position.astype(np.float64),
        "RIDER_LOAD": window.rider_load.astype(np.int32),
        "RIDER_CAPACITY": window.rider_capacity.astype(np.int32),
        "RIDER_VEHICLE": window.rider_vehicle.astype(np.int32),
        "RIDER_EQUIPMENT": window.rider_equipment.astype(np.int32),
        "COORD_SYSTEM": np.array([b"WGS84"], dtype=object),
        "DISPATCH_TIME": np.array([window.dispatch_time], dtype=np.int64),
    }


# ---- contract v2: the packed window on the wire ------------------------------------------
# Unpacking only reshapes and checks the matrices' own rules (dtype, width, whole numbers in
# integer columns); every value rule is `window_from_tensors`'s, and its errors are renamed
# to the column that carried the value, so a v2 caller reads where to look.

_INT32_LIMIT = float(2**31 - 1)
_INT64_LIMIT = float(2**62)
# logical tensor -> (dtype, limit) of its integer column; float columns are absent.
_INTEGER_SOURCES: dict[str, tuple[type[np.generic], float]] = {
    "ORDER_CREATED_AT": (np.int64, _INT64_LIMIT),
    "ORDER_CONSTRAINTS": (np.int32, _INT32_LIMIT),
    "RIDER_LOAD": (np.int32, _INT32_LIMIT),
    "RIDER_CAPACITY": (np.int32, _INT32_LIMIT),
    "RIDER_VEHICLE": (np.int32, _INT32_LIMIT),
    "RIDER_EQUIPMENT": (np.int32, _INT32_LIMIT),
}


def wire_field(tensor: str, columns: tuple[str, ...]) -> str:
    """How errors name columns of a packed tensor: ``ORDER_FIELDS[pickup_lat, pickup_lon]``."""
    return f"{tensor}[{', '.join(columns)}]"


def _wire_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for spec, sources, columns in (
        (ORDER_FIELDS, ORDER_FIELD_SOURCES, ORDER_FIELD_COLUMNS),
        (RIDER_FIELDS, RIDER_FIELD_SOURCES, RIDER_FIELD_COLUMNS),
    ):
        grouped: dict[str, list[str]] = {}
        for (source, _), column in zip(sources, columns, strict=True):
            grouped.setdefault(source, []).append(column)
        names.update({src: wire_field(spec.name, tuple(cols)) for src, cols in grouped.items()})
    for source, column in zip(ORDER_TEXT_SOURCES, ORDER_TEXT_COLUMNS, strict=True):
        names[source] = wire_field(ORDER_TEXT.name, (column,))
    names["DISPATCH_TIME"] = wire_field(WINDOW_FIELDS.name, ("dispatch_time",))
    names["COORD_SYSTEM"] = wire_field(WINDOW_FIELDS.name, ("coord_system",))
    return names


_WIRE_NAMES = _wire_names()


def wire_name(logical: str) -> str:
    """How the wire calls a logical window tensor: ``ORDER_PICKUP`` ->
    ``ORDER_FIELDS[pickup_lat, pickup_lon]`` (a tensor sent as it is keeps its name)."""
    return _WIRE_NAMES.get(logical, logical)


# How errors name the routing key on the wire: ORDER_TEXT[user_id].
USER_IDS_FIELD = _WIRE_NAMES["ORDER_USER_IDS"]


def _matrix(inputs: Mapping[str, Any], name: str, columns: tuple[str, ...]) -> NDArray[np.float64]:
    value = inputs.get(name)
    if value is None:
        raise DispatchInputError(name, "is required but missing", "missing")
    array = np.asarray(value)
    if array.dtype != np.float64:
        raise DispatchInputError(name, f"must be FP64, got {array.dtype}", "dtype")
    width = len(columns)
    if array.ndim != 2 or array.shape[1] != width:
        raise DispatchInputError(
            name,
            f"must have shape [*, {width}] (columns {', '.join(columns)}), got {array.shape}",
            "shape",
        )
    return array


def _whole(
    tensor: str, column: str, values: NDArray[np.float64], limit: float
) -> NDArray[np.float64]:
    """Refuse NaN, fractions and values no integer tensor can hold, naming the column."""
    ok = np.abs(values) <= limit  # False for NaN and infinity
    ok &= values == np.floor(values)
    if not ok.all():
        row = int(np.argmin(ok))
        value = float(values.reshape(-1)[row])
        where = wire_field(tensor, (column,))
        if not np.isfinite(value):
            raise DispatchInputError(
                where, f"must be finite, got NaN or infinity (row {row})", "not_finite"
            )
        raise DispatchInputError(
            where, f"must be a whole number within [-{limit:.0f}, {limit:.0f}] (row {row})", "range"
        )
    return values


def _whole_columns(
    tensor: str,
    matrix: NDArray[np.float64],
    at: NDArray[np.intp],
    columns: tuple[str, ...],
    limits: NDArray[np.float64],
) -> None:
    """`_whole` for the columns ``at`` of ``matrix`` (limits per column) in one pass over
    them; where one fails, the columns are checked in order, so the first bad column and
    row raise exactly the error `_whole` names (a small window paid ~9 us per column)."""
    block = matrix[:, at]
    ok = np.abs(block) <= limits  # False for NaN and infinity
    ok &= block == np.floor(block)
    if ok.all():
        return
    for index, limit in zip(at.tolist(), limits.tolist(), strict=True):
        _whole(tensor, columns[index], matrix[:, index], limit)


def _integer_columns(
    sources: tuple[tuple[str, int | None], ...],
) -> tuple[NDArray[np.intp], NDArray[np.float64]]:
    """Where a packed tensor's whole-number columns are, and each one's limit."""
    at = [i for i, (source, _) in enumerate(sources) if source in _INTEGER_SOURCES]
    limits = [_INTEGER_SOURCES[sources[i][0]][1] for i in at]
    return np.asarray(at, dtype=np.intp), np.asarray(limits, dtype=np.float64)


_WHOLE_COLUMNS: Final = {
    ORDER_FIELDS.name: _integer_columns(ORDER_FIELD_SOURCES),
    RIDER_FIELDS.name: _integer_columns(RIDER_FIELD_SOURCES),
}
_RIDER_COUNTS_AT: Final = np.asarray(
    [RIDER_FIELD_COLUMNS.index("load"), RIDER_FIELD_COLUMNS.index("capacity")], dtype=np.intp
)
_RIDER_COUNTS_LIMITS: Final = np.full(2, _INT32_LIMIT)
_CREATED_AT: Final = np.asarray([ORDER_FIELD_COLUMNS.index("created_at")], dtype=np.intp)


def _unpack(
    inputs: Mapping[str, Any],
    tensor: str,
    columns: tuple[str, ...],
    sources: tuple[tuple[str, int | None], ...],
    out: dict[str, Any],
) -> None:
    matrix = _matrix(inputs, tensor, columns)
    at, limits = _WHOLE_COLUMNS[tensor]
    _whole_columns(tensor, matrix, at, columns, limits)
    for index, (source, part) in enumerate(sources):
        if part is not None:
            if part == 0:  # a [*, 2] pair of adjacent columns (lat, lon)
                out[source] = matrix[:, index : index + 2]
            continue
        integer = _INTEGER_SOURCES.get(source)
        # whole numbers within their limits: checked above
        out[source] = matrix[:, index].astype(np.float32 if integer is None else integer[0])


def window_tensors_from_wire(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The v2 wire tensors of one window (no batch dimension) -> the logical window tensors
    (WINDOW_INPUTS names) `window_from_tensors` validates. Raises DispatchInputError."""
    out: dict[str, Any] = {
        name: inputs.get(name) for name in ("ORDER_IDS", "RIDER_IDS", "OBJECTIVE_WEIGHTS")
    }
    text = order_text_from_wire(inputs)
    out.update(zip(ORDER_TEXT_SOURCES, text.T, strict=False))
    _unpack(inputs, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS, ORDER_FIELD_SOURCES, out)
    _unpack(inputs, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS, RIDER_FIELD_SOURCES, out)
    value = inputs.get(WINDOW_FIELDS.name)
    if value is None:
        raise DispatchInputError(WINDOW_FIELDS.name, "is required but missing", "missing")
    fields = np.asarray(value)
    if fields.dtype != np.float64:
        raise DispatchInputError(WINDOW_FIELDS.name, f"must be FP64, got {fields.dtype}", "dtype")
    if fields.shape != (len(WINDOW_FIELD_COLUMNS),):
        raise DispatchInputError(
            WINDOW_FIELDS.name,
            f"must have shape [{len(WINDOW_FIELD_COLUMNS)}] "
            f"(columns {', '.join(WINDOW_FIELD_COLUMNS)}), got {fields.shape}",
            "shape",
        )
    dispatch_time = _whole(WINDOW_FIELDS.name, "dispatch_time", fields[:1], _INT64_LIMIT)
    out["DISPATCH_TIME"] = dispatch_time.astype(np.int64)
    code = float(fields[1])
    if code not in tuple(float(c) for c in CoordSystem):
        allowed = ", ".join(f"{int(c)} ({c.name})" for c in CoordSystem)
        raise DispatchInputError(
            wire_field(WINDOW_FIELDS.name, ("coord_system",)),
            f"must be one of {allowed}",
            "unknown_value",
        )
    out["COORD_SYSTEM"] = np.array([CoordSystem(int(code)).name.encode()], dtype=object)
    return out


def order_text_from_wire(inputs: Mapping[str, Any]) -> NDArray[Any]:
    """ORDER_TEXT checked for its own rules (BYTES, [B, 1..4]): the routing key is column 0."""
    value = inputs.get(ORDER_TEXT.name)
    if value is None:
        raise DispatchInputError(ORDER_TEXT.name, "is required but missing", "missing")
    text = np.asarray(value)
    if text.dtype.kind not in "OSU":
        raise DispatchInputError(ORDER_TEXT.name, f"must be BYTES, got {text.dtype}", "dtype")
    width = len(ORDER_TEXT_COLUMNS)
    if text.ndim != 2 or not 1 <= text.shape[1] <= width:
        raise DispatchInputError(
            ORDER_TEXT.name,
            f"must have shape [*, 1..{width}] (columns {', '.join(ORDER_TEXT_COLUMNS)}, "
            f"the first required), got {text.shape}",
            "shape",
        )
    return text


def user_ids_from_wire(inputs: Mapping[str, Any]) -> NDArray[Any]:
    """The routing key, ORDER_TEXT's user-id column (no other rule checked)."""
    ids: NDArray[Any] = order_text_from_wire(inputs)[:, 0]
    return ids


def window_from_wire(
    inputs: Mapping[str, Any], limits: WindowLimits | None = None
) -> DispatchWindow:
    """Validate one window's v2 wire tensors (`window_from_tensors`'s rules, errors named
    by the column that carried the value) and build the WGS-84 window."""
    tensors = window_tensors_from_wire(inputs)
    try:
        return window_from_tensors(tensors, limits)
    except DispatchInputError as exc:
        wire = _WIRE_NAMES.get(exc.tensor)
        if wire is None:
            raise
        # the same rule and code, named by the column that carried the value
        exc.tensor = wire
        exc.args = (f"{wire}: {exc.rule}",)
        raise


class _Usual(NamedTuple):
    """A window of the usual kind, its per-window rules already checked: what
    `windows_from_wire` still checks over the batch (the matrices) and builds it from."""

    order_ids: NDArray[np.object_]
    user_ids: NDArray[np.object_]
    rider_ids: NDArray[np.object_]
    orders: NDArray[np.float64]
    riders: NDArray[np.float64]
    dispatch_time: int
    coord_system: CoordSystem


def _usual(inputs: Mapping[str, Any], limits: WindowLimits) -> _Usual | None:
    """The window's ids, matrices and window fields when each per-window rule holds and the
    window is of the usual kind (no address columns); else None: `window_from_wire` then
    judges it alone. Never raises."""
    try:
        orders = _matrix(inputs, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS)
        riders = _matrix(inputs, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS)
    except DispatchInputError:
        return None
    text, fields = inputs.get(ORDER_TEXT.name), inputs.get(WINDOW_FIELDS.name)
    order_ids, rider_ids = inputs.get("ORDER_IDS"), inputs.get("RIDER_IDS")
    if not (
        isinstance(text, np.ndarray) and isinstance(fields, np.ndarray)
        and isinstance(order_ids, np.ndarray) and isinstance(rider_ids, np.ndarray)
    ):  # fmt: skip
        return None
    num_orders, num_riders = len(orders), len(riders)
    if (
        text.dtype != object or text.shape != (num_orders, 1)
        or fields.dtype != np.float64 or fields.shape != (len(WINDOW_FIELD_COLUMNS),)
        or order_ids.dtype != object or order_ids.shape != (num_orders,)
        or rider_ids.dtype != object or rider_ids.shape != (num_riders,)
        or not 1 <= num_orders <= limits.max_orders
        or not 1 <= num_riders <= limits.max_riders
    ):  # fmt: skip
        return None
    dispatch_time, code = fields.tolist()
    if (
        not EARLIEST_TIME <= dispatch_time < LATEST_TIME  # also False for NaN
        or dispatch_time != int(dispatch_time)
        or code not in _COORD_CODES
    ):
        return None
    most = limits.max_id_bytes
    orders_ok = _taken_as_sent(order_ids.tolist(), 1, most)
    users_ok = _taken_as_sent(text[:, 0].tolist(), 1, most)
    riders_ok = _taken_as_sent(rider_ids.tolist(), 1, most)
    if (
        orders_ok is None or users_ok is None or riders_ok is None
        or not _distinct(orders_ok) or not _distinct(riders_ok)
    ):  # fmt: skip
        return None
    return _Usual(
        orders_ok, users_ok, riders_ok, orders, riders, int(dispatch_time), CoordSystem(int(code))
    )


_COORD_CODES: Final = frozenset(float(c) for c in CoordSystem)


def windows_from_wire(
    batch: Sequence[Mapping[str, Any]], limits: WindowLimits | None = None
) -> list[DispatchWindow | Exception]:
    """`window_from_wire` of each window of a batch (one Triton `execute`), each result the
    same, or the same error, as that window's alone.

    Windows of the usual kind (see `_usual`) have their matrices' rules (whole numbers,
    value ranges) checked in one pass over all of them, and are built from slices of it: a
    small window paid ~150 us for checks that are each a numpy call. If any value breaks a
    rule, or a window is of another kind, that window (all of the usual ones, for a broken
    value) is judged alone, so every error is exactly `window_from_wire`'s.
    """
    limits = limits or WindowLimits()
    usual = [_usual(inputs, limits) for inputs in batch]
    built = _built_together([u for u in usual if u is not None])
    if built is None:
        usual = [None] * len(batch)
    results: list[DispatchWindow | Exception] = []
    together = iter(built or ())
    for inputs, item in zip(batch, usual, strict=True):
        if item is not None:
            results.append(next(together))
            continue
        try:
            results.append(window_from_wire(inputs, limits))
        except Exception as exc:  # this window's own error
            results.append(exc)
    return results


def _built_together(usual: Sequence[_Usual]) -> list[DispatchWindow] | None:
    """The windows, built from one concatenation of their matrices; None when a value breaks
    a rule (its window must then be judged alone, to name it)."""
    if not usual:
        return []
    columns: dict[str, Any] = {}
    orders = {ORDER_FIELDS.name: np.concatenate([u.orders for u in usual])}
    riders = {RIDER_FIELDS.name: np.concatenate([u.riders for u in usual])}
    try:
        _unpack(orders, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS, ORDER_FIELD_SOURCES, columns)
        _unpack(riders, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS, RIDER_FIELD_SOURCES, columns)
    except DispatchInputError:
        return None
    order_counts = [len(u.orders) for u in usual]
    values: Values = (
        columns["ORDER_PICKUP"], columns["ORDER_DROPOFF"], columns["RIDER_POSITION"],
        columns["ORDER_PROMISED_MINUTES"], columns["ORDER_CREATED_AT"],
        columns["ORDER_CONSTRAINTS"],
    )  # fmt: skip
    counts: Counts = (
        columns["RIDER_LOAD"], columns["RIDER_CAPACITY"],
        columns["RIDER_EQUIPMENT"], columns["RIDER_VEHICLE"],
    )  # fmt: skip
    times = np.repeat(np.array([u.dispatch_time for u in usual], dtype=np.int64), order_counts)
    if not _values_plausible(values, counts, times):
        return None
    order_ends = np.cumsum(order_counts).tolist()
    rider_ends = np.cumsum([len(u.riders) for u in usual]).tolist()
    windows = []
    for u, o_end, r_end in zip(usual, order_ends, rider_ends, strict=True):
        o, r = slice(o_end - len(u.orders), o_end), slice(r_end - len(u.riders), r_end)
        windows.append(
            DispatchWindow(
                order_ids=u.order_ids,
                order_user_ids=u.user_ids,
                pickup=geo.to_wgs84(columns["ORDER_PICKUP"][o], u.coord_system),
                dropoff=geo.to_wgs84(columns["ORDER_DROPOFF"][o], u.coord_system),
                created_at=columns["ORDER_CREATED_AT"][o],
                promised_minutes=columns["ORDER_PROMISED_MINUTES"][o],
                constraints=columns["ORDER_CONSTRAINTS"][o],
                rider_ids=u.rider_ids,
                rider_position=geo.to_wgs84(columns["RIDER_POSITION"][r], u.coord_system),
                rider_load=columns["RIDER_LOAD"][r],
                rider_capacity=columns["RIDER_CAPACITY"][r],
                rider_vehicle=columns["RIDER_VEHICLE"][r],
                rider_equipment=columns["RIDER_EQUIPMENT"][r],
                dispatch_time=u.dispatch_time,
                coord_system=u.coord_system,
            )
        )
    return windows


def rider_counts_from_wire(
    inputs: Mapping[str, Any],
) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """The load and capacity columns of RIDER_FIELDS as INT32 (the resolver's inputs)."""
    matrix = _matrix(inputs, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS)
    _whole_columns(
        RIDER_FIELDS.name, matrix, _RIDER_COUNTS_AT, RIDER_FIELD_COLUMNS, _RIDER_COUNTS_LIMITS
    )
    load, capacity = _RIDER_COUNTS_AT.tolist()
    return matrix[:, load].astype(np.int32), matrix[:, capacity].astype(np.int32)


def order_created_at_from_wire(inputs: Mapping[str, Any]) -> NDArray[np.int64]:
    """The created_at column of ORDER_FIELDS as INT64 (the stack-aware resolver's order of
    a rider's new orders)."""
    matrix = _matrix(inputs, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS)
    _whole_columns(
        ORDER_FIELDS.name, matrix, _CREATED_AT, ORDER_FIELD_COLUMNS, np.full(1, _INT64_LIMIT)
    )
    return matrix[:, int(_CREATED_AT[0])].astype(np.int64)


def window_to_wire(window: DispatchWindow) -> dict[str, NDArray[Any]]:
    """The v2 wire tensors for a window (no batch dimension; coordinates as WGS-84)."""
    return pack_window(window_to_tensors(window))
