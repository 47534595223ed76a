"""Stack-aware resolution: the solve prices a rider's second and later new orders with the
load they ride with, and the answer reports every pair at its real load.

The model scores each pair as if it were the rider's only new order. A rider who takes
several new orders in one window carries them one after another (`domain.stacking`): the
k-th rides with k - 1 more orders than the rider carries now, so its ETA is longer and its
on-time chance lower than the model's stand-alone figures. Where the model is
reachable (this layer: `DispatchPipeline`, `FusedDispatch`, the offline evaluation):

1. every pair whose rider has more than one slot (``c_r = min(spare_r, deg_r)``,
   `domain.slots`) is scored again with 1 .. c_r - 1 extra orders: one model call for the
   whole window;
2. one exact solve over the rider slots (`AssignmentGraph.solve_ranked`): rider r's slot of
   rank k carries what the order scores as r's (k+1)-th new order, never more than at a
   lower rank (so a rider's slots fill in rank order). Most orders first, then the largest
   total of these stack-aware scores;
3. the figures are the model's at the load each pair rides with: an assigned order with its
   rider's other new orders created before it (creation order, as the simulator realises
   it: `stacked_extra_load`), any other pair with the load it would ride with if its order
   took that rider now (`joining_extra_load`; 0 where the rider is full). Every such load is
   below the rider's slot count, so step 1 scored it: no second call. Orders created in the
   same second are carried in order-id order (ORDER_IDS; by row without them), so the loads,
   like the solve (`ResolverWindow.assign`), do not depend on how the window is listed.

The solve may rank a rider's orders in whichever order prices them best, while the rider
carries them in creation order: its total can flatter an assignment, the reported figures
never do. A window where no rider has two slots (one order, or a spare capacity of one
everywhere) makes no model call and answers as the plain `resolve`, byte for byte.

One model call and one solve per window; ``python -m perf.resolver_time`` measures it.

Every entry point resolves this way when `topk_resolver`'s config says ``stack_aware``
(`StackingSettings`, on by default): `dispatch_fused` and `DispatchPipeline` re-score in
process, the `dispatch` ensemble's `topk_resolver` step through BLS calls of the
`dispatch_model` version that scored each order (`routed_rescorer` for both), so the two entry
points still answer alike and the offline evaluation's figures are those of the served path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import OBJECTIVES
from dispatch_service.domain.resolver import Resolution, ResolverWindow
from dispatch_service.domain.scoring import ResolverSettings
from dispatch_service.domain.slots import slot_counts, slot_edges
from dispatch_service.domain.stacking import joining_extra_load, with_extra_load
from dispatch_service.routing.engine import ModelCallError, SyncScorer

__all__ = [
    "Rescorer",
    "StackedResolution",
    "StackingSettings",
    "Unstacked",
    "can_stack",
    "resolve_stack_aware",
    "routed_rescorer",
    "stage_checked",
    "stage_stack_aware",
]

# (pair rows, their feature rows with the extra load) -> [n, 3] objectives.
Rescorer = Callable[[NDArray[np.int64], NDArray[np.float32]], NDArray[np.float32]]


@dataclass(frozen=True)
class StackingSettings:
    """`topk_resolver`'s ``stack_aware`` parameter, read by every entry point's resolver.

    Off: each pair keeps its stand-alone objectives (faster; a rider's later new orders look
    as good as its first). On: this module's resolution wherever a model can re-score.
    """

    stack_aware: bool = True
    # The ensemble's resolver re-scores through BLS calls: each waits at most this long in
    # dispatch_model's queue, then those pairs keep their stand-alone objectives.
    rescore_timeout_ms: int = 2000

    def __post_init__(self) -> None:
        if not 0 < self.rescore_timeout_ms <= 60_000:
            raise ValueError(
                f"rescore_timeout_ms must be in (0, 60000], got {self.rescore_timeout_ms!r}"
            )


def routed_rescorer(
    objectives: NDArray[np.float32],
    order_versions: NDArray[np.integer[Any]],
    width: int,
    score: SyncScorer,
) -> Rescorer:
    """Pair rows re-scored by the version that scored their order (one call per version).

    Orders on the rule-based fallback (version 0) and orders whose version's call fails
    (`ModelCallError`) keep ``objectives``: the resolution still prices their stacking with
    what it has. ``width``: candidates per order (pair row // width = its order).
    """
    versions_of = np.asarray(order_versions).reshape(-1)

    def rescore(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
        out = np.array(objectives[rows], dtype=np.float32)
        versions = versions_of[rows // width]
        for version in np.unique(versions[versions > 0]).tolist():
            mask = versions == version
            try:  # every row one version's (the usual window): no copy of the features
                out[mask] = score(int(version), features if mask.all() else features[mask])
            except ModelCallError:
                continue
        return out

    return rescore


@dataclass(frozen=True, eq=False)
class StackedResolution:
    """The resolution, the objectives it reports, and how much the model scored again."""

    resolution: Resolution
    objectives: NDArray[np.float32]  # [P, 3]: each valid pair at the load it rides with now
    rescored: int  # pair rows scored again with extra load (0: nothing could stack)


@dataclass(frozen=True, eq=False)
class Unstacked:
    """A window where nothing stacks (no rider can take two new orders): its plain resolution
    is left to the caller, which may resolve several such windows at once (`resolve_many`)."""

    window: ResolverWindow
    checked: NDArray[np.float64]  # [B, N, 3], as `ResolverWindow.objectives` checks them
    objectives: NDArray[np.float32]  # [P, 3]: what the stacked resolution reports

    def resolved(self) -> StackedResolution:
        """Its resolution alone, as `resolve_stack_aware` reports it."""
        return StackedResolution(self.window.resolution(self.checked), self.objectives, 0)


def can_stack(windows: Sequence[ResolverWindow]) -> list[bool]:
    """Whether some rider of each window can take two of its new orders (`domain.slots`: a
    slot count ``c_r = min(spare_r, deg_r)`` of 2 or more). Where none can, the stack-aware
    resolution is the plain one. Several windows in one pass, as one window whose riders
    are each window's own, in blocks."""
    if len(windows) == 1:  # one window (dispatch_fused's `run`): no blocks to shift
        (window,) = windows
        if window.candidates.shape[0] < 2:  # one order: no rider is listed twice
            return [False]
        listed = window.candidates[window.candidates >= 0].astype(np.int64)
        return [bool((slot_counts(listed, window.spare) >= 2).any())]
    if not windows:
        return []
    riders = [window.spare.size for window in windows]
    first_rider = np.cumsum([0, *riders[:-1]])
    picked = [
        window.candidates[window.candidates >= 0] + first
        for window, first in zip(windows, first_rider.tolist(), strict=True)
    ]
    spare = np.concatenate([window.spare for window in windows])
    slots = slot_counts(np.concatenate(picked).astype(np.int64), spare)
    owner = np.repeat(np.arange(len(windows)), riders)
    stacking = np.bincount(owner[slots >= 2], minlength=len(windows))
    return [bool(count) for count in stacking.tolist()]


def resolve_stack_aware(
    objectives: NDArray[np.float32],
    features: NDArray[np.float32],
    *,
    candidate_rider_index: NDArray[np.integer[Any]],
    created_at: ArrayLike,
    rider_ids: ArrayLike,
    rider_load: ArrayLike,
    rider_capacity: ArrayLike,
    weights: ArrayLike,
    rescore: Rescorer,
    settings: ResolverSettings | None = None,
    order_ids: ArrayLike | None = None,
) -> StackedResolution:
    """`resolve` with stacked orders priced and reported at their real load (module doc);
    ``order_ids`` break exact ties between orders (else their rows do)."""
    staged = stage_stack_aware(
        objectives,
        features,
        candidate_rider_index=candidate_rider_index,
        created_at=created_at,
        rider_ids=rider_ids,
        rider_load=rider_load,
        rider_capacity=rider_capacity,
        weights=weights,
        rescore=rescore,
        settings=settings,
        order_ids=order_ids,
    )
    return staged.resolved() if isinstance(staged, Unstacked) else staged


def stage_stack_aware(
    objectives: NDArray[np.float32],
    features: NDArray[np.float32],
    *,
    candidate_rider_index: NDArray[np.integer[Any]],
    created_at: ArrayLike,
    rider_ids: ArrayLike,
    rider_load: ArrayLike,
    rider_capacity: ArrayLike,
    weights: ArrayLike,
    rescore: Rescorer,
    settings: ResolverSettings | None = None,
    order_ids: ArrayLike | None = None,
) -> StackedResolution | Unstacked:
    """`resolve_stack_aware`, with a window where nothing stacks left `Unstacked`."""
    window = ResolverWindow.checked(
        candidate_rider_index,
        rider_ids=rider_ids,
        rider_load=rider_load,
        rider_capacity=rider_capacity,
        weights=weights,
        settings=settings,
        order_ids=order_ids,
    )
    base = np.asarray(objectives, dtype=np.float32)
    checked = window.objectives(base)  # [B, N, 3] float64, missing candidates zeroed
    return stage_checked(
        window, checked, base=base, features=features, created_at=created_at, rescore=rescore
    )


def stage_checked(
    window: ResolverWindow,
    checked: NDArray[np.float64],
    *,
    base: NDArray[np.float32],
    features: NDArray[np.float32],
    created_at: ArrayLike,
    rescore: Rescorer,
) -> StackedResolution | Unstacked:
    """`stage_stack_aware` of a window already checked (`ResolverWindow.checked`): ``base``
    its PAIR_OBJECTIVES [B*N, 3] as FP32, ``checked`` them as `ResolverWindow.objectives`
    returned them."""
    current = base.copy()
    if not can_stack([window])[0]:
        return Unstacked(window, checked, current)  # nobody can take two new orders
    width = window.candidates.shape[1]
    flat = window.candidates.reshape(-1)
    valid = np.flatnonzero(flat >= 0)
    pair_riders = flat[valid]
    # Each valid pair at every slot of its rider (`domain.slots`: c_r = min(spare_r, deg_r)).
    slots = slot_edges(pair_riders, window.spare)
    depth = int(slots.rank.max()) + 1

    # Step 1: each valid pair at every rank past its rider's first (rank k: k extra orders),
    # one model call.
    later = slots.rank > 0
    load = slots.rank[later]
    rows = valid[slots.edge[later]]
    fresh = np.asarray(rescore(rows, with_extra_load(features, load, rows)), dtype=np.float32)
    by_rank = np.repeat(checked.reshape(-1, 1, len(OBJECTIVES)), depth, axis=1)
    by_rank[rows, load] = window.pair_objectives(rows, fresh)
    rank_scores = window.scores(by_rank.reshape(*window.candidates.shape, depth, -1))
    # Step 2: a later slot never scores above an earlier one, then one exact solve. (That is
    # np.minimum.accumulate along each row, a column at a time: ten times faster on [P, K].)
    ranked = rank_scores.reshape(flat.size, depth)
    for rank in range(1, depth):
        np.minimum(ranked[:, rank - 1], ranked[:, rank], out=ranked[:, rank])
    assigned = window.assign(ranked)

    # Step 3: every valid pair at the load it rides with under this assignment.
    pair_orders = valid // width
    joining = joining_extra_load(
        created_at, assigned, pair_orders, pair_riders, window.order_rank()
    )
    taken = np.bincount(assigned[assigned >= 0], minlength=window.spare.size)
    room = (assigned[pair_orders] == pair_riders) | (taken < window.spare)[pair_riders]
    joining = np.where(room, joining, 0)
    riding = by_rank[valid, joining]
    final = checked.copy()
    final.reshape(-1, len(OBJECTIVES))[valid] = riding
    current[valid] = riding
    return StackedResolution(window.resolution(final, assigned), current, rows.size)
