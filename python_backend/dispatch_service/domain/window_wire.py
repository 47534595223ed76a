"""Contract v2: the packed window on the wire.

Unpacking only reshapes and checks the matrices' own rules (dtype, width, whole numbers in
integer columns); every value rule is `window_from_tensors`'s, and its errors are renamed
to the column that carried the value, so a v2 caller reads where to look.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, cast

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    KNOWN_CONSTRAINTS,
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
    CoordSystem,
    Vehicle,
    pack_window,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window import (
    EARLIEST_TIME,
    LATEST_TIME,
    MAX_CLOCK_SKEW_S,
    MAX_PROMISED_MINUTES,
    MAX_RIDER_LOAD,
    DispatchWindow,
    WindowLimits,
    ids_distinct,
    window_from_tensors,
    window_to_tensors,
)
from dispatch_service.domain.window_text import utf8_as_sent

__all__ = [
    "USER_IDS_FIELD",
    "order_created_at_from_wire",
    "order_text_from_wire",
    "rider_counts_from_wire",
    "unpack_columns",
    "user_ids_from_wire",
    "window_from_wire",
    "window_tensors_from_wire",
    "window_to_wire",
    "wire_field",
    "wire_matrix",
    "wire_name",
]


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


def wire_matrix(
    inputs: Mapping[str, Any], name: str, columns: tuple[str, ...]
) -> NDArray[np.float64]:
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


def _check_whole(
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


def _check_whole_columns(
    tensor: str,
    matrix: NDArray[np.float64],
    at: NDArray[np.intp],
    columns: tuple[str, ...],
    limits: NDArray[np.float64],
) -> None:
    """`_check_whole` for the columns ``at`` of ``matrix`` (limits per column) in one pass
    over them; where one fails, the columns are checked in order, so the first bad column
    and row raise exactly the error `_check_whole` names."""
    block = matrix[:, at]
    ok = np.abs(block) <= limits  # False for NaN and infinity
    ok &= block == np.floor(block)
    if ok.all():
        return
    for index, limit in zip(at.tolist(), limits.tolist(), strict=True):
        _check_whole(tensor, columns[index], matrix[:, index], limit)


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


def unpack_columns(
    inputs: Mapping[str, Any],
    tensor: str,
    columns: tuple[str, ...],
    sources: tuple[tuple[str, int | None], ...],
    out: dict[str, Any],
) -> None:
    matrix = wire_matrix(inputs, tensor, columns)
    at, limits = _WHOLE_COLUMNS[tensor]
    _check_whole_columns(tensor, matrix, at, columns, limits)
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
    unpack_columns(inputs, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS, ORDER_FIELD_SOURCES, out)
    unpack_columns(inputs, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS, RIDER_FIELD_SOURCES, out)
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
    dispatch_time = _check_whole(WINDOW_FIELDS.name, "dispatch_time", fields[:1], _INT64_LIMIT)
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


# Where the usual window's columns are read from the packed matrices (`_usual_window`):
# the whole-number columns with their limits (`_INTEGER_SOURCES`), the (lat, lon) pairs.
_ORDER_WHOLE: Final = np.asarray(
    [ORDER_FIELD_COLUMNS.index(name) for name in ("created_at", "constraints")]
)
_RIDER_WHOLE: Final = np.asarray(
    [RIDER_FIELD_COLUMNS.index(name) for name in ("load", "capacity", "vehicle", "equipment")]
)
_ORDER_LIMITS: Final = np.asarray(
    [_INTEGER_SOURCES[ORDER_FIELD_SOURCES[at][0]][1] for at in _ORDER_WHOLE.tolist()]
)
_RIDER_LIMITS: Final = np.asarray(
    [_INTEGER_SOURCES[RIDER_FIELD_SOURCES[at][0]][1] for at in _RIDER_WHOLE.tolist()]
)
_PROMISED: Final = ORDER_FIELD_COLUMNS.index("promised_minutes")


def _column_bounds(
    columns: tuple[str, ...], bounds: Mapping[str, tuple[float, float]]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(low, high) per packed column, in column order."""
    low, high = zip(*(bounds[name] for name in columns), strict=True)
    return np.array(low), np.array(high)


# Per packed column, bounds every value of a usual window lies within (`_usual_window`'s
# one comparison per matrix): `values_plausible`'s rules on the packed values, or
# stricter (a window outside them only takes the checks rule by rule), within each whole
# column's limit. The promised minutes are kept as FP32: a value is in (0, 240] as FP32
# when it is in [the smallest normal FP32, 240] as FP64. created_at's upper bound is also
# the window's dispatch time plus the clock skew (set per window).
_LAT, _LON = (-90.0, 90.0), (-180.0, 180.0)
_ORDER_LOW, _ORDER_HIGH = _column_bounds(
    ORDER_FIELD_COLUMNS,
    {
        "pickup_lat": _LAT,
        "pickup_lon": _LON,
        "dropoff_lat": _LAT,
        "dropoff_lon": _LON,
        "created_at": (float(EARLIEST_TIME), float(LATEST_TIME - 1)),
        "promised_minutes": (float(np.finfo(np.float32).tiny), MAX_PROMISED_MINUTES),
        "constraints": (0.0, float(KNOWN_CONSTRAINTS)),
    },
)
_RIDER_LOW, _RIDER_HIGH = _column_bounds(
    RIDER_FIELD_COLUMNS,
    {
        "lat": _LAT,
        "lon": _LON,
        "load": (0.0, float(MAX_RIDER_LOAD)),
        "capacity": (0.0, float(MAX_RIDER_LOAD)),
        "vehicle": (0.0, float(max(Vehicle))),
        "equipment": (0.0, _INT32_LIMIT),
    },
)
_CREATED_AT_COLUMN: Final = ORDER_FIELD_COLUMNS.index("created_at")
_CONSTRAINTS_COLUMN: Final = ORDER_FIELD_COLUMNS.index("constraints")
_KNOWN_CONSTRAINTS: Final = int(KNOWN_CONSTRAINTS)
# `window_kernels.usual_values`' bounds per matrix: (low, high, whole-number columns)
_ORDER_BOUNDS: Final = (_ORDER_LOW, _ORDER_HIGH, _ORDER_WHOLE.astype(np.int64))
_RIDER_BOUNDS: Final = (_RIDER_LOW, _RIDER_HIGH, _RIDER_WHOLE.astype(np.int64))
if not (
    (np.abs(_ORDER_LOW[_ORDER_WHOLE]) <= _ORDER_LIMITS).all()
    and (_ORDER_HIGH[_ORDER_WHOLE] <= _ORDER_LIMITS).all()
    and (_RIDER_HIGH[_RIDER_WHOLE] <= _RIDER_LIMITS).all()
):
    raise RuntimeError("a usual window's bounds exceed a whole column's limit")
_USUAL_TENSORS: Final = (
    ORDER_FIELDS.name,
    RIDER_FIELDS.name,
    WINDOW_FIELDS.name,
    ORDER_TEXT.name,
    "ORDER_IDS",
    "RIDER_IDS",
)


def _pair_at(columns: tuple[str, ...], lat: str, lon: str) -> slice:
    at = columns.index(lat)
    if columns.index(lon) != at + 1:
        raise RuntimeError(f"{lat} and {lon} are no longer adjacent packed columns")
    return slice(at, at + 2)


_PICKUP: Final = _pair_at(ORDER_FIELD_COLUMNS, "pickup_lat", "pickup_lon")
_DROPOFF: Final = _pair_at(ORDER_FIELD_COLUMNS, "dropoff_lat", "dropoff_lon")
_POSITION: Final = _pair_at(RIDER_FIELD_COLUMNS, "lat", "lon")


def _usual_window(inputs: Mapping[str, Any], limits: WindowLimits) -> DispatchWindow | None:
    """The window of a request as nearly all come (WGS-84, no addresses, ids as UTF-8
    bytes, every value within its rules), built straight from the packed matrices in a few
    dozen numpy calls; None when anything differs, and `window_from_wire` then checks rule
    by rule, naming the first one broken. The window is the one the full checks build, field
    for field and byte for byte: the same conversions of the same columns."""
    arrays = [inputs.get(name) for name in _USUAL_TENSORS]
    if not all(type(array) is np.ndarray for array in arrays):
        return None
    # the type as a string: evaluated, `list[NDArray[Any]]` costs a few us per window
    orders, riders, fields, text, order_ids, rider_ids = cast("list[NDArray[Any]]", arrays)
    num_orders, num_riders = orders.shape[0], riders.shape[0]
    if (
        orders.dtype != np.float64
        or orders.shape != (num_orders, len(ORDER_FIELD_COLUMNS))
        or riders.dtype != np.float64
        or riders.shape != (num_riders, len(RIDER_FIELD_COLUMNS))
        or fields.dtype != np.float64
        or fields.shape != (len(WINDOW_FIELD_COLUMNS),)
        or text.dtype != object
        or text.shape != (num_orders, 1)  # the routing key alone: no address to geocode
        or order_ids.dtype != object
        or order_ids.shape != (num_orders,)
        or rider_ids.dtype != object
        or rider_ids.shape != (num_riders,)
        or not 1 <= num_orders <= limits.max_orders
        or not 1 <= num_riders <= limits.max_riders
    ):
        return None
    dispatch_time, coord_system = fields.tolist()
    if (
        coord_system != float(CoordSystem.WGS84)
        or not EARLIEST_TIME <= dispatch_time < LATEST_TIME  # False for NaN
        or dispatch_time != int(dispatch_time)
    ):
        return None
    # Imported here: the router reads the routing key from this module and stays without
    # numba (its stub does not load the compiled kernels).
    from dispatch_service.domain.window_kernels import usual_values

    latest_created = dispatch_time + MAX_CLOCK_SKEW_S
    rules = (_CREATED_AT_COLUMN, latest_created, _CONSTRAINTS_COLUMN, _KNOWN_CONSTRAINTS)
    # a value out of bounds (or NaN), a fraction in a whole column, an unknown bit: None
    if not usual_values(orders, _ORDER_BOUNDS, riders, _RIDER_BOUNDS, rules):
        return None
    order_keys, user_keys, rider_keys = (
        utf8_as_sent(column.tolist(), 1, limits.max_id_bytes)
        for column in (order_ids, text[:, 0], rider_ids)
    )
    if order_keys is None or user_keys is None or rider_keys is None:
        return None
    if not (ids_distinct(order_keys) and ids_distinct(rider_keys)):
        return None
    load, capacity, vehicle, equipment = np.ascontiguousarray(
        riders[:, _RIDER_WHOLE].T, dtype=np.int32
    )
    return DispatchWindow(
        order_ids=order_keys,
        order_user_ids=user_keys,
        pickup=orders[:, _PICKUP].copy(),
        dropoff=orders[:, _DROPOFF].copy(),
        created_at=orders[:, _CREATED_AT_COLUMN].astype(np.int64),
        promised_minutes=orders[:, _PROMISED].astype(np.float32),
        constraints=orders[:, _CONSTRAINTS_COLUMN].astype(np.int32),
        rider_ids=rider_keys,
        rider_position=riders[:, _POSITION].copy(),
        rider_load=load,
        rider_capacity=capacity,
        rider_vehicle=vehicle,
        rider_equipment=equipment,
        dispatch_time=int(dispatch_time),
        coord_system=CoordSystem.WGS84,
    )


def window_from_wire(
    inputs: Mapping[str, Any], limits: WindowLimits | None = None
) -> DispatchWindow:
    """Validate one window's v2 wire tensors (`window_from_tensors`'s rules, errors named
    by the column that carried the value) and build the WGS-84 window."""
    limits = limits or WindowLimits()
    usual = _usual_window(inputs, limits)
    if usual is not None:
        return usual
    tensors = window_tensors_from_wire(inputs)
    try:
        return window_from_tensors(tensors, limits)
    except DispatchInputError as exc:
        wire = _WIRE_NAMES.get(exc.tensor)
        if wire is None:
            raise
        # the same rule and code, named by the column that carried the value
        exc.rename(wire)
        raise


def rider_counts_from_wire(
    inputs: Mapping[str, Any],
) -> tuple[NDArray[np.int32], NDArray[np.int32]]:
    """The load and capacity columns of RIDER_FIELDS as INT32 (the resolver's inputs)."""
    matrix = wire_matrix(inputs, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS)
    _check_whole_columns(
        RIDER_FIELDS.name, matrix, _RIDER_COUNTS_AT, RIDER_FIELD_COLUMNS, _RIDER_COUNTS_LIMITS
    )
    load, capacity = _RIDER_COUNTS_AT.tolist()
    return matrix[:, load].astype(np.int32), matrix[:, capacity].astype(np.int32)


def order_created_at_from_wire(inputs: Mapping[str, Any]) -> NDArray[np.int64]:
    """The created_at column of ORDER_FIELDS as INT64 (the stack-aware resolver's order of
    a rider's new orders)."""
    matrix = wire_matrix(inputs, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS)
    _check_whole_columns(
        ORDER_FIELDS.name, matrix, _CREATED_AT, ORDER_FIELD_COLUMNS, np.full(1, _INT64_LIMIT)
    )
    return matrix[:, int(_CREATED_AT[0])].astype(np.int64)


def window_to_wire(window: DispatchWindow) -> dict[str, NDArray[Any]]:
    """The v2 wire tensors for a window (no batch dimension; coordinates as WGS-84)."""
    return pack_window(window_to_tensors(window))
