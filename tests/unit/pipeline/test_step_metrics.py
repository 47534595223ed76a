"""Behaviour of dispatch_service.pipeline.step_metrics: observations from step outputs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from dispatch_service.core.metrics import (
    CANDIDATES_PER_ORDER,
    CAPACITY_CONFLICTS,
    DECISION_RECORDS,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    VALIDATION_REJECTIONS,
    Observation,
)
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.pipeline.stacking import StackingSettings
from dispatch_service.pipeline.step_metrics import (
    STEP_OBSERVERS,
    candidates_per_order,
    capacity_conflicts,
    encoder_observations,
    metrics_of,
    resolver_observations,
)

# ---- observations --------------------------------------------------------------------


def test_candidates_per_order_counts_feasible_riders() -> None:
    index = np.array([[3, 1, -1, -1], [0, 2, 4, 5], [-1, -1, -1, -1]], dtype=np.int32)
    assert candidates_per_order(index) == pytest.approx((2 + 4 + 0) / 3)
    assert candidates_per_order(np.zeros((0, 4), dtype=np.int32)) == 0.0
    assert candidates_per_order(np.zeros((2, 0), dtype=np.int32)) == 0.0


def test_capacity_conflicts_counts_orders_without_their_top1() -> None:
    topk = np.array(
        [
            [0, 1, 2],  # got 0: its top-1
            [0, 2, -1],  # got 2: rider 0 was full
            [0, -1, -1],  # unassigned: rider 0 was full
            [-1, -1, -1],  # no feasible rider at all: not a capacity conflict
            [1, 0, 2],  # got 1: its top-1
            [0, 3, 1],  # got 3, which ties with its top-1: no loss, no conflict
        ],
        dtype=np.int32,
    )
    score = np.array(
        [[0.9, 0.5, 0.4], [0.8, 0.7, 0], [0.6, 0, 0], [0, 0, 0], [0.7, 0.6, 0.1], [0.5, 0.5, 0.2]],
        dtype=np.float32,
    )
    assigned = np.array([0, 2, -1, -1, 1, 3], dtype=np.int32)
    assigned_score = np.array([0.9, 0.7, 0, 0, 0.7, 0.5], dtype=np.float32)
    assert capacity_conflicts(topk, score, assigned, assigned_score) == 2
    empty = np.zeros((3, 0))
    assert capacity_conflicts(empty, empty, np.full(3, -1), np.zeros(3)) == 0


def _conflicts(out: dict[str, Any]) -> int:
    return capacity_conflicts(
        out["TOPK_RIDER_INDEX"],
        out["TOPK_OBJECTIVES"][..., 0],
        out["ASSIGNED_RIDER_INDEX"],
        out["ASSIGNED_SCORE"],
    )


def test_capacity_conflicts_of_a_real_window_with_scarce_riders() -> None:
    pipeline = DispatchPipeline.from_repository()
    window = dict(window_to_wire(generate_window(np.random.default_rng(3), 30, 6)))
    out = pipeline.run(window)
    had_top1 = out["TOPK_RIDER_INDEX"][:, 0] >= 0
    unassigned = int((had_top1 & (out["ASSIGNED_RIDER_INDEX"] < 0)).sum())
    assert unassigned > 0  # 30 orders, 6 riders: not everyone can be served
    assert _conflicts(out) >= unassigned
    # with room for every order on every rider and stand-alone scores, each order gets its
    # top-1: no conflicts (stack-aware, an order may still cede its top-1 rider to others:
    # a rider's later new orders ride with more load, which the solve prices)
    fields = np.array(window["RIDER_FIELDS"], copy=True)
    fields[:, 2], fields[:, 3] = 0, 30  # RIDER_FIELD_COLUMNS: load, capacity
    roomy = {**window, "RIDER_FIELDS": fields}
    stand_alone = replace(
        pipeline, resolver=replace(pipeline.resolver, stacking=StackingSettings(False))
    )
    assert _conflicts(stand_alone.run(roomy)) == 0


def test_encoder_and_resolver_observations() -> None:
    candidates = np.array([[1, 0, -1], [2, -1, -1]], dtype=np.int32)
    encoder = encoder_observations({"CANDIDATE_RIDER_INDEX": candidates}, 3.5)
    assert encoder == [
        Observation(ENCODER_LATENCY, 3.5),
        Observation(CANDIDATES_PER_ORDER, 1.5),
    ]
    resolver = resolver_observations(
        {
            "TOPK_RIDER_INDEX": np.array([[0, 1], [0, 1]], dtype=np.int32),
            # TOPK_OBJECTIVE_COLUMNS: score, then ETA, on-time, cost (unused here)
            "TOPK_OBJECTIVES": np.array(
                [[[0.9, 0, 0, 0], [0.5, 0, 0, 0]], [[0.8, 0, 0, 0], [0.3, 0, 0, 0]]],
                dtype=np.float32,
            ),
            "ASSIGNED_RIDER_INDEX": np.array([0, 1], dtype=np.int32),
            "ASSIGNED_SCORE": np.array([0.9, 0.3], dtype=np.float32),
        },
        7.25,
    )
    assert resolver == [Observation(RESOLVER_LATENCY, 7.25), Observation(CAPACITY_CONFLICTS, 1)]
    assert resolver_observations({}, 1.0) == [Observation(RESOLVER_LATENCY, 1.0)]
    assert metrics_of("feature_encoder") == (
        ENCODER_LATENCY,
        CANDIDATES_PER_ORDER,
        VALIDATION_REJECTIONS,
    )
    assert metrics_of("topk_resolver") == (
        RESOLVER_LATENCY,
        CAPACITY_CONFLICTS,
        VALIDATION_REJECTIONS,
        DECISION_RECORDS,
    )
    assert metrics_of("dispatch_model") == (VALIDATION_REJECTIONS,)
    assert STEP_OBSERVERS["feature_encoder"] is encoder_observations
    assert STEP_OBSERVERS["topk_resolver"] is resolver_observations
    assert "dispatch_model" not in STEP_OBSERVERS
