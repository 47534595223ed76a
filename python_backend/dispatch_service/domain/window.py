"""A dispatch window: validated, typed, in WGS-84.

`window_from_tensors` is the one gate every request passes: it checks each rule of the
contract and names the tensor and the rule when one is broken. Downstream code may
assume a `DispatchWindow` is well formed. The wire codec is `window_wire`, the batch
path `window_batch`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    WINDOW_INPUTS,
    CoordSystem,
    TensorSpec,
    Vehicle,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import geo
from dispatch_service.domain.window_text import check_id_text, decode_text, utf8_as_sent

__all__ = [
    "EARLIEST_TIME",
    "LATEST_TIME",
    "MAX_CLOCK_SKEW_S",
    "MAX_PROMISED_MINUTES",
    "MAX_RIDER_LOAD",
    "Counts",
    "DispatchWindow",
    "Values",
    "WindowLimits",
    "check_objective_weights",
    "check_rider_counts",
    "check_times",
    "ids_distinct",
    "parse_coord_system",
    "parse_objective_weights",
    "values_plausible",
    "window_from_tensors",
    "window_to_tensors",
]


MAX_PROMISED_MINUTES = 240.0
# Orders may be stamped a little after the window's time by a skewed clock; not more.
MAX_CLOCK_SKEW_S = 300
# Plausible bounds: a rider's load and capacity (orders) and every timestamp.
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
    taken = utf8_as_sent(items, 1, max_bytes)
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
    taken = utf8_as_sent(items, 0, limit)
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


def ids_distinct(ids: NDArray[np.object_]) -> bool:
    values = ids.tolist()
    return len(set(values)) == len(values)


def _unique(name: str, ids: NDArray[np.object_]) -> None:
    if ids_distinct(ids):
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
    if weights.shape == (len(OBJECTIVES),):
        values = weights.tolist()  # three floats: plain comparisons, no numpy calls
        if all(0.0 <= value < math.inf for value in values) and sum(values) > 0.0:
            return weights  # False above for NaN, infinity and any negative weight
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


def values_plausible(
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
    if not values_plausible(values, counts, dispatch_time):
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
