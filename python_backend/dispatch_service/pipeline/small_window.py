"""dispatch_fused's straight path for the usual small window: one order, a few riders.

Why: a one-order window's scoring and assignment take microseconds, yet the general steps
spend hundreds on numpy calls over a handful of values and on the bookkeeping that serves
many orders, several versions and batches (`perf.window_profile` counts them). Here each
stage of such a window is done directly, and each returns None where the window is not the
kind it handles; the caller (`FeatureEncoderStep.encode`, `FusedDispatch.run`) then runs
that stage's general code on the same values, which also names any rule the window breaks:

- `one_order_candidates`: a one-order window's candidates when every feasible rider is
  ranked exactly (`candidates.preselects` false): the same distances
  (`geo.haversine_km`'s values) ranked in one compiled call (`window_kernels.nearest_first`),
  by (distance, rider id) in plain Python where two riders are equally far;
- its routing: `plain_routing.routed_alone` (every order to one served version, no shadow
  call: one ONNX Runtime call);
- `resolved_one_order`: a one-order window's Top-K list and assignment in one compiled
  call (`window_kernels.one_order_answer`: `resolver`'s keys and
  `assignment.uncontested_best`'s rule; ties and hash collisions go to the general code).

Every answer is the general path's byte for byte: distances, features and checks are the
domain's own functions, the scores `scoring`'s arithmetic on float64 (the same IEEE
operations in the same order), and the ordering and picking over a few values use the
general code's keys. `FusedDispatch.small_windows` turns the path off (tests compare both
on many random windows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    ASSIGNED_OBJECTIVES,
    HARD_CONSTRAINTS,
    OBJECTIVES,
    TOPK_OBJECTIVES,
)
from dispatch_service.domain.candidates import (
    feasible_mask,
    preselects,
    rider_distances,
    rider_feasible_for,
)
from dispatch_service.domain.coverage import cover_maximum_assignment, is_scarce
from dispatch_service.domain.feasibility import spare_slots
from dispatch_service.domain.features import EncoderSettings
from dispatch_service.domain.geo import EARTH_RADIUS_KM
from dispatch_service.domain.hashing import rider_id_hashes
from dispatch_service.domain.ids import id_rank
from dispatch_service.domain.resolver_inputs import checked_objectives
from dispatch_service.domain.scoring import ResolverSettings
from dispatch_service.domain.window import DispatchWindow, parse_objective_weights
from dispatch_service.domain.window_kernels import (
    ANSWERED,
    NOT_USABLE,
    nearest_first,
    one_order_answer,
)
from dispatch_service.pipeline.step_io import Arrays

__all__ = ["one_order_candidates", "resolved_one_order"]

# An order's row repeated, as `ranked_exactly` indexes one order's riders: built once,
# sliced per window (a window ranked exactly has at most this many riders).
_MOST_RANKED: Final = 1024
_ORDER_AT: Final = np.zeros(_MOST_RANKED, dtype=np.int64)
_WIDTH: Final = len(OBJECTIVES)


def one_order_candidates(
    window: DispatchWindow, settings: EncoderSettings
) -> NDArray[np.int32] | None:
    """`features.window_candidates` of a one-order window whose feasible riders are all
    ranked exactly; None for any other window (the general selection then runs)."""
    if window.num_orders != 1:
        return None
    spare = spare_slots(window.rider_load, window.rider_capacity)
    if is_scarce(int(spare.sum()), 1):  # the general selection may list more riders
        return None
    listed = min(settings.candidates_per_order, window.num_riders)
    out = np.full((1, listed), -1, dtype=np.int32)
    if listed == 0:
        return out
    riders = rider_feasible_for(window, int(window.constraints[0]) & HARD_CONSTRAINTS).nonzero()[0]
    count = int(riders.size)
    take = min(listed, count)
    if count > _MOST_RANKED or preselects(take, count):
        return None
    # `ranked_exactly`'s distances for one order: each rider to the pickup, ranked
    if count and not nearest_first(
        (riders, window.rider_position), (window.pickup, 0), EARTH_RADIUS_KM, out[0, :take]
    ):  # co-located riders: their ids decide, as `ranked_exactly` breaks the tie
        distance = rider_distances(
            window.rider_position, riders, window.pickup, _ORDER_AT[:count]
        ).tolist()
        rank = id_rank(window.rider_ids[riders].tolist()).tolist()
        ranked = sorted(range(count), key=lambda i: (distance[i], rank[i]))
        out[0, :take] = riders[ranked[:take]]
    return cover_maximum_assignment(
        out, lambda: feasible_mask(window), spare, window.order_ids, window.rider_ids
    )


def resolved_one_order(
    inputs: Mapping[str, NDArray[Any] | None],
    candidates: NDArray[np.int32],
    objectives: NDArray[np.float32],
    window: DispatchWindow,
    settings: ResolverSettings,
) -> Arrays | None:
    """`TopKResolverStep.run` of a one-order window the encoder validated (``window``,
    its ``candidates``) and the scores of its pairs: the same answer tensors; None where
    the general resolver must decide (an exact tie for the best rider, two listed riders
    with one id hash, unusual tensors). Raises what the resolver raises for bad weights or
    objectives.

    One compiled call (`window_kernels.one_order_answer`): `scoring.score_checked`'s
    arithmetic in the same order on float64, the resolver's ranking keys
    (`ResolverWindow._resolution`) and `assignment.uncontested_best`'s rule."""
    rider_ids = inputs.get("RIDER_IDS")
    if rider_ids is None or window.num_orders != 1 or candidates.shape[0] != 1:
        return None
    weights = parse_objective_weights(inputs.get("OBJECTIVE_WEIGHTS"))
    num_riders = window.num_riders
    width = candidates.shape[1]
    if (
        type(rider_ids) is not np.ndarray
        or rider_ids.dtype.kind not in "OS"
        or rider_ids.shape != (num_riders,)
        or candidates.dtype != np.int32
        or window.rider_load.dtype != np.int32
        or window.rider_capacity.dtype != np.int32
        or objectives.dtype != np.float32
        or objectives.shape != (width, _WIDTH)
        or width == 0
    ):
        return None
    rows = candidates[0]
    listed = rows.tolist()
    ids = rider_ids.tolist()
    used_ids = [ids[row] for row in listed if row >= 0]
    if not all(type(item) is bytes for item in used_ids):
        return None  # ids as text: the general resolver encodes them
    hashes = rider_id_hashes(used_ids).tolist()
    if len(set(hashes)) < len(hashes):
        return None  # the ids must break a hash tie: the general ranking does
    found = iter(hashes)
    rider_hash = np.array([next(found) if row >= 0 else 0 for row in listed], dtype=np.uint64)
    w_eta, w_ontime, w_cost = weights.tolist()
    k = min(settings.top_k, width)
    out = (
        np.empty((1, k), dtype=np.int32),
        np.empty((1, k, _WIDTH + 1), dtype=np.float32),
        np.empty(1, dtype=np.int32),
        np.empty(1, dtype=np.float32),
        np.empty((1, _WIDTH), dtype=np.float32),
    )
    outcome = one_order_answer(
        (rows, objectives, rider_hash),
        (window.rider_load, window.rider_capacity),
        (
            w_eta,
            w_ontime,
            w_cost,
            float(weights.sum(axis=-1)),
            settings.eta_scale_minutes,
            settings.cost_scale_cny,
        ),
        out,
    )
    if outcome == NOT_USABLE:  # the resolver's check names the row and the rule
        checked_objectives(objectives, candidates >= 0)
    if outcome != ANSWERED:
        return None
    topk_index, topk_objectives, assigned, assigned_score, assigned_objectives = out
    return {
        "TOPK_RIDER_INDEX": topk_index,
        TOPK_OBJECTIVES.name: topk_objectives,
        "ASSIGNED_RIDER_INDEX": assigned,
        "ASSIGNED_SCORE": assigned_score,
        ASSIGNED_OBJECTIVES.name: assigned_objectives,
    }
