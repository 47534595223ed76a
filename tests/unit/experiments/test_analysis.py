"""Verdicts per metric from hand-made arms, and the settings' refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dispatch_service.experiments.analysis import (
    DEFAULT_METRICS,
    ArmOutcomes,
    Experiment,
    MetricResult,
    MetricSpec,
    Observation,
    Verdict,
    metric_specs,
)
from dispatch_service.experiments.sequential import ArmStats, Interval


def _result(lower: float, upper: float, margin: float = 1.0) -> MetricResult:
    spec = MetricSpec("delivery_minutes", margin)
    return MetricResult(spec, ArmStats(), ArmStats(), Interval(0.0, lower, upper), 1.0)


@pytest.mark.parametrize(
    ("lower", "upper", "verdict", "non_inferior"),
    [
        (1.2, 3.0, Verdict.WORSE, False),  # worse beyond the margin
        (0.2, 3.0, Verdict.CONTINUE, False),  # worse, but maybe within the margin
        (-3.0, -0.1, Verdict.BETTER, True),
        (-0.5, 0.5, Verdict.NO_DIFFERENCE, True),
        (-1.5, 0.5, Verdict.CONTINUE, True),  # not worse, not yet equal either
        (-math.inf, math.inf, Verdict.CONTINUE, False),
    ],
)
def test_verdicts_follow_the_interval_and_margin(
    lower: float, upper: float, verdict: Verdict, non_inferior: bool
) -> None:
    result = _result(lower, upper)
    assert result.verdict is verdict
    assert result.non_inferior is non_inferior


def test_observations_fill_only_the_metrics_they_have() -> None:
    arm = ArmOutcomes().add(
        [
            Observation(unassigned=True),
            Observation(unassigned=False, delivery_minutes=30.0, late=True, eta_abs_error=2.0),
            Observation(unassigned=False, delivery_minutes=20.0, late=False, eta_abs_error=4.0),
        ]
    )
    assert arm.orders == 3
    assert arm.get("unassigned").mean == pytest.approx(1 / 3)
    assert arm.get("delivery_minutes").mean == 25.0 and arm.get("delivery_minutes").count == 2
    assert arm.get("late").mean == 0.5
    nan_skipped = ArmOutcomes().add_columns({"delivery_minutes": [30.0, np.nan, 20.0]})
    assert nan_skipped.get("delivery_minutes").count == 2
    with pytest.raises(ValueError, match="unknown metric 'speed'"):
        ArmOutcomes().add_columns({"speed": [1.0]})


def test_a_clear_worsening_is_a_breach_and_a_tie_is_no_difference() -> None:
    rng = np.random.default_rng(1)
    control = ArmOutcomes().add_columns(
        {"delivery_minutes": rng.normal(30, 5, 4000), "late": rng.random(4000) < 0.1}
    )
    worse = ArmOutcomes().add_columns(
        {"delivery_minutes": rng.normal(33, 5, 4000), "late": rng.random(4000) < 0.1}
    )
    experiment = Experiment(metric_specs()[:2]).look(worse, control)
    assert experiment.verdicts()["delivery_minutes"] is Verdict.WORSE
    assert [r.spec.name for r in experiment.breaches(["delivery_minutes", "late"])] == [
        "delivery_minutes"
    ]
    same = Experiment(metric_specs({"late": 0.05})[:2]).look(control, control)
    assert same.verdicts()["late"] is Verdict.NO_DIFFERENCE
    assert not same.declared_difference()
    report = experiment.report()
    assert report[0]["metric"] == "delivery_minutes" and report[0]["verdict"] == "worse"
    assert report[0]["treatment"]["orders"] == 4000


def test_alpha_is_split_over_the_metrics() -> None:
    assert Experiment(DEFAULT_METRICS, 0.05).alpha_per_metric == pytest.approx(0.05 / 4)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: MetricSpec("speed", 1.0), "not one of"),
        (lambda: MetricSpec("late", 0.0), "margin must be a number > 0"),
        (lambda: MetricSpec("late", float("nan")), "margin must be a number > 0"),
        (lambda: MetricSpec("late", 0.01, tau=-1.0), "tau must be a number > 0"),
        (lambda: metric_specs({"lateness": 0.1}), "unknown metric"),
        (lambda: Experiment(alpha=1.5), "alpha must be in"),
        (lambda: Experiment(metrics=()), "at least one"),
        (lambda: Experiment(metrics=(DEFAULT_METRICS[0], DEFAULT_METRICS[0])), "each named once"),
    ],
)
def test_bad_settings_are_refused_by_name(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]
