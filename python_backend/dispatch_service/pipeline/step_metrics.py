"""What the steps' answers say about the dispatch: the observations an answered window records.

Plain functions of a step's outputs (no Triton, unit tested alone): the mean feasible
candidates per order, the orders that lost their top-1 rider to capacity, and which of the
metric families of `core.metrics` each step model records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import CANDIDATE_RIDER_INDEX
from dispatch_service.core.metrics import (
    CANDIDATES_PER_ORDER,
    CAPACITY_CONFLICTS,
    DECISION_RECORDS,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    VALIDATION_REJECTIONS,
    MetricSpec,
    Observation,
    StepObserver,
)
from dispatch_service.core.repository_layout import ENCODER_MODEL, RESOLVER_MODEL

__all__ = [
    "STEP_METRICS",
    "STEP_OBSERVERS",
    "candidates_per_order",
    "capacity_conflicts",
    "encoder_observations",
    "metrics_of",
    "resolver_observations",
]


def candidates_per_order(candidate_rider_index: ArrayLike) -> float:
    """Mean feasible candidates per order of one window (-1 marks no candidate)."""
    index = np.asarray(candidate_rider_index)
    if index.ndim != 2 or index.shape[0] == 0:
        return 0.0
    return float(np.count_nonzero(index >= 0) / index.shape[0])


def capacity_conflicts(
    topk_rider_index: ArrayLike,
    topk_score: ArrayLike,
    assigned_rider_index: ArrayLike,
    assigned_score: ArrayLike,
) -> int:
    """Orders that had a feasible rider but were not given one as good as their top-1.

    Without capacity limits and with stand-alone scores every order would get its top-1
    rider (that is the best assignment by both count and score), so each such order lost to
    capacity, whether it got a worse rider or none. With the stack-aware resolution
    (topk_resolver's ``stack_aware``) an order may also cede its top-1 rider because riding
    with that rider's other new orders would cost them more; those count here too. Compared
    by score, so a tie between the top-1 and the assigned rider is no conflict.
    """
    index = np.asarray(topk_rider_index)
    score = np.asarray(topk_score)
    assigned = np.asarray(assigned_rider_index).reshape(-1)
    got = np.asarray(assigned_score).reshape(-1)
    if index.ndim != 2 or index.shape[1] == 0:
        return 0
    had_one = index[:, 0] >= 0
    return int(np.count_nonzero(had_one & ((assigned < 0) | (got < score[:, 0]))))


def encoder_observations(
    outputs: Mapping[str, NDArray[Any]], elapsed_ms: float
) -> list[Observation]:
    """What one answered feature_encoder request records."""
    observations = [Observation(ENCODER_LATENCY, elapsed_ms)]
    candidates = outputs.get(CANDIDATE_RIDER_INDEX.name)
    if candidates is not None:
        observations.append(Observation(CANDIDATES_PER_ORDER, candidates_per_order(candidates)))
    return observations


def resolver_observations(
    outputs: Mapping[str, NDArray[Any]], elapsed_ms: float
) -> list[Observation]:
    """What one answered topk_resolver request records."""
    observations = [Observation(RESOLVER_LATENCY, elapsed_ms)]
    try:
        conflicts = capacity_conflicts(
            outputs["TOPK_RIDER_INDEX"],
            outputs["TOPK_OBJECTIVES"][..., 0],  # the score column
            outputs["ASSIGNED_RIDER_INDEX"],
            outputs["ASSIGNED_SCORE"],
        )
    except KeyError:
        return observations
    observations.append(Observation(CAPACITY_CONFLICTS, conflicts))
    return observations


# Which observations a step model's answered requests produce, by model name.
STEP_OBSERVERS: Final[Mapping[str, StepObserver]] = {
    ENCODER_MODEL: encoder_observations,
    RESOLVER_MODEL: resolver_observations,
}
# The metric families each kind of model exposes (any model may reject a request).
STEP_METRICS: Final[Mapping[str, tuple[MetricSpec, ...]]] = {
    ENCODER_MODEL: (ENCODER_LATENCY, CANDIDATES_PER_ORDER, VALIDATION_REJECTIONS),
    # the resolver ends the `dispatch` ensemble: it records the decisions (`outcomes`)
    RESOLVER_MODEL: (RESOLVER_LATENCY, CAPACITY_CONFLICTS, VALIDATION_REJECTIONS, DECISION_RECORDS),
}


def metrics_of(model_kind: str) -> tuple[MetricSpec, ...]:
    """The metric families a model exposes: its table entry, else the rejections only."""
    return STEP_METRICS.get(model_kind, (VALIDATION_REJECTIONS,))
