"""How the experiment analysis behaves on the simulator's outcome streams: its false
declarations on A/A runs and its power against a worse version.

An outcome pool is the simulator's truth for the served decision (`evaluation_policies`)
over held-out-style windows of one city and regime: per order, whether it was assigned,
its delivery minutes, whether it was late and the error of the predicted ETA. A simulated
experiment draws each arm's orders from a pool batch by batch (with replacement) and reads
`analysis.Experiment` after every batch, as the rollout controller does:

- A/A: both arms from the same pool; any "better" or "worse" is a false declaration;
- power: the treatment's orders transformed as a worse version would make them (ETAs
  biased by a factor, or a share of on-time orders turned late); success is "worse" on the
  transformed metric, and the number of outcomes it took is kept.

``python -m dispatch_service.offline.experiment_study`` runs the full study (the figures
docs/experiments.md quotes); the unit tests run smaller ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.experiments.analysis import (
    DEFAULT_ALPHA,
    DEFAULT_METRICS,
    ArmOutcomes,
    Experiment,
    MetricSpec,
    Verdict,
)
from dispatch_service.offline import simulator
from dispatch_service.offline.evaluation_policies import Policy, model_policy

__all__ = [
    "OutcomePool",
    "StudyResult",
    "aa_study",
    "biased_eta",
    "more_late",
    "outcome_pool",
    "power_study",
]

# The study's own random stream (training and evaluation use others).
STUDY_STREAM: Final = 9_471

Columns = dict[str, NDArray[np.float64]]  # per metric, one value per order (NaN: n/a)


@dataclass(frozen=True)
class OutcomePool:
    """Per-order outcomes of one policy in one city and regime; NaN where a metric does not
    apply (an unassigned order has no delivery minutes or ETA error). ``eta_signed_error``
    is predicted minus realised minutes from dispatch, kept so a bias can be applied."""

    unassigned: NDArray[np.float64]
    delivery_minutes: NDArray[np.float64]
    late: NDArray[np.float64]
    eta_signed_error: NDArray[np.float64]
    realised_minutes: NDArray[np.float64]

    @property
    def size(self) -> int:
        return int(self.unassigned.size)

    def columns(self, rows: NDArray[np.int64]) -> Columns:
        return {
            "unassigned": self.unassigned[rows],
            "delivery_minutes": self.delivery_minutes[rows],
            "late": self.late[rows],
            "eta_abs_error": np.abs(self.eta_signed_error[rows]),
        }


def outcome_pool(
    policy: Policy,
    *,
    city: str = simulator.DEFAULT_CITY.map.id,
    regime: str = "default",
    windows: int = 40,
    seed: int = 0,
) -> OutcomePool:
    """Realise ``policy``'s decisions on ``windows`` simulated windows with the simulator's
    truth (`simulator.order_outcomes`), every order of every window."""
    worlds = simulator.city_worlds()
    world = worlds[city]
    parts: dict[str, list[NDArray[np.float64]]] = {
        "unassigned": [], "delivery_minutes": [], "late": [], "eta": [], "realised": []
    }  # fmt: skip
    for index in range(windows):
        rng = np.random.default_rng([STUDY_STREAM, seed, index])
        window = simulator.generate_regime_window(rng, simulator.REGIMES[regime], world)
        decision = policy(window, simulator.REGIMES[regime].world(world))
        outcome = simulator.order_outcomes(window, decision.assigned, rng, world)
        assigned = outcome.assigned
        predicted = np.full(window.num_orders, np.nan)
        if decision.predicted is not None:
            predicted[assigned] = decision.predicted[assigned, 0]
        parts["unassigned"].append((~assigned).astype(np.float64))
        parts["delivery_minutes"].append(np.where(assigned, outcome.delivery_minutes, np.nan))
        parts["late"].append(np.where(assigned, (~outcome.on_time).astype(np.float64), np.nan))
        parts["eta"].append(predicted)
        parts["realised"].append(outcome.minutes_from_dispatch)
    joined = {name: np.concatenate(values) for name, values in parts.items()}
    return OutcomePool(
        unassigned=joined["unassigned"],
        delivery_minutes=joined["delivery_minutes"],
        late=joined["late"],
        eta_signed_error=joined["eta"] - joined["realised"],
        realised_minutes=joined["realised"],
    )


# (the treatment's columns, the pool, the rows drawn, the experiment's generator) -> columns
Transform = Callable[[Columns, OutcomePool, NDArray[np.int64], np.random.Generator], Columns]


def biased_eta(factor: float) -> Transform:
    """A version whose ETAs are ``factor`` times the served ones (the same assignments)."""

    def transform(
        columns: Columns,
        pool: OutcomePool,
        rows: NDArray[np.int64],
        rng: np.random.Generator,
    ) -> Columns:
        realised = pool.realised_minutes[rows]
        predicted = pool.eta_signed_error[rows] + realised
        return {**columns, "eta_abs_error": np.abs(factor * predicted - realised)}

    return transform


def more_late(points: float) -> Transform:
    """A version that turns ``points`` of the delivered orders from on time to late."""

    def transform(
        columns: Columns,
        pool: OutcomePool,
        rows: NDArray[np.int64],
        rng: np.random.Generator,
    ) -> Columns:
        late = columns["late"].copy()
        on_time = late == 0.0
        share_on_time = max(float(np.mean(on_time[~np.isnan(late)])), 1e-9)
        flip = on_time & (rng.random(late.size) < points / share_on_time)
        late[flip] = 1.0
        return {**columns, "late": late}

    return transform


@dataclass(frozen=True)
class StudyResult:
    experiments: int
    declared: int  # A/A: any difference declared; power: the target metric declared worse
    outcomes_to_decision: tuple[int, ...]  # per declared experiment, treatment orders then

    @property
    def share(self) -> float:
        return self.declared / self.experiments

    def as_dict(self) -> dict[str, Any]:
        steps = sorted(self.outcomes_to_decision)
        return {
            "experiments": self.experiments,
            "declared": self.declared,
            "share": self.share,
            "outcomes_to_decision_median": steps[len(steps) // 2] if steps else None,
            "outcomes_to_decision_p90": steps[int(len(steps) * 0.9)] if steps else None,
        }


def _run(
    pool: OutcomePool,
    *,
    experiments: int,
    batch: int,
    batches: int,
    seed: int,
    metrics: Sequence[MetricSpec],
    alpha: float,
    transform: Transform | None,
    declared: Callable[[Experiment], bool],
) -> StudyResult:
    hits = 0
    when: list[int] = []
    for number in range(experiments):
        rng = np.random.default_rng([STUDY_STREAM, seed, 1_000_003, number])
        experiment = Experiment(tuple(metrics), alpha)
        treatment, control = ArmOutcomes(), ArmOutcomes()
        for step in range(batches):
            rows_t = rng.integers(0, pool.size, batch)
            rows_c = rng.integers(0, pool.size, batch)
            columns_t = pool.columns(rows_t)
            if transform is not None:
                columns_t = transform(columns_t, pool, rows_t, rng)
            treatment = treatment.add_columns(columns_t)
            control = control.add_columns(pool.columns(rows_c))
            experiment = experiment.look(treatment, control)
            if declared(experiment):
                hits += 1
                when.append((step + 1) * batch)
                break
    return StudyResult(experiments, hits, tuple(when))


def aa_study(
    pool: OutcomePool,
    *,
    experiments: int = 200,
    batch: int = 100,
    batches: int = 40,
    seed: int = 0,
    metrics: Sequence[MetricSpec] = DEFAULT_METRICS,
    alpha: float = DEFAULT_ALPHA,
) -> StudyResult:
    """Both arms from ``pool``; counts the experiments that ever declared a difference."""
    return _run(
        pool,
        experiments=experiments,
        batch=batch,
        batches=batches,
        seed=seed,
        metrics=metrics,
        alpha=alpha,
        transform=None,
        declared=lambda e: e.declared_difference(),
    )


def power_study(
    pool: OutcomePool,
    transform: Transform,
    metric: str,
    *,
    experiments: int = 200,
    batch: int = 100,
    batches: int = 40,
    seed: int = 0,
    metrics: Sequence[MetricSpec] = DEFAULT_METRICS,
    alpha: float = DEFAULT_ALPHA,
) -> StudyResult:
    """The treatment transformed; counts the experiments that declared ``metric`` worse
    within ``batches`` batches (and after how many treatment outcomes)."""
    return _run(
        pool,
        experiments=experiments,
        batch=batch,
        batches=batches,
        seed=seed,
        metrics=metrics,
        alpha=alpha,
        transform=transform,
        declared=lambda e: e.verdicts().get(metric) is Verdict.WORSE,
    )


# Five more points late needs more orders than a 30 % ETA bias to be told apart from noise
# (a late rate near 10 % has a large variance relative to 5 points): 80 batches of 100.
LATE_BATCHES: Final = 80


def full_study(repository: Path = MODEL_REPOSITORY, seed: int = 0) -> dict[str, Any]:
    """Every city's default and peak pools under the served model version 1; A/A and both
    power scenarios on each."""
    policy = model_policy(model_layout(repository, SCORING_MODEL).onnx(1), repository)
    out: dict[str, Any] = {}
    for city in simulator.city_worlds():
        for regime in ("default", "peak"):
            pool = outcome_pool(policy, city=city, regime=regime, windows=60, seed=seed)
            out[f"{city}/{regime}"] = {
                "orders_in_pool": pool.size,
                "aa": aa_study(pool, seed=seed).as_dict(),
                "eta_bias_30pct": power_study(
                    pool, biased_eta(1.3), "eta_abs_error", seed=seed
                ).as_dict(),
                "late_plus_5_points": power_study(
                    pool, more_late(0.05), "late", batches=LATE_BATCHES, seed=seed
                ).as_dict(),
            }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    figures = full_study(seed=args.seed)
    text = json.dumps(figures, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
