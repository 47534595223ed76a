"""The mixture SPRT and its confidence sequence, against values computed independently:
numpy's moments, and the mixture likelihood ratio integrated numerically (scipy.quad)
instead of the closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from dispatch_service.experiments.sequential import (
    MIN_OUTCOMES_PER_ARM,
    ArmStats,
    SequentialMonitor,
    mixture_interval,
    mixture_log_likelihood_ratio,
)


def _integrated_ratio(delta: float, v: float, tau: float, theta0: float) -> float:
    """Lambda(theta0) = int N(delta; theta, v) / N(delta; theta0, v) N(theta; theta0, tau^2)."""
    sd = math.sqrt(v)
    null = stats.norm.pdf(delta, theta0, sd)

    def integrand(theta: float) -> float:
        return float(stats.norm.pdf(delta, theta, sd) * stats.norm.pdf(theta, theta0, tau) / null)

    value, _ = integrate.quad(integrand, theta0 - 12 * tau, theta0 + 12 * tau, limit=200)
    return value


def test_arm_stats_match_numpy_batch_by_batch_and_merged() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(30, 6, 250), rng.normal(31, 5, 120)
    merged = ArmStats.of(a).merge(ArmStats.of(b))
    one_by_one = ArmStats()
    for value in np.concatenate([a, b]):
        one_by_one = one_by_one.add(float(value))
    both = np.concatenate([a, b])
    for s in (merged, one_by_one):
        assert s.count == 370
        assert s.mean == pytest.approx(both.mean(), rel=1e-12)
        assert s.variance == pytest.approx(both.var(ddof=1), rel=1e-10)
    from_sums = ArmStats.from_moments(
        count=both.size, total=float(both.sum()), total_squares=float(np.square(both).sum())
    )
    assert from_sums.variance == pytest.approx(both.var(ddof=1), rel=1e-8)
    assert ArmStats.of([]).count == 0 and ArmStats().merge(ArmStats.of(a)).count == 250


@pytest.mark.parametrize("theta0", [0.0, 0.4])
def test_closed_form_ratio_equals_the_integrated_mixture(theta0: float) -> None:
    rng = np.random.default_rng(5)
    t, c = ArmStats.of(rng.normal(31, 6, 400)), ArmStats.of(rng.normal(30, 6, 500))
    tau = 0.5
    v = t.variance / t.count + c.variance / c.count
    expected = _integrated_ratio(t.mean - c.mean, v, tau, theta0)
    got = mixture_log_likelihood_ratio(t, c, tau=tau, theta0=theta0)
    assert got == pytest.approx(math.log(expected), rel=1e-6, abs=1e-9)


def test_interval_ends_are_where_the_ratio_reaches_one_over_alpha() -> None:
    rng = np.random.default_rng(11)
    t, c = ArmStats.of(rng.normal(0.2, 1, 300)), ArmStats.of(rng.normal(0, 1, 300))
    tau, alpha = 0.3, 0.05
    interval = mixture_interval(t, c, tau=tau, alpha=alpha)
    v = t.variance / t.count + c.variance / c.count
    delta = t.mean - c.mean
    assert interval.estimate == pytest.approx(delta)
    for end in (interval.lower, interval.upper):
        assert _integrated_ratio(delta, v, tau, end) == pytest.approx(1 / alpha, rel=1e-5)
    inside = (interval.lower + interval.upper) / 2
    assert _integrated_ratio(delta, v, tau, inside) < 1 / alpha
    # wider than the fixed-horizon interval at the same alpha: the price of peeking
    assert interval.upper - delta > stats.norm.ppf(1 - alpha / 2) * math.sqrt(v)


def test_too_few_outcomes_or_no_spread_give_no_bounds() -> None:
    small = ArmStats.of(np.arange(MIN_OUTCOMES_PER_ARM - 1, dtype=float))
    large = ArmStats.of(np.arange(100, dtype=float))
    assert math.isinf(mixture_interval(small, large, tau=1, alpha=0.05).lower)
    assert mixture_log_likelihood_ratio(small, large, tau=1) == -math.inf
    constant = ArmStats.of(np.zeros(100))
    assert math.isinf(mixture_interval(constant, constant, tau=1, alpha=0.05).upper)


@pytest.mark.parametrize(
    ("tau", "alpha", "name"), [(0.0, 0.05, "tau"), (1.0, 0.0, "alpha"), (1.0, 1.0, "alpha")]
)
def test_bad_parameters_are_refused_by_name(tau: float, alpha: float, name: str) -> None:
    arm = ArmStats.of(np.arange(100, dtype=float))
    with pytest.raises(ValueError, match=name):
        mixture_interval(arm, arm, tau=tau, alpha=alpha)


def test_monitor_reads_the_latest_look() -> None:
    rng = np.random.default_rng(2)
    monitor = SequentialMonitor(tau=0.5, alpha=0.05)
    t, c = ArmStats(), ArmStats()
    for _ in range(20):
        t = t.merge(ArmStats.of(rng.normal(1, 2, 50)))
        c = c.merge(ArmStats.of(rng.normal(0, 2, 50)))
        monitor = monitor.look(t, c)
    assert monitor.looks == 20
    assert monitor.interval == mixture_interval(t, c, tau=0.5, alpha=0.05)
    assert monitor.interval.lower > 0 and monitor.p_value < 0.05  # a 1.0 shift is found


def test_a_rare_event_absent_from_one_arm_still_gets_an_honest_width() -> None:
    """0 unassigned of 100 against 1 of 1,000: the sample variance of the first arm is 0,
    the pooled rate with one success and one failure added is (0 + 1 + 1) / (1,100 + 2)."""
    t, c = ArmStats.of(np.zeros(100)), ArmStats.of(np.r_[np.ones(1), np.zeros(999)])
    rate = 2 / 1102
    v = rate * (1 - rate) * (1 / 100 + 1 / 1000)
    tau, alpha = 0.02, 0.05
    log_term = math.log(1 / alpha) + 0.5 * math.log((v + tau**2) / v)
    radius = math.sqrt(2 * v * (v + tau**2) / tau**2 * log_term)
    interval = mixture_interval(t, c, tau=tau, alpha=alpha, binary=True)
    assert interval.estimate == pytest.approx(-0.001)
    assert interval.upper - interval.estimate == pytest.approx(radius)
    assert interval.lower < 0 < interval.upper  # no "better" from one order
    narrow = mixture_interval(t, c, tau=tau, alpha=alpha)  # the sample variances
    assert narrow.upper - narrow.lower < interval.upper - interval.lower
