"""The resolver's input rules: candidates, objectives, rider counts and ids.

The inputs come from upstream models, not from the caller, yet a bad tensor must end one
request with a `DispatchInputError` that names it, never crash the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import CANDIDATE_RIDER_INDEX, OBJECTIVES, PAIR_OBJECTIVES
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.scoring import COST, ETA

__all__ = [
    "check_pair_objectives",
    "checked_candidates",
    "checked_counts",
    "checked_objectives",
    "checked_order_ids",
    "checked_rider_ids",
]


_NON_NEGATIVE = np.array([ETA, COST])


def _first_row(mask: NDArray[np.bool_]) -> int:
    return int(np.argwhere(mask)[0][0])


def checked_candidates(
    value: ArrayLike, num_riders: int, name: str = CANDIDATE_RIDER_INDEX.name
) -> NDArray[np.int64]:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise DispatchInputError(name, f"must be INT32, got {array.dtype}", "dtype")
    if array.ndim != 2:
        raise DispatchInputError(name, f"must have shape [B, N], got {array.shape}", "shape")
    index = array.astype(np.int64)
    bad = (index < -1) | (index >= num_riders)
    if bad.any():
        b, j = (int(x) for x in np.argwhere(bad)[0])
        raise DispatchInputError(
            name,
            f"must be -1 or a rider row in [0, {num_riders}), got {index[b, j]} at [{b}, {j}]",
            "range",
        )
    if index.shape[1] > 1:
        ordered = np.sort(index, axis=1)
        repeated = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
        if repeated.any():
            b = _first_row(repeated)
            raise DispatchInputError(name, f"order {b} lists a rider more than once", "unique")
    return index


def checked_objectives(value: ArrayLike, valid: NDArray[np.bool_]) -> NDArray[np.float64]:
    """[B, N, 3] float64 with the rows of missing candidates zeroed."""
    name = PAIR_OBJECTIVES.name
    array = np.asarray(value)
    if array.dtype.kind != "f":
        raise DispatchInputError(name, f"must be FP32, got {array.dtype}", "dtype")
    if array.ndim != 2 or array.shape[1] != len(OBJECTIVES):
        raise DispatchInputError(
            name, f"must have shape [P, {len(OBJECTIVES)}], got {array.shape}", "shape"
        )
    num_orders, num_candidates = valid.shape
    pairs = num_orders * num_candidates
    if array.shape[0] != pairs:
        raise DispatchInputError(
            name,
            f"must have B*N = {num_orders}*{num_candidates} = {pairs} rows "
            f"like {CANDIDATE_RIDER_INDEX.name}, got {array.shape[0]}",
            "shape",
        )
    obj = array.astype(np.float64).reshape(num_orders, num_candidates, len(OBJECTIVES))
    obj[~valid] = 0.0  # zeros pass every check below
    check_pair_objectives(obj.reshape(pairs, len(OBJECTIVES)), np.arange(pairs))
    return obj


def check_pair_objectives(values: NDArray[np.float64], rows: NDArray[np.int64]) -> None:
    """Objectives [n, 3] of valid pairs, at PAIR_OBJECTIVES rows ``rows`` (ascending)."""
    name = PAIR_OBJECTIVES.name
    # One pass for the usual answer: ETA and cost >= 0 and every value finite; else the
    # rules in turn, naming the first row that breaks one.
    if (values[:, _NON_NEGATIVE] >= 0).all() and np.isfinite(values).all():
        return
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        raise DispatchInputError(
            name,
            f"must be finite on valid pairs, got NaN or infinity (row {rows[_first_row(bad)]})",
            "not_finite",
        )
    for column, label in ((ETA, "ETA minutes"), (COST, "cost")):
        negative = values[:, column] < 0
        if negative.any():
            raise DispatchInputError(
                name,
                f"{label} must be >= 0 on valid pairs (row {rows[_first_row(negative)]})",
                "range",
            )


def checked_counts(name: str, value: ArrayLike, num_riders: int) -> NDArray[np.int64]:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise DispatchInputError(name, f"must be INT32, got {array.dtype}", "dtype")
    if array.shape != (num_riders,):
        raise DispatchInputError(
            name, f"must have shape [{num_riders}] like RIDER_IDS, got {array.shape}", "shape"
        )
    counts = array.astype(np.int64)
    negative = counts < 0
    if negative.any():
        row = _first_row(negative)
        raise DispatchInputError(name, f"must be >= 0 (row {row})", "range")
    return counts


def checked_rider_ids(value: ArrayLike) -> NDArray[Any]:
    array = np.asarray(value)
    if array.dtype.kind not in "OS":
        raise DispatchInputError("RIDER_IDS", f"must be BYTES, got {array.dtype}", "dtype")
    if array.ndim != 1:
        raise DispatchInputError("RIDER_IDS", f"must have shape [R], got {array.shape}", "shape")
    return array


def checked_order_ids(value: ArrayLike, num_orders: int) -> NDArray[Any]:
    """ORDER_IDS as the resolver takes them: BYTES [B], one per order of the candidates
    (the encoder checked their content; here they only break ties)."""
    array = np.asarray(value)
    if array.dtype.kind not in "OS":
        raise DispatchInputError("ORDER_IDS", f"must be BYTES, got {array.dtype}", "dtype")
    if array.shape != (num_orders,):
        raise DispatchInputError(
            "ORDER_IDS",
            f"must have shape [{num_orders}], one per order of {CANDIDATE_RIDER_INDEX.name}, "
            f"got {list(array.shape)}",
            "shape",
        )
    return array
