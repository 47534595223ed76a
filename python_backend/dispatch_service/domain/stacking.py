"""Stacked orders: what a rider's other new orders in the same window do to a pair.

A rider who receives several new orders in one window carries them one after another, in
creation order (ties by order id where the caller gives ``tie``, each order's id rank, else
by row): the k-th picks its order up carrying k more than the rider's
current load. The model scores each pair as if it were the rider's only new order, so for a
stacked order its ETA is too short and its on-time probability too high. These two
functions give the pipeline what it needs to re-score stacked pairs: the extra load of
every assigned order, and the pair features with that load applied. The simulator uses
the same rule to realise an assignment.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import PAIR_FEATURE_NAMES
from dispatch_service.domain import window_kernels

__all__ = [
    "joining_extra_load",
    "stacked_extra_load",
    "with_extra_load",
]

_LOAD: Final = PAIR_FEATURE_NAMES.index("rider_load")
_CAPACITY: Final = PAIR_FEATURE_NAMES.index("rider_capacity")
_RATIO: Final = PAIR_FEATURE_NAMES.index("rider_load_ratio")


def _tie_break(tie: ArrayLike | None, count: int) -> NDArray[Any]:
    """Among equal creation times: ``tie`` (e.g. the orders' id ranks), else the row."""
    return np.arange(count) if tie is None else np.asarray(tie).reshape(-1)


def stacked_extra_load(
    created_at: ArrayLike, assigned: ArrayLike, tie: ArrayLike | None = None
) -> NDArray[np.int64]:
    """Orders given earlier in this window to the same rider, per order (0 when first or
    unassigned); "earlier" is creation order, ties by ``tie`` (e.g. the orders' id ranks:
    then the loads do not depend on how the window lists its orders), else by row."""
    created = np.asarray(created_at).reshape(-1)
    riders = np.asarray(assigned, dtype=np.int64).reshape(-1)
    count = riders.shape[0]
    order = np.lexsort((_tie_break(tie, count), created))
    ranked = riders[order]
    extra_sorted = np.zeros(count, dtype=np.int64)
    valid = ranked >= 0
    if valid.any():
        rows = np.flatnonzero(valid)
        chosen = ranked[rows]
        by_rider = np.argsort(chosen, kind="stable")
        sorted_riders = chosen[by_rider]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_riders)) + 1]
        run_start = np.repeat(starts, np.diff(np.r_[starts, sorted_riders.size]))
        extra_sorted[rows[by_rider]] = np.arange(sorted_riders.size) - run_start
    extra = np.zeros(count, dtype=np.int64)
    extra[order] = extra_sorted
    return extra


def joining_extra_load(
    created_at: ArrayLike,
    assigned: ArrayLike,
    pair_orders: NDArray[np.int64],
    pair_riders: NDArray[np.int64],
    tie: ArrayLike | None = None,
) -> NDArray[np.int64]:
    """For each (order, rider) pair: the extra load the order would ride with if it took that
    rider while every other order keeps its assignment -- the rider's other new orders
    created before it (ties by ``tie``, else by row, as `stacked_extra_load`). For an
    assigned pair it equals `stacked_extra_load`."""
    created = np.asarray(created_at).reshape(-1)
    riders = np.asarray(assigned, dtype=np.int64).reshape(-1)
    count = riders.shape[0]
    rank = np.empty(count, dtype=np.int64)
    rank[np.lexsort((_tie_break(tie, count), created))] = np.arange(count)
    before = np.empty(pair_orders.shape[0], dtype=np.int64)
    window_kernels.orders_before(
        rank,
        riders,
        (pair_orders.astype(np.int64, copy=False), pair_riders.astype(np.int64, copy=False)),
        before,
    )
    return before


def with_extra_load(
    features: NDArray[np.float32], extra: ArrayLike, rows: NDArray[np.int64] | None = None
) -> NDArray[np.float32]:
    """Pair feature rows (``features[rows]``; every row without ``rows``, gathered into one
    copy) with ``extra`` more orders on the rider: load and load ratio move, exactly as the
    encoder would compute them for that load (``features.encode_pairs``)."""
    out: NDArray[np.float32] = (
        np.array(features, dtype=np.float32, copy=True)
        if rows is None
        else np.asarray(features, dtype=np.float32)[rows]
    )
    added = np.asarray(extra, dtype=np.float64).reshape(-1)
    load: NDArray[Any] = out[:, _LOAD].astype(np.float64) + added
    out[:, _LOAD] = load
    out[:, _RATIO] = load / np.maximum(out[:, _CAPACITY].astype(np.float64), 1.0)
    return out
