"""Golden windows: a candidate dispatch_model version is checked in-process before it serves.

Deterministic simulator windows (default 8 windows of 64 orders x 200 riders, seeds from a
stream of their own) go through the serving steps -- `steps.FeatureEncoderStep`, the
version's ONNX file in `steps.DispatchModelStep`, `steps.TopKResolverStep`, each configured
from the repository's ``config.pbtxt`` -- once with the candidate and once with the stable
version, on the same encoded pairs. The candidate passes when

- its objectives are valid on every feasible pair: finite, ETA and cost >= 0, on-time
  probability in [0, 1], and the resolver's scores are finite;
- it agrees with the stable version: the share of orders whose best rider is the same
  (top-1 agreement) is at least ``min_top1_agreement``, and the mean absolute ETA
  difference over the feasible pairs is at most ``max_mean_eta_diff_minutes``.

Agreement bounds a change, it does not judge quality: `evaluation` does that offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import CANDIDATE_RIDER_INDEX, PAIR_OBJECTIVES
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.dispatch_pipeline import repository_steps
from dispatch_service.pipeline.model_step import DispatchModelStep
from dispatch_service.routing.settings import SCORING_MODEL_NAME

__all__ = [
    "GOLDEN_STREAM",
    "MODEL",
    "GoldenReport",
    "GoldenSettings",
    "check_candidate",
    "golden_tensors",
]

GOLDEN_STREAM: Final = 0x60D5
MODEL: Final = SCORING_MODEL_NAME  # the model whose candidate version is checked


@dataclass(frozen=True)
class GoldenSettings:
    windows: int = 8
    num_orders: int = 64
    num_riders: int = 200
    seed: int = 11
    min_top1_agreement: float = 0.6
    max_mean_eta_diff_minutes: float = 5.0

    def __post_init__(self) -> None:
        if min(self.windows, self.num_orders, self.num_riders) < 1:
            raise ValueError("golden windows need at least one window, order and rider")
        if not 0.0 <= self.min_top1_agreement <= 1.0:
            raise ValueError("min_top1_agreement must lie in [0, 1]")
        if not self.max_mean_eta_diff_minutes >= 0.0:
            raise ValueError("max_mean_eta_diff_minutes must be >= 0")


@dataclass(frozen=True)
class GoldenReport:
    candidate: int
    stable: int
    windows: int
    orders: int  # orders with a feasible rider under either version
    pairs: int  # feasible (order, rider) pairs scored
    top1_agreement: float
    mean_abs_eta_diff_minutes: float
    problems: tuple[str, ...]  # empty when the candidate passes

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (
            f"golden windows: {self.windows} windows, {self.orders} orders, {self.pairs} pairs; "
            f"version {self.candidate} vs {self.stable}: top-1 agreement "
            f"{self.top1_agreement:.3f}, mean |ETA diff| {self.mean_abs_eta_diff_minutes:.2f} min"
        )


def golden_tensors(settings: GoldenSettings) -> list[dict[str, NDArray[Any]]]:
    """The golden windows as request tensors; the same for the same settings."""
    return [
        window_to_wire(
            generate_window(
                np.random.default_rng([GOLDEN_STREAM, settings.seed, i]),
                settings.num_orders,
                settings.num_riders,
            )
        )
        for i in range(settings.windows)
    ]


def _invalid(objectives: NDArray[np.float32]) -> str | None:
    eta, ontime, cost = objectives[:, 0], objectives[:, 1], objectives[:, 2]
    if not np.isfinite(objectives).all():
        return "non-finite objectives"
    if (eta < 0).any():
        return "negative ETA"
    if ((ontime < 0) | (ontime > 1)).any():
        return "on-time probability outside [0, 1]"
    if (cost < 0).any():
        return "negative cost"
    return None


def check_candidate(
    repository: Path,
    candidate: int,
    stable: int,
    settings: GoldenSettings | None = None,
) -> GoldenReport:
    """Run both versions of dispatch_model on the golden windows and compare them."""
    settings = settings or GoldenSettings()
    encoder, resolver = repository_steps(repository)
    scoring = model_layout(repository, MODEL)
    model_parameters = config_parameters(scoring.config)
    new, old = (
        DispatchModelStep.from_parameters(scoring.onnx(version), model_parameters)
        for version in (candidate, stable)
    )
    problems: list[str] = []
    same_top1 = orders = pairs = 0
    eta_diff_sum = 0.0
    for number, tensors in enumerate(golden_tensors(settings)):
        encoded = encoder.run(tensors)
        feasible = encoded[CANDIDATE_RIDER_INDEX.name].reshape(-1) >= 0
        new_obj = new.run(encoded)[PAIR_OBJECTIVES.name]
        old_obj = old.run(encoded)[PAIR_OBJECTIVES.name]
        problem = _invalid(new_obj[feasible])
        if problem is not None:
            problems.append(f"window {number}: {problem}")
            continue
        new_top, old_top = (
            resolver.run({**tensors, **encoded, PAIR_OBJECTIVES.name: objectives})
            for objectives in (new_obj, old_obj)
        )
        if not np.isfinite(new_top["TOPK_OBJECTIVES"]).all():
            problems.append(f"window {number}: non-finite scores")
            continue
        new_best, old_best = new_top["TOPK_RIDER_INDEX"][:, 0], old_top["TOPK_RIDER_INDEX"][:, 0]
        has_rider = (new_best >= 0) | (old_best >= 0)
        orders += int(has_rider.sum())
        same_top1 += int((new_best == old_best)[has_rider].sum())
        pairs += int(feasible.sum())
        eta_diff_sum += float(
            np.abs(new_obj[feasible, 0].astype(np.float64) - old_obj[feasible, 0]).sum()
        )
    agreement = same_top1 / orders if orders else 1.0
    eta_diff = eta_diff_sum / pairs if pairs else 0.0
    if agreement < settings.min_top1_agreement:
        problems.append(f"top-1 agreement {agreement:.3f} < {settings.min_top1_agreement:.3f}")
    if not eta_diff <= settings.max_mean_eta_diff_minutes:
        problems.append(
            f"mean |ETA diff| {eta_diff:.2f} min > {settings.max_mean_eta_diff_minutes:.2f} min"
        )
    return GoldenReport(
        candidate=candidate,
        stable=stable,
        windows=settings.windows,
        orders=orders,
        pairs=pairs,
        top1_agreement=agreement,
        mean_abs_eta_diff_minutes=eta_diff,
        problems=tuple(problems),
    )
