"""The evaluation counts every order and its parts agree with independent computations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, PAIR_FEATURE_NAMES
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.domain import geo
from dispatch_service.domain.features import feasible_mask
from dispatch_service.offline import baseline, evaluation, simulator

V1 = MODEL_REPOSITORY / "dispatch_model" / "1" / "model.onnx"


def test_expected_calibration_error_by_hand() -> None:
    p = np.array([0.05, 0.05, 0.95, 0.95])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    # Bin 0: mean p 0.05 vs 0.5 (half the pairs); bin 9: 0.95 vs 1.0 (the other half).
    assert evaluation.expected_calibration_error(p, y) == pytest.approx(0.5 * 0.45 + 0.5 * 0.05)


def test_paired_bootstrap_brackets_the_mean() -> None:
    diff = np.random.default_rng(1).normal(-1.0, 0.5, 40)
    mean, low, high = evaluation.paired_bootstrap(diff)
    assert low < mean < high < 0.0
    assert mean == pytest.approx(diff.mean())


def test_calibration_intervals_resample_whole_windows_by_hand() -> None:
    """Two windows of ten pairs at p = 0.9: window A all on time (ECE 0.1, ETA 1 min long),
    B nine of ten (ECE 0, 1 min short). A resample is AA, AB, BA or BB, so the 95 % interval
    runs from BB to AA: ECE [0, 0.1], bias [-1, +1] (AB, halfway, is inside)."""
    p = [np.full(10, 0.9), np.full(10, 0.9)]
    y = [np.ones(10), np.r_[np.ones(9), 0.0]]
    errors = [np.ones(10), -np.ones(10)]
    intervals = evaluation.calibration_intervals(p, y, errors)
    np.testing.assert_allclose(intervals["ontime_ece_ci"], [0.0, 0.1], atol=1e-12)
    np.testing.assert_allclose(intervals["eta_bias_ci"], [-1.0, 1.0], atol=1e-12)
    # One window: every resample is that window, so the interval is its own figure.
    alone = evaluation.calibration_intervals(p[:1], y[:1], errors[:1])
    np.testing.assert_allclose(alone["ontime_ece_ci"], [0.1, 0.1], atol=1e-12)
    np.testing.assert_allclose(alone["eta_bias_ci"], [1.0, 1.0], atol=1e-12)


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


def test_evaluate_counts_every_order_and_is_deterministic() -> None:
    config = evaluation.EvaluationConfig(
        windows=2, regimes=("default", "scarcity"), cities=("shanghai", "chengdu")
    )
    policies = evaluation.default_policies({"model_v1": V1})
    first = evaluation.evaluate(policies, config)
    second = evaluation.evaluate(policies, config)
    assert json.dumps(first) == json.dumps(second)
    assert list(first["cities"]) == ["shanghai", "chengdu"]
    regimes = [(c, r, d) for c, data in first["cities"].items() for r, d in data["regimes"].items()]
    # Each city's windows are its own: the same regime draws different windows elsewhere.
    assert (
        first["cities"]["shanghai"]["regimes"]["default"]["policies"]["oracle"]
        != first["cities"]["chengdu"]["regimes"]["default"]["policies"]["oracle"]
    )
    for _, name, regime in regimes:
        assert regime["orders"] == 2 * simulator.REGIMES[name].num_orders
        assert set(regime["policies"]) == {
            "nearest_rider",
            "distance_matching",
            "rule_eta",
            "model_v1",
            "oracle",
        }
        for metrics in regime["policies"].values():
            assert 0.0 <= metrics["late_rate"] <= 1.0
        calibration = regime["policies"]["model_v1"]["calibration"]
        assert calibration["dispatched"]["pairs"] <= regime["orders"]
        low, high = calibration["dispatched"]["eta_bias_ci"]
        assert low <= calibration["dispatched"]["eta_bias"] <= high
    report = evaluation.render_report(first, {"model_v1": ("shanghai",)})
    assert "| model_v1 |" in report and "## Targets: model_v1" in report
    assert "trained on shanghai; held out: chengdu" in report
    assert "held-out cities: captures >= 70 %" in report


def test_committed_model_beats_nearest_rider_over_all_orders() -> None:
    config = evaluation.EvaluationConfig(windows=12, regimes=("default",), cities=("beijing",))
    policies = {
        "nearest_rider": evaluation.nearest_rider_policy,
        "model_v1": evaluation.model_policy(V1),
    }
    summary = evaluation.evaluate(
        {
            **policies,
            "rule_eta": evaluation.rule_eta_policy(),
            "distance_matching": evaluation.distance_matching_policy,
        },
        config,
    )
    default = summary["cities"]["beijing"]["regimes"]["default"]["policies"]
    assert default["model_v1"]["mean_delivery"] < default["nearest_rider"]["mean_delivery"]
    assert default["model_v1"]["late_rate"] < default["nearest_rider"]["late_rate"]


@pytest.mark.parametrize(
    ("seed", "weights"),
    [
        (3, DEFAULT_OBJECTIVE_WEIGHTS),
        (4, DEFAULT_OBJECTIVE_WEIGHTS),
        (5, DEFAULT_OBJECTIVE_WEIGHTS),
        (3, (1.0, 0.0, 0.0)),
    ],
)
def test_model_policy_wiring_is_the_served_decision(seed: int, weights: evaluation.Weights) -> None:
    """Wiring, not correctness: the evaluation's model policy assigns as the served library
    does (DispatchPipeline with the repository's configs, stack-aware by default), on
    windows scarce enough to stack, and reports the served figures of each assigned pair;
    with other weights, as a request that sends them as OBJECTIVE_WEIGHTS."""
    from dispatch_service.domain.window import window_to_wire
    from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline

    window = simulator.generate_window(np.random.default_rng(seed), 48, 14)
    decision = evaluation.model_policy(
        MODEL_REPOSITORY / "dispatch_model" / "1" / "model.onnx", weights=weights
    )(window, simulator.DEFAULT_CITY)
    wire = window_to_wire(window)
    if weights != DEFAULT_OBJECTIVE_WEIGHTS:  # the default: a request that sends none
        wire["OBJECTIVE_WEIGHTS"] = np.asarray(weights, dtype=np.float32)
    served = DispatchPipeline.from_repository().run(wire)
    np.testing.assert_array_equal(decision.assigned, served["ASSIGNED_RIDER_INDEX"])
    assert decision.predicted is not None
    # Every assigned order's figures, its rider on the Top-K list or not (0 = unassigned).
    np.testing.assert_allclose(decision.predicted, served["ASSIGNED_OBJECTIVES"], rtol=1e-6)


def test_weights_are_checked_as_a_request_s_and_recorded(tmp_path: Path) -> None:
    with pytest.raises(DispatchInputError, match="OBJECTIVE_WEIGHTS"):
        evaluation.rule_eta_policy(weights=(-1.0, 0.0, 0.0))
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


def test_the_weights_choice_follows_the_stated_objective(tmp_path: Path) -> None:
    """Hand-made candidate rows: the choice is the least late among those never slower than
    the rule ETA, and the table says whether the default is it."""
    config = evaluation.EvaluationConfig(windows=1, regimes=("night",), cities=("chengdu",))
    choice = evaluation.weights_choice(V1, config)
    rows = choice["candidates"]
    assert list(rows) == [",".join(str(w) for w in c) for c in evaluation.WEIGHT_CANDIDATES]
    allowed = {key: row["late_rate"] for key, row in rows.items() if not row["slower_than_rule"]}
    assert choice["chosen"] == (min(allowed, key=allowed.__getitem__) if allowed else None)
    table = evaluation.weights_table(choice)
    assert "chengdu/night" in table and "The objective (fewest late orders" in table
    default = ",".join(str(w) for w in DEFAULT_OBJECTIVE_WEIGHTS)
    made = {
        "candidates": {
            default: {"per_regime": {}, "slower_than_rule": [], "late_rate": 0.2},
            "0.1,0.1,0.8": {"per_regime": {}, "slower_than_rule": ["x/y"], "late_rate": 0.1},
        },
        "chosen": default,
    }
    assert f"the default {default} is that choice" in evaluation.weights_table(made)
    made["chosen"] = "0.1,0.1,0.8"
    assert f"the default {default} is NOT that choice" in evaluation.weights_table(made)
