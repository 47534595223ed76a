"""The policies the evaluation judges: each decides a simulated window's assignment.

Policies (each sees the same windows and, through common random numbers, the same luck):

- ``nearest_rider``: first come first served, nearest feasible rider (`baseline`);
- ``distance_matching``: maximum-cardinality, minimum-total-distance assignment over every
  feasible rider (scipy); its assigned count is the most any policy can serve;
- ``rule_eta``: straight-line km x 1.3 / vehicle speed + 3 min per carried order
  (`baseline.rule_objectives`) through the project's resolver, stack-aware like the model;
- ``model_v1``, ``model_v2`` (or any model given): the served steps -- encoder and resolver
  configured from the repository's config.pbtxt, the ONNX model in ONNX Runtime with the
  served session options -- with stack-aware re-scoring (`pipeline.stacking`);
- ``oracle``: the simulator's noise-free expectations (stack-aware too) over 32 candidates
  per order, solved exactly by the resolver under the request's OBJECTIVE_WEIGHTS: the best
  the project's own weighted objective can do. Not deployable: it reads the ground truth;
- ``minutes_oracle``: what users feel, optimised alone: the most orders served, then the
  least expected delivery minutes (from creation, an unassigned order at its promise plus
  the penalty, as the report counts it), over every feasible pair of the window. Exact for
  the rider-slot model (scipy's linear_sum_assignment on orders x rider slots, the k-th slot
  of a rider priced at k orders of extra load); the simulator then stacks a rider's orders
  in creation order, which can only cost more than the slot order the solver chose. The gap
  between the two oracles is what the weights cost in minutes (and buy in cost and
  lateness); the gap between a model and ``oracle`` is what prediction error costs.

Each oracle is judged on what it optimises: ``minutes_oracle`` on delivery minutes,
``oracle`` on the request's weighted objective evaluated on ground truth
(`ground_truth_objective`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, PAIR_FEATURE_NAMES
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.domain.feasibility import spare_slots
from dispatch_service.domain.features import (
    EncodedWindow,
    EncoderSettings,
    encode_window,
    feasible_mask,
)
from dispatch_service.domain.scoring import ResolverSettings, score_pairs
from dispatch_service.domain.window import DispatchWindow, check_objective_weights
from dispatch_service.offline import baseline, simulator
from dispatch_service.pipeline.dispatch_pipeline import repository_steps
from dispatch_service.pipeline.stacking import Rescorer, StackedResolution, resolve_stack_aware
from dispatch_service.pipeline.steps import DispatchModelStep

__all__ = [
    "BASELINE",
    "MINUTES_ORACLE",
    "ORACLE_CANDIDATES",
    "Decision",
    "ObjectiveJudge",
    "Policy",
    "Weights",
    "default_policies",
    "distance_matching_policy",
    "ground_truth_objective",
    "minutes_oracle_policy",
    "model_policy",
    "nearest_rider_policy",
    "oracle_policy",
    "order_objective",
    "rule_eta_policy",
]

BASELINE: Final = "rule_eta"  # the policy every interval is taken against
MINUTES_ORACLE: Final = "minutes_oracle"
ORACLE_CANDIDATES: Final = 32
Weights = tuple[float, float, float]  # OBJECTIVE_WEIGHTS: latency, on-time, cost


@dataclass(frozen=True, eq=False)
class Decision:
    """One window's assignment, and what the policy predicted for its pairs (if anything)."""

    assigned: NDArray[np.int64]  # [B] rider row, -1 = unassigned
    # [B, 3] reported (stack-aware) objectives of each assigned pair; None: not a predictor
    predicted: NDArray[np.float32] | None = None
    # every scored candidate pair: order rows, rider rows, stand-alone [n, 3] objectives
    pair_orders: NDArray[np.int64] | None = None
    pair_riders: NDArray[np.int64] | None = None
    pair_predicted: NDArray[np.float32] | None = None


# A policy decides a window of a simulated city (its world: the map the served encoder
# reads, and the ground truth only the oracle may read).
Policy = Callable[[DispatchWindow, simulator.CityConfig], Decision]


def nearest_rider_policy(window: DispatchWindow, world: simulator.CityConfig) -> Decision:
    return Decision(baseline.nearest_rider_assignment(window).astype(np.int64))


def distance_matching_policy(window: DispatchWindow, world: simulator.CityConfig) -> Decision:
    return Decision(baseline.distance_matching_assignment(window).astype(np.int64))


Scorer = Callable[[NDArray[np.float32]], NDArray[np.float32]]


def _resolve(
    window: DispatchWindow,
    encoded: EncodedWindow,
    objectives: NDArray[np.float32],
    *,
    rescore: Rescorer,
    weights: NDArray[np.float64],
    resolver: ResolverSettings,
) -> StackedResolution:
    """The served resolver over one encoded window, stacked pairs priced by ``rescore``."""
    return resolve_stack_aware(
        objectives,
        encoded.pair_features,
        candidate_rider_index=encoded.candidate_rider_index,
        created_at=window.created_at,
        rider_ids=window.rider_ids,
        rider_load=window.rider_load,
        rider_capacity=window.rider_capacity,
        weights=weights,
        rescore=rescore,
        settings=resolver,
    )


def _scored_policy(
    encoder: EncoderSettings, resolver: ResolverSettings, score: Scorer, weights: Weights
) -> Policy:
    """Encode, score every candidate pair, resolve stack-aware with the same scorer."""
    w = _checked_weights(weights)

    def decide(window: DispatchWindow, world: simulator.CityConfig) -> Decision:
        encoded = encode_window(window, world.map, encoder, widen_scarce=True)
        candidates = encoded.candidate_rider_index
        objectives = score(encoded.pair_features)
        result = _resolve(
            window,
            encoded,
            objectives,
            rescore=lambda rows, features: score(features),
            weights=w,
            resolver=resolver,
        )
        flat = candidates.reshape(-1)
        valid = np.flatnonzero(flat >= 0)
        return Decision(
            assigned=result.resolution.assigned_rider_index.astype(np.int64),
            predicted=result.resolution.assigned_objectives,
            pair_orders=valid // candidates.shape[1],
            pair_riders=flat[valid].astype(np.int64),
            pair_predicted=objectives[valid],
        )

    return decide


def _served_settings(repository: Path) -> tuple[EncoderSettings, ResolverSettings]:
    encoder, resolver = repository_steps(repository)
    return encoder.encoder, resolver.settings


def _checked_weights(weights: Weights) -> NDArray[np.float64]:
    """The OBJECTIVE_WEIGHTS a caller would send, checked by the same rule."""
    return check_objective_weights(np.asarray(weights, dtype=np.float64))


def model_policy(
    model_path: str | Path,
    repository: Path = MODEL_REPOSITORY,
    weights: Weights = DEFAULT_OBJECTIVE_WEIGHTS,
) -> Policy:
    """The served decision: the repository's encoder and resolver settings, the model in
    ONNX Runtime with the served session options, stack-aware re-scoring; ``weights`` as a
    request's OBJECTIVE_WEIGHTS."""
    encoder, resolver = _served_settings(repository)
    step = DispatchModelStep.from_parameters(
        model_path, config_parameters(model_layout(repository, SCORING_MODEL).config)
    )
    return _scored_policy(encoder, resolver, step.scorer.infer, weights)


def rule_eta_policy(
    repository: Path = MODEL_REPOSITORY, weights: Weights = DEFAULT_OBJECTIVE_WEIGHTS
) -> Policy:
    """The rule ETA (`baseline.rule_objectives`) through the served encoder and resolver."""
    encoder, resolver = _served_settings(repository)
    return _scored_policy(encoder, resolver, baseline.rule_objectives, weights)


def oracle_policy(
    repository: Path = MODEL_REPOSITORY, weights: Weights = DEFAULT_OBJECTIVE_WEIGHTS
) -> Policy:
    """Ground-truth expectations (stacking included) over 32 candidates, exact resolver."""
    _, resolver = _served_settings(repository)
    w = _checked_weights(weights)
    encoder = EncoderSettings(candidates_per_order=ORACLE_CANDIDATES)

    def decide(window: DispatchWindow, city: simulator.CityConfig) -> Decision:
        encoded = encode_window(window, city.map, encoder)
        candidates = encoded.candidate_rider_index
        width = candidates.shape[1]
        flat = candidates.reshape(-1)
        valid = np.flatnonzero(flat >= 0)

        def truth(rows: NDArray[np.int64], extra: NDArray[np.int64] | None) -> NDArray[np.float32]:
            expected = simulator.expected_outcome(
                window, rows // width, flat[rows], city, extra_load=extra
            )
            return np.stack(expected, axis=1).astype(np.float32)

        objectives = np.zeros((flat.size, 3), dtype=np.float32)
        objectives[valid] = truth(valid, None)
        load_column = encoded.pair_features[:, _LOAD_COLUMN]

        def rescore(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
            extra = (features[:, _LOAD_COLUMN] - load_column[rows]).astype(np.int64)
            return truth(rows, extra)

        result = _resolve(
            window, encoded, objectives, rescore=rescore, weights=w, resolver=resolver
        )
        return Decision(result.resolution.assigned_rider_index.astype(np.int64))

    return decide


_LOAD_COLUMN: Final = PAIR_FEATURE_NAMES.index("rider_load")
# The minutes oracle's prices: an order left unassigned costs this much more than any
# assignment's minutes (so the most orders come first), a forbidden pair more again.
_UNSERVED_MINUTES: Final = 1e6
_FORBIDDEN_MINUTES: Final = 1e9


def minutes_oracle_policy(window: DispatchWindow, city: simulator.CityConfig) -> Decision:
    """The most orders, then the least expected delivery minutes: every feasible pair of the
    window priced by the simulator's expectations, one column per rider slot (the k-th at k
    orders of extra load), one private "unassigned" column per order."""
    num_orders = window.num_orders
    spare = np.minimum(spare_slots(window.rider_load, window.rider_capacity), num_orders)
    slot_rider = np.repeat(np.arange(window.num_riders), spare)
    slot_extra = np.arange(slot_rider.size) - np.repeat(np.cumsum(spare) - spare, spare)
    orders, slots = np.nonzero(feasible_mask(window)[:, slot_rider])
    eta, _, _ = simulator.expected_outcome(
        window, orders, slot_rider[slots], city, extra_load=slot_extra[slots]
    )
    age = (window.dispatch_time - window.created_at.astype(np.float64)) / 60.0
    minutes = np.full((num_orders, slot_rider.size), _FORBIDDEN_MINUTES)
    minutes[orders, slots] = age[orders] + eta
    unserved = np.full((num_orders, num_orders), _FORBIDDEN_MINUTES)
    penalty = window.promised_minutes.astype(np.float64) + simulator.UNASSIGNED_PENALTY_MINUTES
    np.fill_diagonal(unserved, _UNSERVED_MINUTES + penalty)
    rows, cols = linear_sum_assignment(np.concatenate((minutes, unserved), axis=1))
    assigned = np.full(num_orders, -1, dtype=np.int64)
    served = cols < slot_rider.size
    assigned[rows[served]] = slot_rider[cols[served]]
    return Decision(assigned)


def order_objective(
    objectives: NDArray[np.float64],
    num_orders: int,
    weights: Weights,
    settings: ResolverSettings,
) -> float:
    """The weighted objective the resolver maximises, per order: each served pair's score
    (`scoring.score_pairs` of its [eta, on-time, cost] row) summed, an unassigned order
    adding 0, over the window's ``num_orders``."""
    if num_orders < 1:
        raise ValueError(f"a window has at least one order, got {num_orders}")
    scores = score_pairs(objectives.reshape(-1, 3), _checked_weights(weights), settings)
    return float(scores.sum() / num_orders)


# One decision's ground-truth objective: (window, world, rider row per order or -1, the
# orders each rider carries before it in this window) -> the objective per order.
ObjectiveJudge = Callable[
    [DispatchWindow, simulator.CityConfig, NDArray[np.int64], NDArray[np.int64]], float
]


def ground_truth_objective(
    repository: Path = MODEL_REPOSITORY, weights: Weights = DEFAULT_OBJECTIVE_WEIGHTS
) -> ObjectiveJudge:
    """What ``oracle`` maximises, for any decision: every served pair's objectives at the
    simulator's noise-free expectations, with the load it is carried with (the simulator's
    stacking), scored under ``weights`` and the served resolver's scales (`order_objective`)."""
    _, resolver = _served_settings(repository)

    def judge(
        window: DispatchWindow,
        city: simulator.CityConfig,
        assigned: NDArray[np.int64],
        extra_load: NDArray[np.int64],
    ) -> float:
        rows = np.flatnonzero(assigned >= 0)
        expected = simulator.expected_outcome(
            window, rows, assigned[rows], city, extra_load=extra_load[rows]
        )
        return order_objective(np.stack(expected, axis=1), window.num_orders, weights, resolver)

    return judge


def default_policies(
    models: Mapping[str, Path],
    repository: Path = MODEL_REPOSITORY,
    weights: Weights = DEFAULT_OBJECTIVE_WEIGHTS,
) -> dict[str, Policy]:
    """The baselines, the given models (name -> model.onnx) and the oracle, in report order;
    the scored ones all resolve with ``weights``."""
    return {
        "nearest_rider": nearest_rider_policy,
        "distance_matching": distance_matching_policy,
        BASELINE: rule_eta_policy(repository, weights),
        **{name: model_policy(path, repository, weights) for name, path in models.items()},
        "oracle": oracle_policy(repository, weights=weights),
        MINUTES_ORACLE: minutes_oracle_policy,
    }
