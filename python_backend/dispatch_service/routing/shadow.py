"""Shadow scoring: a sample of requests also scored by the other version, only to compare.

A ``shadow_percent`` share of requests is also scored by the other version (canary for
orders on the stable version, stable for orders on the canary). The shadow answer never
reaches the response: it is only compared with the primary one (top-1 rider under the default
weights, mean absolute score and on-time probability differences) for metrics. Shadow calls
run concurrently with the primary ones and are bounded by the same timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, OBJECTIVES
from dispatch_service.domain.scoring import score_pairs
from dispatch_service.routing.settings import ROUTING_BUCKETS, RouterSettings

__all__ = [
    "ShadowComparison",
    "compare_shadow",
    "shadow_sampled",
    "shadow_version_of",
]


def shadow_version_of(primary: int, settings: RouterSettings) -> int:
    """The version that shadows `primary`, or 0 when there is none."""
    if settings.canary_version == 0:
        return 0
    if primary == settings.stable_version:
        return settings.canary_version
    if primary == settings.canary_version:
        return settings.stable_version
    return 0  # a forced third version has no shadow


def shadow_sampled(draw: float, settings: RouterSettings) -> bool:
    """Whether a request whose uniform draw in [0, 1) is `draw` gets shadow scoring."""
    return draw * ROUTING_BUCKETS < settings.shadow_percent


_DEFAULT_WEIGHTS: Final = np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float64)


@dataclass(frozen=True)
class ShadowComparison:
    """How a shadow version's answer differs from the primary one on the same orders."""

    primary_version: int
    shadow_version: int
    orders: int  # orders with at least one candidate
    top1_agreements: int  # orders whose best candidate (default weights) is the same
    pairs: int  # valid (order, candidate) pairs compared
    score_abs_diff_sum: float  # sum over pairs of |score_shadow - score_primary|
    ontime_abs_diff_sum: float  # sum over pairs of |p_shadow - p_primary|

    @property
    def top1_agreement(self) -> float:
        return self.top1_agreements / self.orders if self.orders else float("nan")

    @property
    def mean_score_abs_diff(self) -> float:
        return self.score_abs_diff_sum / self.pairs if self.pairs else float("nan")

    @property
    def mean_ontime_abs_diff(self) -> float:
        return self.ontime_abs_diff_sum / self.pairs if self.pairs else float("nan")


def compare_shadow(
    primary: ArrayLike,
    shadow: ArrayLike,
    candidates: ArrayLike,
    primary_version: int,
    shadow_version: int,
) -> ShadowComparison:
    """Compare two [B*N, 3] objective tensors of the same orders ([B, N] candidates)."""
    index = np.asarray(candidates)
    num_orders, width = index.shape
    first = np.asarray(primary, dtype=np.float64).reshape(num_orders, width, len(OBJECTIVES))
    second = np.asarray(shadow, dtype=np.float64).reshape(num_orders, width, len(OBJECTIVES))
    valid = index >= 0
    score_a = score_pairs(first, _DEFAULT_WEIGHTS)
    score_b = score_pairs(second, _DEFAULT_WEIGHTS)
    has_any = valid.any(axis=1)
    best_a = np.argmax(np.where(valid, score_a, -np.inf), axis=1)
    best_b = np.argmax(np.where(valid, score_b, -np.inf), axis=1)
    ontime_col = OBJECTIVES.index("ontime_probability")
    return ShadowComparison(
        primary_version=primary_version,
        shadow_version=shadow_version,
        orders=int(has_any.sum()),
        top1_agreements=int(((best_a == best_b) & has_any).sum()),
        pairs=int(valid.sum()),
        score_abs_diff_sum=float(np.abs(score_b - score_a)[valid].sum()),
        ontime_abs_diff_sum=float(
            np.abs(second[..., ontime_col] - first[..., ontime_col])[valid].sum()
        ),
    )
