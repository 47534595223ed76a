"""Stack-aware resolution: re-score the orders a rider receives together, then re-solve.

The resolver scores each pair as if it were the rider's only new order. Where the model is
reachable (this layer: `DispatchPipeline`, `FusedDispatch`, the offline evaluation), the
assignment is refined until it agrees with its own scores:

1. resolve with the model's scores;
2. for every assigned order whose rider got an earlier new order in this window
   (`domain.stacking.stacked_extra_load`), re-load its pair features with that extra load
   and re-score it with the model;
3. resolve again with those pairs' objectives replaced (all other pairs keep the model's
   stand-alone scores); repeat until the stacked pairs and their loads stop changing, at most
   ``MAX_ROUNDS`` solves.

A window whose first assignment stacks nothing costs one solve, as before. If the rounds run
out before the assignment settles, the assignment of the last solve is kept and its stacked
pairs' outputs (assigned score, their Top-K entries) are replaced by the stack-aware ones, so
the reported figures of an assigned pair always reflect the rider's other new orders.

The `dispatch` ensemble cannot do this: its `topk_resolver` step has no model to re-score
with, so there the stacked orders keep their stand-alone scores (see the report of issue 12).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_service.domain.resolver import Resolution, ResolverSettings, resolve, score_pairs
from dispatch_service.domain.stacking import stacked_extra_load, with_extra_load

__all__ = [
    "MAX_ROUNDS",
    "Rescorer",
    "StackedResolution",
    "resolve_stack_aware",
]

MAX_ROUNDS: Final = 4
# (pair rows, their feature rows with the extra load) -> [n, 3] objectives.
Rescorer = Callable[[NDArray[np.int64], NDArray[np.float32]], NDArray[np.float32]]


@dataclass(frozen=True, eq=False)
class StackedResolution:
    """The final resolution, the objectives it used, and how it got there."""

    resolution: Resolution
    objectives: NDArray[np.float32]  # [P, 3]: the model's, stacked pairs re-scored
    assigned_objectives: NDArray[np.float32]  # [B, 3]: of each order's assigned pair; 0 if none
    rounds: int
    converged: bool


def _stacked_pairs(
    resolution: Resolution, candidates: NDArray[np.int64], created_at: ArrayLike
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(pair rows, extra loads) of the assigned orders that ride with earlier new orders."""
    assigned = resolution.assigned_rider_index.astype(np.int64)
    extra = stacked_extra_load(created_at, assigned)
    orders = np.flatnonzero((assigned >= 0) & (extra > 0))
    columns = np.argmax(candidates[orders] == assigned[orders, None], axis=1)
    return orders * candidates.shape[1] + columns, extra[orders]


def resolve_stack_aware(
    objectives: NDArray[np.float32],
    features: NDArray[np.float32],
    candidate_rider_index: NDArray[np.integer[Any]],
    created_at: ArrayLike,
    rider_ids: ArrayLike,
    rider_load: ArrayLike,
    rider_capacity: ArrayLike,
    weights: ArrayLike,
    rescore: Rescorer,
    settings: ResolverSettings | None = None,
    max_rounds: int = MAX_ROUNDS,
) -> StackedResolution:
    """`resolve` made consistent with the stacking its own assignment creates (module doc)."""
    candidates = np.asarray(candidate_rider_index).astype(np.int64)
    base = np.asarray(objectives, dtype=np.float32)

    def solve(current: NDArray[np.float32]) -> Resolution:
        return resolve(
            current, candidates, rider_ids, rider_load, rider_capacity, weights, settings
        )

    current = base
    resolution = solve(current)
    used: tuple[bytes, bytes] = (b"", b"")
    rounds, converged = 1, False
    while True:
        rows, extra = _stacked_pairs(resolution, candidates, created_at)
        key = (rows.tobytes(), extra.tobytes())
        if key == used:
            converged = True
            break
        current = base.copy()
        if rows.size:
            current[rows] = rescore(rows, with_extra_load(features[rows], extra))
        if rounds >= max_rounds:
            resolution = _patched(resolution, current, candidates, weights, settings)
            break
        resolution = solve(current)
        used = key
        rounds += 1
    assigned = resolution.assigned_rider_index.astype(np.int64)
    orders = np.flatnonzero(assigned >= 0)
    columns = np.argmax(candidates[orders] == assigned[orders, None], axis=1)
    assigned_objectives = np.zeros((assigned.size, 3), dtype=np.float32)
    assigned_objectives[orders] = current[orders * candidates.shape[1] + columns]
    return StackedResolution(resolution, current, assigned_objectives, rounds, converged)


def _patched(
    resolution: Resolution,
    current: NDArray[np.float32],
    candidates: NDArray[np.int64],
    weights: ArrayLike,
    settings: ResolverSettings | None,
) -> Resolution:
    """The last assignment with its assigned pairs' reported figures taken from ``current``
    (stack-aware for that assignment; the last solve may have used an earlier stacking)."""
    assigned = resolution.assigned_rider_index.astype(np.int64)
    orders = np.flatnonzero(assigned >= 0)
    if orders.size == 0:
        return resolution
    riders = assigned[orders]
    columns = np.argmax(candidates[orders] == riders[:, None], axis=1)
    rows = orders * candidates.shape[1] + columns
    scores = score_pairs(current[rows], weights, settings).astype(np.float32)
    assigned_score = resolution.assigned_score.copy()
    assigned_score[orders] = scores
    topk = [
        resolution.topk_score.copy(),
        resolution.topk_eta_minutes.copy(),
        resolution.topk_ontime_probability.copy(),
        resolution.topk_cost.copy(),
    ]
    hit = resolution.topk_rider_index[orders] == riders[:, None]
    for i, slot in zip(*np.nonzero(hit), strict=True):
        b = orders[i]
        for array, value in zip(topk, (scores[i], *current[rows[i]]), strict=True):
            array[b, slot] = value
    return replace(
        resolution,
        assigned_score=assigned_score,
        topk_score=topk[0],
        topk_eta_minutes=topk[1],
        topk_ontime_probability=topk[2],
        topk_cost=topk[3],
    )
