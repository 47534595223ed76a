"""The evaluation counts every order and its parts agree with independent computations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from dispatch_contract import PAIR_FEATURE_NAMES
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.domain import geo
from dispatch_service.domain.features import feasible_mask
from dispatch_service.offline import baseline, evaluation, evaluation_policies, simulator

V1 = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)


def test_rule_objectives_by_hand() -> None:
    row = np.zeros((1, len(PAIR_FEATURE_NAMES)), dtype=np.float32)
    names = {name: i for i, name in enumerate(PAIR_FEATURE_NAMES)}
    row[0, names["pickup_distance_km"]] = 2.0
    row[0, names["trip_distance_km"]] = 3.0
    row[0, names["rider_load"]] = 2.0
    row[0, names["vehicle_motorbike"]] = 1.0
    row[0, names["promised_minutes"]] = 40.0
    row[0, names["order_age_minutes"]] = 5.0
    eta, ontime, cost = baseline.rule_objectives(row)[0]
    expected_eta = 5.0 * 1.3 / 24.0 * 60.0 + 3.0 * 2.0  # 16.25 + 6 minutes
    assert eta == pytest.approx(expected_eta, rel=1e-6)
    assert ontime == pytest.approx(1.0 / (1.0 + np.exp(-(35.0 - expected_eta) / 5.0)), rel=1e-5)
    assert cost == pytest.approx(5.0 + 1.25 * 6.5 + 0.25 * expected_eta, rel=1e-6)


def test_distance_matching_is_max_cardinality_min_distance_like_milp() -> None:
    small = simulator.Regime("small", num_orders=12, num_riders=30, scarce=True)
    for seed in range(4):
        window = simulator.generate_regime_window(np.random.default_rng(seed), small)
        assigned = baseline.distance_matching_assignment(window).astype(np.int64)
        feasible = feasible_mask(window)
        spare = np.maximum(window.rider_capacity - window.rider_load, 0)
        orders, riders = np.nonzero(feasible)
        km = geo.haversine_km(
            window.pickup[orders, 0],
            window.pickup[orders, 1],
            window.rider_position[riders, 0],
            window.rider_position[riders, 1],
        )
        n = orders.size
        per_order = np.zeros((window.num_orders, n))
        per_order[orders, np.arange(n)] = 1
        per_rider = np.zeros((window.num_riders, n))
        per_rider[riders, np.arange(n)] = 1
        rules = [LinearConstraint(per_order, 0, 1), LinearConstraint(per_rider, 0, spare)]
        most = milp(-np.ones(n), constraints=rules, integrality=np.ones(n), bounds=Bounds(0, 1))
        count = round(-most.fun)
        rules.append(LinearConstraint(np.ones((1, n)), count, count))
        best = milp(km, constraints=rules, integrality=np.ones(n), bounds=Bounds(0, 1))
        served = np.flatnonzero(assigned >= 0)
        assert served.size == count
        assert feasible[served, assigned[served]].all()
        assert (np.bincount(assigned[served], minlength=window.num_riders) <= spare).all()
        got = geo.haversine_km(
            window.pickup[served, 0],
            window.pickup[served, 1],
            window.rider_position[assigned[served], 0],
            window.rider_position[assigned[served], 1],
        ).sum()
        assert got == pytest.approx(best.fun, abs=1e-6)


def test_order_outcomes_count_unassigned_orders_late_at_the_penalty() -> None:
    window = simulator.generate_window(np.random.default_rng(3), 10, 30)
    assigned = baseline.nearest_rider_assignment(window).astype(np.int64)
    assigned[[2, 7]] = -1
    outcome = simulator.order_outcomes(window, assigned, np.random.default_rng(9))
    legacy = simulator.evaluate_assignment(window, assigned, np.random.default_rng(9))
    served = outcome.assigned
    assert served.sum() == 8 and not outcome.on_time[[2, 7]].any()
    penalty = window.promised_minutes[[2, 7]] + simulator.UNASSIGNED_PENALTY_MINUTES
    np.testing.assert_allclose(outcome.delivery_minutes[[2, 7]], penalty)
    # The assigned orders realise exactly as the older per-window summary does.
    assert outcome.delivery_minutes[served].mean() == pytest.approx(legacy["mean_delivery_minutes"])
    assert outcome.on_time.mean() == pytest.approx(legacy["ontime_rate"])


def test_weights_are_checked_as_a_request_s_and_recorded(tmp_path: Path) -> None:
    with pytest.raises(DispatchInputError, match="OBJECTIVE_WEIGHTS"):
        evaluation_policies.rule_eta_policy(weights=(-1.0, 0.0, 0.0))
    for bad in ("1,2", "1,x,0"):
        with pytest.raises(SystemExit):
            evaluation.main(["--weights", bad, "--out-dir", str(tmp_path)])
    out = tmp_path / "latency_only"
    argv = ["--weights", "1,0,0", "--windows", "1", "--regimes", "night", "--versions", "1"]
    argv += ["--cities", "shenzhen"]
    assert evaluation.main([*argv, "--out-dir", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["setup"]["objective_weights"] == [1.0, 0.0, 0.0]
    assert "OBJECTIVE_WEIGHTS [1.0, 0.0, 0.0]" in (out / "report.md").read_text()
