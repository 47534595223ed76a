"""Anytime-valid comparison of two arms: the normal-mixture sequential probability ratio
test (mSPRT) and the confidence sequence it defines.

Why this method. Outcomes arrive continuously and the rollout controller reads the
comparison after every batch; a fixed-horizon test read that way rejects a true null far
more often than its alpha. The mixture SPRT stays valid at every look: under the null, the
probability that its likelihood ratio *ever* reaches ``1 / alpha`` is at most ``alpha``
(Ville's inequality on a nonnegative martingale; Robbins 1970). The form used here is the
two-sample version of Johari, Koomen, Pekelis and Walsh, "Always Valid Inference:
Continuous Monitoring of A/B Tests", Operations Research 70(3), 2022 (the method behind
Optimizely's stats engine):

    delta = mean(treatment) - mean(control)
    V     = var(treatment) / n_treatment + var(control) / n_control
    Lambda(theta0) = sqrt(V / (V + tau^2)) * exp(tau^2 (delta - theta0)^2 / (2 V (V + tau^2)))

and the confidence sequence is every ``theta0`` with ``Lambda(theta0) < 1 / alpha``:

    |delta - theta0| < sqrt(2 V (V + tau^2) / tau^2 * (log(1 / alpha) + log(sqrt((V + tau^2) / V))))

Assumptions, stated where the docs state the method (docs/experiments.md): outcomes are
independent across orders and identically distributed within an arm over the experiment
(no drift that affects one arm only); the arm means are close to normal (the central limit
theorem, so a few dozen outcomes per arm at least: `MIN_OUTCOMES_PER_ARM`); the variances
are the sample variances plugged in, which makes the guarantee asymptotic. The mixing scale
``tau`` is the effect size the test is most sensitive to; any ``tau > 0`` keeps the
guarantee, only the speed of detection depends on it: a ``tau`` far below the standard
error of the first looks makes their intervals very wide (``~ V / tau`` instead of
``~ sqrt(V)``), so a large harm would be seen late.

Every interval of the sequence holds at once with probability ``1 - alpha``, so the
interval at the latest look can be acted on whenever it is read (`SequentialMonitor`). For a
0/1 metric (late, unassigned) the variance is the pooled rate's, smoothed
(`_variance_of_difference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "MIN_OUTCOMES_PER_ARM",
    "ArmStats",
    "Interval",
    "SequentialMonitor",
    "mixture_interval",
    "mixture_log_likelihood_ratio",
]

# Below this many outcomes in either arm the normal approximation of a mean is too rough to
# act on (late rate near 10 %: a binomial mean of 30 draws is still skewed); the interval is
# reported as unbounded until then.
MIN_OUTCOMES_PER_ARM: Final = 30


@dataclass(frozen=True)
class ArmStats:
    """Count, mean and sum of squared deviations of one arm's outcomes (Welford), so arms can
    be updated batch by batch and merged without keeping the outcomes."""

    count: int = 0
    mean: float = 0.0
    squared_deviations: float = 0.0

    @classmethod
    def of(cls, values: ArrayLike) -> ArmStats:
        """Of a batch of outcomes at once (merged into an arm with `merge`)."""
        array = np.asarray(values, dtype=np.float64).reshape(-1)
        if array.size == 0:
            return cls()
        mean = float(array.mean())
        return cls(int(array.size), mean, float(np.square(array - mean).sum()))

    @classmethod
    def from_moments(cls, *, count: int, total: float, total_squares: float) -> ArmStats:
        """From a store's aggregates (``COUNT``, ``SUM(x)``, ``SUM(x*x)``)."""
        if count <= 0:
            return cls()
        mean = total / count
        return cls(count, mean, max(total_squares - count * mean * mean, 0.0))

    def add(self, value: float) -> ArmStats:
        count = self.count + 1
        delta = value - self.mean
        mean = self.mean + delta / count
        return ArmStats(count, mean, self.squared_deviations + delta * (value - mean))

    def merge(self, other: ArmStats) -> ArmStats:
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / count
        squares = (
            self.squared_deviations
            + other.squared_deviations
            + delta * delta * self.count * other.count / count
        )
        return ArmStats(count, mean, squares)

    @property
    def variance(self) -> float:
        """The unbiased sample variance (0 below two outcomes)."""
        return self.squared_deviations / (self.count - 1) if self.count > 1 else 0.0


@dataclass(frozen=True)
class Interval:
    """A confidence-sequence interval for ``treatment - control``; infinite bounds while an
    arm has too few outcomes."""

    estimate: float
    lower: float
    upper: float

    @classmethod
    def unbounded(cls, estimate: float = math.nan) -> Interval:
        return cls(estimate, -math.inf, math.inf)


def _variance_of_difference(treatment: ArmStats, control: ArmStats, *, binary: bool) -> float:
    """``V``: the sample variances, or for a 0/1 metric the pooled rate's ``p(1 - p)`` with
    one success and one failure added (a rare event, such as an unassigned order, is often
    absent from the first few hundred outcomes of an arm, and a zero sample variance would
    make a narrow interval out of no evidence)."""
    if binary:
        successes = treatment.mean * treatment.count + control.mean * control.count
        rate = (successes + 1.0) / (treatment.count + control.count + 2.0)
        spread = rate * (1.0 - rate)
        return spread / treatment.count + spread / control.count
    return treatment.variance / treatment.count + control.variance / control.count


def mixture_log_likelihood_ratio(
    treatment: ArmStats,
    control: ArmStats,
    *,
    tau: float,
    theta0: float = 0.0,
    binary: bool = False,
) -> float:
    """``log Lambda(theta0)`` of the mixture SPRT (module docstring); ``-inf`` when an arm is
    too small or has no spread (no evidence either way)."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if min(treatment.count, control.count) < MIN_OUTCOMES_PER_ARM:
        return -math.inf
    v = _variance_of_difference(treatment, control, binary=binary)
    if v <= 0:
        return -math.inf
    t2 = tau * tau
    delta = treatment.mean - control.mean - theta0
    return 0.5 * math.log(v / (v + t2)) + t2 * delta * delta / (2.0 * v * (v + t2))


def mixture_interval(
    treatment: ArmStats, control: ArmStats, *, tau: float, alpha: float, binary: bool = False
) -> Interval:
    """The ``1 - alpha`` confidence-sequence interval at this look (module docstring)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if min(treatment.count, control.count) < MIN_OUTCOMES_PER_ARM:
        return Interval.unbounded(treatment.mean - control.mean if control.count else math.nan)
    estimate = treatment.mean - control.mean
    v = _variance_of_difference(treatment, control, binary=binary)
    if v <= 0:  # both arms constant so far: no spread to judge a difference by
        return Interval.unbounded(estimate)
    t2 = tau * tau
    radius = math.sqrt(
        2.0 * v * (v + t2) / t2 * (math.log(1.0 / alpha) + 0.5 * math.log((v + t2) / v))
    )
    return Interval(estimate, estimate - radius, estimate + radius)


@dataclass(frozen=True)
class SequentialMonitor:
    """One metric's comparison at the latest look: the interval and the p-value ``1 /
    Lambda(0)``, each valid at whatever look it is read (no running intersection or minimum:
    those would keep a narrow interval from an early look whose plug-in variance was off).
    Immutable, so a controller can store it between runs."""

    tau: float
    alpha: float
    binary: bool = False
    interval: Interval = field(default_factory=Interval.unbounded)
    p_value: float = 1.0
    looks: int = 0

    def look(self, treatment: ArmStats, control: ArmStats) -> SequentialMonitor:
        interval = mixture_interval(
            treatment, control, tau=self.tau, alpha=self.alpha, binary=self.binary
        )
        log_ratio = mixture_log_likelihood_ratio(
            treatment, control, tau=self.tau, binary=self.binary
        )
        p_value = 1.0 if log_ratio <= 0 else math.exp(-log_ratio)
        return replace(self, interval=interval, p_value=p_value, looks=self.looks + 1)
