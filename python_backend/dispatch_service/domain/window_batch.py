"""The batch path: the windows of one Triton `execute` validated together.

Each result is the same, or the same error, as that window's alone (`window_from_wire`);
the plain windows only share one pass over their matrices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    ORDER_FIELD_COLUMNS,
    ORDER_FIELD_SOURCES,
    ORDER_FIELDS,
    ORDER_TEXT,
    RIDER_FIELD_COLUMNS,
    RIDER_FIELD_SOURCES,
    RIDER_FIELDS,
    WINDOW_FIELD_COLUMNS,
    WINDOW_FIELDS,
    CoordSystem,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import geo
from dispatch_service.domain.window import (
    EARLIEST_TIME,
    LATEST_TIME,
    Counts,
    DispatchWindow,
    Values,
    WindowLimits,
    ids_distinct,
    values_plausible,
)
from dispatch_service.domain.window_text import utf8_as_sent
from dispatch_service.domain.window_wire import unpack_columns, window_from_wire, wire_matrix

__all__ = ["windows_from_wire"]


class _PlainWindow(NamedTuple):
    """A plain window (no address columns), its per-window rules already checked: what
    `windows_from_wire` still checks over the batch (the matrices) and builds it from."""

    order_ids: NDArray[np.object_]
    user_ids: NDArray[np.object_]
    rider_ids: NDArray[np.object_]
    orders: NDArray[np.float64]
    riders: NDArray[np.float64]
    dispatch_time: int
    coord_system: CoordSystem


def _plain_window(inputs: Mapping[str, Any], limits: WindowLimits) -> _PlainWindow | None:
    """The window's ids, matrices and window fields when each per-window rule holds and the
    window is plain (no address columns); else None: `window_from_wire` then
    judges it alone. Never raises."""
    try:
        orders = wire_matrix(inputs, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS)
        riders = wire_matrix(inputs, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS)
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
    orders_ok = utf8_as_sent(order_ids.tolist(), 1, most)
    users_ok = utf8_as_sent(text[:, 0].tolist(), 1, most)
    riders_ok = utf8_as_sent(rider_ids.tolist(), 1, most)
    if (
        orders_ok is None or users_ok is None or riders_ok is None
        or not ids_distinct(orders_ok) or not ids_distinct(riders_ok)
    ):  # fmt: skip
        return None
    return _PlainWindow(
        orders_ok, users_ok, riders_ok, orders, riders, int(dispatch_time), CoordSystem(int(code))
    )


_COORD_CODES: Final = frozenset(float(c) for c in CoordSystem)


def windows_from_wire(
    batch: Sequence[Mapping[str, Any]], limits: WindowLimits | None = None
) -> list[DispatchWindow | Exception]:
    """`window_from_wire` of each window of a batch (one Triton `execute`), each result the
    same, or the same error, as that window's alone.

    Plain windows (see `_plain_window`) have their matrices' rules (whole numbers,
    value ranges) checked in one pass over all of them, and are built from slices of it, so
    a small window does not pay one numpy call per check. If any value breaks a
    rule, or a window is of another kind, that window (all of the plain ones, for a broken
    value) is judged alone, so every error is exactly `window_from_wire`'s.
    """
    limits = limits or WindowLimits()
    plain = [_plain_window(inputs, limits) for inputs in batch]
    built = _build_plain_windows([p for p in plain if p is not None])
    if built is None:
        plain = [None] * len(batch)
    results: list[DispatchWindow | Exception] = []
    built_windows = iter(built or ())
    for inputs, item in zip(batch, plain, strict=True):
        if item is not None:
            results.append(next(built_windows))
            continue
        try:
            results.append(window_from_wire(inputs, limits))
        except Exception as exc:  # this window's own error
            results.append(exc)
    return results


def _build_plain_windows(plain: Sequence[_PlainWindow]) -> list[DispatchWindow] | None:
    """The windows, built from one concatenation of their matrices; None when a value breaks
    a rule (its window must then be judged alone, to name it)."""
    if not plain:
        return []
    columns: dict[str, Any] = {}
    orders = {ORDER_FIELDS.name: np.concatenate([u.orders for u in plain])}
    riders = {RIDER_FIELDS.name: np.concatenate([u.riders for u in plain])}
    try:
        unpack_columns(orders, ORDER_FIELDS.name, ORDER_FIELD_COLUMNS, ORDER_FIELD_SOURCES, columns)
        unpack_columns(riders, RIDER_FIELDS.name, RIDER_FIELD_COLUMNS, RIDER_FIELD_SOURCES, columns)
    except DispatchInputError:
        return None
    order_counts = [len(u.orders) for u in plain]
    values: Values = (
        columns["ORDER_PICKUP"], columns["ORDER_DROPOFF"], columns["RIDER_POSITION"],
        columns["ORDER_PROMISED_MINUTES"], columns["ORDER_CREATED_AT"],
        columns["ORDER_CONSTRAINTS"],
    )  # fmt: skip
    counts: Counts = (
        columns["RIDER_LOAD"], columns["RIDER_CAPACITY"],
        columns["RIDER_EQUIPMENT"], columns["RIDER_VEHICLE"],
    )  # fmt: skip
    times = np.repeat(np.array([u.dispatch_time for u in plain], dtype=np.int64), order_counts)
    if not values_plausible(values, counts, times):
        return None
    order_ends = np.cumsum(order_counts).tolist()
    rider_ends = np.cumsum([len(u.riders) for u in plain]).tolist()
    windows = []
    for u, o_end, r_end in zip(plain, order_ends, rider_ends, strict=True):
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
