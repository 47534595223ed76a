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

Cost: the rounds give the same answer as one full `resolve` per round, for less. The
window's tensors are checked once (`ResolverWindow`) and its solver graph built once, and
only when a solve needs it (`AssignmentGraph`: only the costs change; a first assignment the
uncontested shortcut settles needs none); a round re-scores only the stale pairs (one
model call), updates their scores and solves for the assignment alone; the Top-K lists are
ranked once, from the objectives of the last solve. What remains is the exact solve itself:
a window that does not settle runs ``MAX_ROUNDS`` of them (LAPJVsp, whose cost grows with
rows x columns: several ms each on a 1,000 x 5,000 window; ``python -m perf.resolver_time``).

The `dispatch` ensemble cannot do this: its `topk_resolver` step has no model to re-score
with, so there the stacked orders keep their stand-alone scores (see the report of issue 12).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_service.domain.resolver import (
    Resolution,
    ResolverSettings,
    ResolverWindow,
    score_pairs,
)
from dispatch_service.domain.stacking import JoiningLoad, with_extra_load

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


def _assigned_rows(assigned: NDArray[np.int64], candidates: NDArray[np.int64]) -> NDArray[np.int64]:
    """The pair row (b * N + j) of every assigned order, in order."""
    orders = np.flatnonzero(assigned >= 0)
    columns: NDArray[np.int64] = np.argmax(candidates[orders] == assigned[orders, None], axis=1)
    return orders * candidates.shape[1] + columns


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
    # Checked once; each round then changes only the objectives and scores of the pairs it
    # re-scores, and solves for the assignment alone over a graph built once. The Top-K
    # lists are ranked once, at the end, from the objectives of the last solve.
    window = ResolverWindow.checked(
        candidate_rider_index, rider_ids, rider_load, rider_capacity, weights, settings
    )
    candidates = window.candidates
    base = np.asarray(objectives, dtype=np.float32)
    checked = window.objectives(base)  # [B, N, 3] float64, as `current` holds them
    scores = window.scores(checked)

    current = base.copy()
    width = candidates.shape[1]
    flat = candidates.reshape(-1)
    valid = np.flatnonzero(flat >= 0)
    pair_orders, pair_riders = valid // width, flat[valid]
    joining_load = JoiningLoad.of(created_at, pair_orders, pair_riders)
    # The extra load each valid pair's objectives in `current` were scored with.
    scored_extra = np.zeros(valid.size, dtype=np.int64)
    spare = window.spare[pair_riders]
    position = np.full(flat.size, -1, dtype=np.int64)
    position[valid] = np.arange(valid.size)
    assigned = window.assign(scores)
    solved = checked  # the objectives of the last solve
    rounds, converged = 1, False
    while True:
        # Every pair is scored with the load it would ride with if its order took that
        # rider now, not only the assigned ones: the next solve then sees what joining
        # each busy rider costs. Pairs that are not assigned only ever grow their extra
        # load (no rider it cannot fit), so the solves cannot cycle through the same
        # states; the assigned pairs always get their true load (`stacked_extra_load`,
        # which is what `joining_extra_load` gives an assigned pair; never over its spare).
        joining = joining_load(assigned)
        joining = np.where(joining < spare, joining, 0)
        extra = np.maximum(scored_extra, joining)
        taken = position[_assigned_rows(assigned, candidates)]
        extra[taken] = joining[taken]
        stale = np.flatnonzero(scored_extra != extra)
        if not stale.size:
            converged = True
            break
        last = rounds >= max_rounds  # this round's re-scoring gets no solve: patched below
        if last:
            solved = checked.copy()
        scored_extra[stale] = extra[stale]
        rows, load = valid[stale], extra[stale]
        stacked = load > 0
        current[rows[~stacked]] = base[rows[~stacked]]
        if stacked.any():
            current[rows[stacked]] = rescore(
                rows[stacked], with_extra_load(features[rows[stacked]], load[stacked])
            )
        window.update(checked, scores, rows, current[rows])
        if last:
            break
        # Straight to the full solve: the first solve's uncontested shortcut (`assign`) gives
        # the same answer when it applies, which it did not once in the evaluation's windows.
        assigned = window.graph.solve(scores)
        rounds += 1
    resolution = window.resolution(solved, assigned)
    rows = _assigned_rows(assigned, candidates)
    if not converged:
        resolution = _patched(resolution, current, rows, window)
    assigned_objectives = np.zeros((assigned.size, 3), dtype=np.float32)
    assigned_objectives[rows // width] = current[rows]
    return StackedResolution(resolution, current, assigned_objectives, rounds, converged)


def _patched(
    resolution: Resolution,
    current: NDArray[np.float32],
    rows: NDArray[np.int64],
    window: ResolverWindow,
) -> Resolution:
    """The last assignment with its assigned pairs' (``rows``) reported figures taken from
    ``current`` (stack-aware for that assignment; the last solve used an earlier stacking)."""
    if rows.size == 0:
        return resolution
    orders = rows // window.candidates.shape[1]
    riders = resolution.assigned_rider_index[orders]
    scores = score_pairs(current[rows], window.weights, window.settings).astype(np.float32)
    assigned_score = resolution.assigned_score.copy()
    assigned_score[orders] = scores
    # Where the assigned rider is in its order's Top-K list, that entry too.
    hit, slot = np.nonzero(resolution.topk_rider_index[orders] == riders[:, None])
    at = (orders[hit], slot)
    topk = {}
    for name, values in (
        ("topk_score", scores[hit]),
        ("topk_eta_minutes", current[rows[hit], 0]),
        ("topk_ontime_probability", current[rows[hit], 1]),
        ("topk_cost", current[rows[hit], 2]),
    ):
        array = getattr(resolution, name).copy()
        array[at] = values
        topk[name] = array
    return replace(resolution, assigned_score=assigned_score, **topk)
