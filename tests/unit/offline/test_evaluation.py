"""The committed model must dispatch better than nearest-rider in the simulator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dispatch_service.offline import evaluation
from dispatch_service.offline.evaluation import COMMITTED_MODEL, EvaluationConfig


@pytest.mark.parametrize("seed", [EvaluationConfig.seed, 31337])
def test_committed_model_beats_nearest_rider(seed: int) -> None:
    config = EvaluationConfig(seed=seed, windows=32, num_orders=64, num_riders=200)
    results = evaluation.evaluate_policies(COMMITTED_MODEL, config)
    model, nearest = results["model"], results["nearest_rider"]
    assert model.orders == nearest.orders == 32 * 64
    assert model.mean_delivery_minutes < nearest.mean_delivery_minutes
    assert model.ontime_rate > nearest.ontime_rate


def test_evaluation_is_deterministic_and_windows_are_held_out() -> None:
    config = EvaluationConfig(windows=3, num_orders=16, num_riders=60)
    first = evaluation.evaluate_policies(COMMITTED_MODEL, config)
    second = evaluation.evaluate_policies(COMMITTED_MODEL, config)
    assert first == second
    windows = evaluation.evaluation_windows(config)
    assert len({w.dispatch_time for w, _ in windows}) == 3
    # Different evaluation seeds give different windows.
    other = evaluation.evaluation_windows(EvaluationConfig(seed=1, windows=1))
    assert not np.array_equal(other[0][0].pickup[:16], windows[0][0].pickup)


def test_model_policy_returns_a_capacity_respecting_assignment() -> None:
    config = EvaluationConfig(windows=2, num_orders=64, num_riders=100)
    decide = evaluation.model_policy(COMMITTED_MODEL)
    for window, _ in evaluation.evaluation_windows(config):
        assigned = decide(window)
        assert assigned.shape == (64,) and assigned.dtype == np.int32
        taken = np.bincount(assigned[assigned >= 0], minlength=window.num_riders)
        assert (taken <= window.rider_capacity - window.rider_load).all()


def test_card_section_reports_both_policies() -> None:
    config = EvaluationConfig(windows=2, num_orders=16, num_riders=60)
    results = evaluation.evaluate_policies(COMMITTED_MODEL, config, include_oracle=True)
    section = evaluation.card_section(results, config)
    json.dumps(section)  # serialisable into model_card.json
    assert set(section["policies"]) == {"model", "nearest_rider", "oracle_reference"}
    assert "| nearest_rider |" in section["markdown"]
