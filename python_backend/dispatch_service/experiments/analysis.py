"""Experiment analysis on delivery outcomes: per metric, the treatment arm against the
control arm with an anytime-valid interval (`sequential`), and a verdict a rollout can act
on.

Every metric here is "lower is better" and measured per order:

- ``delivery_minutes``: minutes from the order's creation to its delivery (delivered orders);
- ``late``: 1 when delivered after the promise (delivered orders), else 0;
- ``eta_abs_error``: |predicted ETA - realised minutes from dispatch to delivery|;
- ``unassigned``: 1 when the decision left the order without a rider (every decided order).

A metric's ``margin`` is the largest worsening (treatment minus control, in the metric's
unit) that the platform accepts. Verdicts, from the interval ``[lower, upper]``:

- ``worse``: ``lower > margin``, worse beyond the margin with confidence (a guardrail
  breach: the rollout controller rolls back);
- ``better``: ``upper < 0``;
- ``no difference``: ``-margin < lower`` and ``upper < margin``, equal within the margin;
- ``continue``: none of these yet.

A metric is ``non_inferior`` once ``upper < margin``: the primary metric must be before a
rollout promotes. The experiment-wise error is held at ``alpha`` by giving each of the k
metrics ``alpha / k`` (Bonferroni), so an A/A experiment declares *any* difference with
probability at most ``alpha`` however often it is read.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike

from dispatch_service.experiments.sequential import ArmStats, Interval, SequentialMonitor

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_METRICS",
    "METRIC_NAMES",
    "ArmOutcomes",
    "Experiment",
    "MetricResult",
    "MetricSpec",
    "Observation",
    "Verdict",
    "metric_specs",
]

DEFAULT_ALPHA: Final = 0.05


class Verdict(enum.StrEnum):
    CONTINUE = "continue"
    BETTER = "better"
    WORSE = "worse"
    NO_DIFFERENCE = "no difference"


@dataclass(frozen=True)
class MetricSpec:
    """One compared metric: its accepted worsening (``margin``, in the metric's unit) and the
    mixture scale ``tau`` (the effect size the test is quickest to see: a clear breakage,
    four times the margin unless set)."""

    name: str
    margin: float
    tau: float | None = None
    unit: str = ""

    def __post_init__(self) -> None:
        if self.name not in METRIC_NAMES:
            raise ValueError(f"metric {self.name!r}: not one of {', '.join(METRIC_NAMES)}")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"metric {self.name!r}: margin must be a number > 0")
        if self.tau is not None and not (math.isfinite(self.tau) and self.tau > 0):
            raise ValueError(f"metric {self.name!r}: tau must be a number > 0")

    @property
    def mixing_scale(self) -> float:
        return TAU_PER_MARGIN * self.margin if self.tau is None else self.tau

    @property
    def binary(self) -> bool:
        return self.name in BINARY_METRICS


METRIC_NAMES: Final = ("delivery_minutes", "late", "eta_abs_error", "unassigned")
BINARY_METRICS: Final = ("late", "unassigned")
# The mixture is quickest to see effects of about tau. The margin itself would be too small
# a tau: at the first looks of a step (a few hundred orders an arm, a standard error of
# minutes on delivery minutes) the intervals would be many times wider than the standard
# error, and a version that breaks deliveries outright would be seen late. Four margins
# (2 minutes, 4 late points) is the size of a breakage; the intervals of the last looks,
# where non-inferiority is shown, are then about a tenth wider than with tau = margin.
TAU_PER_MARGIN: Final = 4.0

# Defaults a delivery platform would choose (docs/experiments.md says why):
# - delivery minutes, 0.5 min: deliveries take 25-40 minutes and promises carry buffers of
#   several minutes; half a minute is below what a customer notices or a promise absorbs;
# - late, 1 point: with about one order in ten late, one more point is a tenth more broken
#   promises, the most a platform lets a version cost before anyone looks;
# - ETA error, 0.5 min: the rider-facing ETA is read in whole minutes;
# - unassigned, 0.5 point: an unassigned order waits for the next window and is usually late.
DEFAULT_METRICS: Final = (
    MetricSpec("delivery_minutes", 0.5, unit="min"),
    MetricSpec("late", 0.01, unit="share"),
    MetricSpec("eta_abs_error", 0.5, unit="min"),
    MetricSpec("unassigned", 0.005, unit="share"),
)


def metric_specs(margins: Mapping[str, float] | None = None) -> tuple[MetricSpec, ...]:
    """The default metrics with some margins replaced (``{"late": 0.02}``); an unknown
    name is refused by name."""
    margins = dict(margins or {})
    unknown = sorted(set(margins) - set(METRIC_NAMES))
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}: use {', '.join(METRIC_NAMES)}")
    return tuple(
        MetricSpec(spec.name, margins[spec.name], spec.tau, spec.unit)
        if spec.name in margins
        else spec
        for spec in DEFAULT_METRICS
    )


@dataclass(frozen=True)
class Observation:
    """One decided order's outcome, as the analysis needs it (None where not known: an
    undelivered order has no delivery minutes)."""

    unassigned: bool
    delivery_minutes: float | None = None
    late: bool | None = None
    eta_abs_error: float | None = None

    def values(self) -> dict[str, float]:
        out = {"unassigned": 1.0 if self.unassigned else 0.0}
        if self.delivery_minutes is not None:
            out["delivery_minutes"] = float(self.delivery_minutes)
        if self.late is not None:
            out["late"] = 1.0 if self.late else 0.0
        if self.eta_abs_error is not None:
            out["eta_abs_error"] = float(self.eta_abs_error)
        return out


@dataclass(frozen=True)
class ArmOutcomes:
    """One arm's running statistics per metric."""

    stats: Mapping[str, ArmStats] = field(default_factory=dict)

    def add(self, observations: Iterable[Observation]) -> ArmOutcomes:
        columns: dict[str, list[float]] = {}
        for observation in observations:
            for name, value in observation.values().items():
                columns.setdefault(name, []).append(value)
        return self.add_columns(columns)

    def add_columns(self, columns: Mapping[str, ArrayLike]) -> ArmOutcomes:
        """A batch given per metric (``{"late": [0, 1, ...], ...}``); NaN marks an order
        the metric does not apply to (an undelivered order's delivery minutes)."""
        stats = dict(self.stats)
        for name, values in columns.items():
            if name not in METRIC_NAMES:
                raise ValueError(f"unknown metric {name!r}: use {', '.join(METRIC_NAMES)}")
            array = np.asarray(values, dtype=np.float64).reshape(-1)
            batch = ArmStats.of(array[~np.isnan(array)])
            stats[name] = stats.get(name, ArmStats()).merge(batch)
        return ArmOutcomes(stats)

    def get(self, name: str) -> ArmStats:
        return self.stats.get(name, ArmStats())

    @property
    def orders(self) -> int:
        return self.get("unassigned").count


@dataclass(frozen=True)
class MetricResult:
    spec: MetricSpec
    treatment: ArmStats
    control: ArmStats
    interval: Interval
    p_value: float

    @property
    def verdict(self) -> Verdict:
        lower, upper, margin = self.interval.lower, self.interval.upper, self.spec.margin
        if lower > margin:
            return Verdict.WORSE
        if upper < 0:
            return Verdict.BETTER
        if lower > -margin and upper < margin:
            return Verdict.NO_DIFFERENCE
        return Verdict.CONTINUE

    @property
    def non_inferior(self) -> bool:
        return self.interval.upper < self.spec.margin

    def as_dict(self) -> dict[str, Any]:
        def number(value: float) -> float | None:
            return value if math.isfinite(value) else None

        return {
            "metric": self.spec.name,
            "unit": self.spec.unit,
            "margin": self.spec.margin,
            "control": {"orders": self.control.count, "mean": number(self.control.mean)},
            "treatment": {"orders": self.treatment.count, "mean": number(self.treatment.mean)},
            "estimate": number(self.interval.estimate),
            "interval": [number(self.interval.lower), number(self.interval.upper)],
            "p_value": self.p_value,
            "verdict": str(self.verdict),
            "non_inferior": self.non_inferior,
        }


@dataclass(frozen=True)
class Experiment:
    """A running comparison of a treatment arm with a control arm, read after every batch.

    Immutable: `look` returns the next state, so the rollout controller can keep it in its
    store and resume after a restart with the same intervals.
    """

    metrics: tuple[MetricSpec, ...] = DEFAULT_METRICS
    alpha: float = DEFAULT_ALPHA
    monitors: Mapping[str, SequentialMonitor] = field(default_factory=dict)
    results: Mapping[str, MetricResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        names = [spec.name for spec in self.metrics]
        if not names or len(set(names)) != len(names):
            raise ValueError("metrics: at least one, each named once")

    @property
    def alpha_per_metric(self) -> float:
        return self.alpha / len(self.metrics)

    def look(self, treatment: ArmOutcomes, control: ArmOutcomes) -> Experiment:
        """Read the arms' totals so far (not increments): every look sees all outcomes."""
        monitors = dict(self.monitors)
        results = {}
        for spec in self.metrics:
            monitor = monitors.get(spec.name) or SequentialMonitor(
                tau=spec.mixing_scale, alpha=self.alpha_per_metric, binary=spec.binary
            )
            t, c = treatment.get(spec.name), control.get(spec.name)
            monitor = monitor.look(t, c)
            monitors[spec.name] = monitor
            results[spec.name] = MetricResult(spec, t, c, monitor.interval, monitor.p_value)
        return Experiment(self.metrics, self.alpha, monitors, results)

    def verdicts(self) -> dict[str, Verdict]:
        return {name: result.verdict for name, result in self.results.items()}

    def declared_difference(self) -> bool:
        """Any metric declared better or worse (what an A/A run must rarely do)."""
        return any(v in (Verdict.BETTER, Verdict.WORSE) for v in self.verdicts().values())

    def breaches(self, guardrails: Sequence[str]) -> list[MetricResult]:
        return [
            self.results[name]
            for name in guardrails
            if name in self.results and self.results[name].verdict is Verdict.WORSE
        ]

    def report(self) -> list[dict[str, Any]]:
        return [
            self.results[spec.name].as_dict() for spec in self.metrics if spec.name in self.results
        ]
