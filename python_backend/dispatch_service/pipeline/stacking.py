"""Stack-aware resolution: re-score the orders a rider receives together, then re-solve.

The resolver scores each pair as if it were the rider's only new order. Where the model is
reachable (this layer: `DispatchPipeline`, `FusedDispatch`, the offline evaluation), the
assignment is refined until it agrees with its own scores:

1. resolve with the model's scores;
2. for every assigned order whose rider got an earlier new order in this window
   (`domain.stacking.stacked_extra_load`), re-load its pair features with that extra load
   and re-score it with the model;
3. resolve again with those pairs' objectives replaced; repeat until every assigned pair's
   objectives were scored with the load it really rides with, at most ``MAX_ROUNDS`` solves.
   A re-scored pair keeps its stacked figures after its order moves elsewhere (so the
   assignment settles instead of oscillating), which can also show in its Top-K entry.

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

from dispatch_service.domain.feasibility import spare_slots
from dispatch_service.domain.resolver import Resolution, ResolverSettings, resolve, score_pairs
from dispatch_service.domain.stacking import (
    joining_extra_load,
    stacked_extra_load,
    with_extra_load,
)

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


def _assigned_pairs(
    resolution: Resolution, candidates: NDArray[np.int64], created_at: ArrayLike
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(pair rows, extra loads) of every assigned order; extra 0 when not stacked."""
    assigned = resolution.assigned_rider_index.astype(np.int64)
    extra = stacked_extra_load(created_at, assigned)
    orders = np.flatnonzero(assigned >= 0)
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

    current = base.copy()
    width = candidates.shape[1]
    flat = candidates.reshape(-1)
    valid = np.flatnonzero(flat >= 0)
    pair_orders, pair_riders = valid // width, flat[valid]
    # The extra load each valid pair's objectives in `current` were scored with.
    scored_extra = np.zeros(valid.size, dtype=np.int64)
    spare = spare_slots(rider_load, rider_capacity)[pair_riders]
    position = np.full(flat.size, -1, dtype=np.int64)
    position[valid] = np.arange(valid.size)
    resolution = solve(current)
    rounds, converged = 1, False
    while True:
        # Every pair is scored with the load it would ride with if its order took that
        # rider now, not only the assigned ones: the next solve then sees what joining
        # each busy rider costs. Pairs that are not assigned only ever grow their extra
        # load (no rider it cannot fit), so the solves cannot cycle through the same
        # states; the assigned pairs always get their true load.
        joining = joining_extra_load(
            created_at, resolution.assigned_rider_index, pair_orders, pair_riders
        )
        joining = np.where(joining < spare, joining, 0)
        extra = np.maximum(scored_extra, joining)
        assigned_rows, assigned_extra = _assigned_pairs(resolution, candidates, created_at)
        extra[position[assigned_rows]] = assigned_extra
        stale = np.flatnonzero(scored_extra != extra)
        if not stale.size:
            converged = True
            break
        scored_extra[stale] = extra[stale]
        rows, load = valid[stale], extra[stale]
        stacked = load > 0
        current[rows[~stacked]] = base[rows[~stacked]]
        if stacked.any():
            current[rows[stacked]] = rescore(
                rows[stacked], with_extra_load(features[rows[stacked]], load[stacked])
            )
        if rounds >= max_rounds:
            resolution = _patched(resolution, current, candidates, weights, settings)
            break
        resolution = solve(current)
        rounds += 1
    rows, _ = _assigned_pairs(resolution, candidates, created_at)
    orders = rows // candidates.shape[1]
    assigned_objectives = np.zeros((resolution.assigned_rider_index.size, 3), dtype=np.float32)
    assigned_objectives[orders] = current[rows]
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
