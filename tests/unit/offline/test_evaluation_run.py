"""The evaluation runs: every order counted, its statistics checked by hand."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.offline import evaluation, evaluation_policies, evaluation_run, simulator

V1 = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)


def test_expected_calibration_error_by_hand() -> None:
    p = np.array([0.05, 0.05, 0.95, 0.95])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    # Bin 0: mean p 0.05 vs 0.5 (half the pairs); bin 9: 0.95 vs 1.0 (the other half).
    assert evaluation_run.expected_calibration_error(p, y) == pytest.approx(0.5 * 0.45 + 0.5 * 0.05)


def test_paired_bootstrap_brackets_the_mean() -> None:
    diff = np.random.default_rng(1).normal(-1.0, 0.5, 40)
    mean, low, high = evaluation_run.paired_bootstrap(diff)
    assert low < mean < high < 0.0
    assert mean == pytest.approx(diff.mean())


def test_calibration_intervals_resample_whole_windows_by_hand() -> None:
    """Two windows of ten pairs at p = 0.9: window A all on time (ECE 0.1, ETA 1 min long),
    B nine of ten (ECE 0, 1 min short). A resample is AA, AB, BA or BB, so the 95 % interval
    runs from BB to AA: ECE [0, 0.1], bias [-1, +1] (AB, halfway, is inside)."""
    p = [np.full(10, 0.9), np.full(10, 0.9)]
    y = [np.ones(10), np.r_[np.ones(9), 0.0]]
    errors = [np.ones(10), -np.ones(10)]
    intervals = evaluation_run.calibration_intervals(p, y, errors)
    np.testing.assert_allclose(intervals["ontime_ece_ci"], [0.0, 0.1], atol=1e-12)
    np.testing.assert_allclose(intervals["eta_bias_ci"], [-1.0, 1.0], atol=1e-12)
    # One window: every resample is that window, so the interval is its own figure.
    alone = evaluation_run.calibration_intervals(p[:1], y[:1], errors[:1])
    np.testing.assert_allclose(alone["ontime_ece_ci"], [0.1, 0.1], atol=1e-12)
    np.testing.assert_allclose(alone["eta_bias_ci"], [1.0, 1.0], atol=1e-12)


def test_gain_captured_by_hand() -> None:
    """A share of the oracle's gain over the baseline, on a lower-is-better and a
    higher-is-better metric; undefined (NaN) where the oracle gains nothing."""
    share = evaluation_run.gain_captured
    # minutes: baseline 40, oracle 38 (2 better), policy 39.5 (0.5 better): 25 %
    assert share(40.0, 39.5, 38.0, lower_is_better=True) == pytest.approx(0.25)
    # objective: baseline 0.50, oracle 0.52, policy 0.515: 75 %; 0.49: -50 %
    assert share(0.50, 0.515, 0.52, lower_is_better=False) == pytest.approx(0.75)
    assert share(0.50, 0.49, 0.52, lower_is_better=False) == pytest.approx(-0.5)
    # late rate: baseline 0.30, oracle 0.27, policy 0.24: 200 % (more than the oracle)
    assert share(0.30, 0.24, 0.27, lower_is_better=True) == pytest.approx(2.0)
    for oracle in (40.0, 40.1):  # the oracle no faster than the baseline
        assert np.isnan(share(40.0, 39.0, oracle, lower_is_better=True))
    assert np.isnan(share(0.5, 0.6, 0.49, lower_is_better=False))


def test_evaluate_counts_every_order_and_is_deterministic() -> None:
    config = evaluation_run.EvaluationConfig(
        windows=2, regimes=("default", "scarcity"), cities=("shanghai", "chengdu")
    )
    policies = evaluation_policies.default_policies({"model_v1": V1})
    first = evaluation_run.evaluate(policies, config)
    second = evaluation_run.evaluate(policies, config)
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
            "minutes_oracle",
        }
        for metrics in regime["policies"].values():
            assert 0.0 <= metrics["late_rate"] <= 1.0
        calibration = regime["policies"]["model_v1"]["calibration"]
        assert calibration["dispatched"]["pairs"] <= regime["orders"]
        low, high = calibration["dispatched"]["eta_bias_ci"]
        assert low <= calibration["dispatched"]["eta_bias"] <= high
        # both oracles serve the most orders; the gap split adds up by construction
        policies = regime["policies"]
        assert (
            policies["minutes_oracle"]["unassigned"] == policies["distance_matching"]["unassigned"]
        )
        split = regime["gap_split"]
        weights = split["weights_price"]["mean_delivery"][0]
        prediction = split["prediction_price"]["model_v1"]["mean_delivery"][0]
        total = policies["model_v1"]["mean_delivery"] - policies["minutes_oracle"]["mean_delivery"]
        assert weights + prediction == pytest.approx(total, abs=1e-9)
        # the oracle maximises the ground-truth objective (over 32 candidates, stacked pairs
        # re-scored once, so a policy may come close or, rarely, above): it beats the rules
        best = policies["oracle"]["objective"]
        assert all(policies[rule]["objective"] < best for rule in ("nearest_rider", "rule_eta"))
        rule, model = policies["rule_eta"], policies["model_v1"]
        assert model["oracle_gain_captured"] == pytest.approx(
            (model["objective"] - rule["objective"]) / (best - rule["objective"])
        )
    report = evaluation.render_report(first, {"model_v1": ("shanghai",)})
    assert "| model_v1 |" in report and "## Targets: model_v1" in report
    assert "### shanghai: the two oracles" in report
    assert "trained cities: captures >= 85 % of the delivery-minutes oracle's gain" in report
    assert "captures >= 50 % of the oracle's gain in the weighted objective" in report
    assert "| objective / order |" in report and "measured on what that oracle" in report
    assert "trained on shanghai; held out: chengdu" in report
    assert "held-out cities: captures >= 70 %" in report


def test_committed_model_beats_nearest_rider_over_all_orders() -> None:
    config = evaluation_run.EvaluationConfig(windows=12, regimes=("default",), cities=("beijing",))
    policies = {
        "nearest_rider": evaluation_policies.nearest_rider_policy,
        "model_v1": evaluation_policies.model_policy(V1),
    }
    summary = evaluation_run.evaluate(
        {
            **policies,
            "rule_eta": evaluation_policies.rule_eta_policy(),
            "distance_matching": evaluation_policies.distance_matching_policy,
        },
        config,
    )
    default = summary["cities"]["beijing"]["regimes"]["default"]["policies"]
    assert default["model_v1"]["mean_delivery"] < default["nearest_rider"]["mean_delivery"]
    assert default["model_v1"]["late_rate"] < default["nearest_rider"]["late_rate"]


def test_the_weights_choice_follows_the_stated_objective(tmp_path: Path) -> None:
    """The choice is the least late among the candidates never significantly slower than
    the one fixed baseline, every candidate judged on the same baseline decisions; on
    hand-made rows the table says whether the default is it."""
    config = evaluation_run.EvaluationConfig(windows=1, regimes=("night",), cities=("chengdu",))
    choice = evaluation_run.weights_choice(V1, config)
    rows = choice["candidates"]
    assert list(rows) == [",".join(str(w) for w in c) for c in evaluation_run.WEIGHT_CANDIDATES]
    allowed = {key: row["late_rate"] for key, row in rows.items() if not row["slower_than_rule"]}
    assert choice["chosen"] == (min(allowed, key=allowed.__getitem__) if allowed else None)
    table = evaluation.weights_table(choice)
    assert "chengdu/night" in table and "The measure (fewest late orders" in table
    assert choice["baseline_weights"] == list(evaluation_run.CHOICE_BASELINE_WEIGHTS)
    for row in rows.values():  # every candidate against the same baseline figures
        cell = row["per_regime"]["chengdu/night"]
        baseline = choice["baseline"]["chengdu/night"]
        assert cell["vs_baseline"]["mean_delivery"][0] == pytest.approx(
            cell["mean_delivery"] - baseline["mean_delivery"]
        )
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


def test_a_registry_of_new_cities_is_judged_from_their_entries() -> None:
    """`--registry`: the shipped evaluation registry's two new cities (a river city from the
    OSM test extract, a high-circuity one) are simulated from their entries alone and every
    order of their windows is counted."""
    from dispatch_service.core.paths import REPO_ROOT
    from dispatch_service.domain.cities import load_registry

    path = REPO_ROOT / "evaluation" / "registries" / "new_cities.geojson"
    registry = load_registry(path)
    assert registry.ids[-2:] == ("wuhan", "guilin")
    assert registry.get("guilin").road_circuity == 1.8
    config = evaluation_run.EvaluationConfig(
        windows=1, regimes=("night",), cities=("wuhan", "guilin"), registry=str(path)
    )
    policies = {
        "rule_eta": evaluation_policies.rule_eta_policy(),
        "distance_matching": evaluation_policies.distance_matching_policy,
        "model_v1": evaluation_policies.model_policy(V1),
    }
    summary = evaluation_run.evaluate(policies, config)
    assert summary["setup"]["registry"] == str(path)
    for city in ("wuhan", "guilin"):
        night = summary["cities"][city]["regimes"]["night"]
        assert night["orders"] == simulator.REGIMES["night"].num_orders
        assert 0.0 <= night["policies"]["model_v1"]["late_rate"] <= 1.0


def test_parallel_cells_wiring_gives_the_serial_summary() -> None:
    """Wiring: `evaluate(..., jobs=2)` builds the policies in each worker and returns, cell for
    cell, the summary of the serial run (the same windows and noise)."""
    config = evaluation_run.EvaluationConfig(
        windows=1, regimes=("night", "scarcity"), cities=("chengdu", "shenzhen")
    )
    build = functools.partial(evaluation_run.choice_policies, V1)
    serial = evaluation_run.evaluate(build(), config)
    parallel = evaluation_run.evaluate(build, config, jobs=2)
    assert json.dumps(parallel, sort_keys=True) == json.dumps(serial, sort_keys=True)
    with pytest.raises(TypeError, match="builds its policies"):
        evaluation_run.evaluate(build(), config, jobs=2)
