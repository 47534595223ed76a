"""Each pair's score: a weighted utility of its objectives (ETA, on-time, cost).

Each objective is mapped to a utility that depends on that pair alone (never on the
rest of the window, so an order's ranking cannot change because another order
arrived) and is monotone: latency ``1 / (1 + eta / eta_scale)``, on-time
``clip(p, 0, 1)``, cost ``1 / (1 + cost / cost_scale)``. The score is
``sum(w * u) / sum(w)``, in [0, 1]. Rounding is monotone, so if pair a is at least
as good as pair b on every objective its computed score is >= b's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import OBJECTIVES, PAIR_OBJECTIVES
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window import check_objective_weights

__all__ = [
    "COST",
    "ETA",
    "ONTIME",
    "ResolverSettings",
    "checked_weights",
    "score_checked",
    "score_pairs",
]

# The objectives' columns (OBJECTIVES order).
ETA, ONTIME, COST = range(len(OBJECTIVES))


@dataclass(frozen=True)
class ResolverSettings:
    """Server-side knobs; the scales set where a utility falls to one half."""

    top_k: int = 5
    eta_scale_minutes: float = 30.0
    cost_scale_cny: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {self.top_k!r}")
        for name in ("eta_scale_minutes", "cost_scale_cny"):
            value = float(getattr(self, name))
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def checked_weights(weights: ArrayLike) -> NDArray[np.float64]:
    try:
        array = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise DispatchInputError("OBJECTIVE_WEIGHTS", "must be numeric", "dtype") from None
    return check_objective_weights(array)


def score_pairs(
    objectives: ArrayLike,
    weights: ArrayLike,
    settings: ResolverSettings | None = None,
) -> NDArray[np.float64]:
    """Weighted utility of each pair, shape ``objectives.shape[:-1]``, in [0, 1].

    Each term uses only its own pair's value, so scores are comparable across windows.
    Evaluated in float64 with a fixed operation order: every step is monotone, so
    dominance is never reversed by rounding.
    """
    settings = settings or ResolverSettings()
    w = checked_weights(weights)
    obj = np.asarray(objectives, dtype=np.float64)
    if obj.ndim < 1 or obj.shape[-1] != len(OBJECTIVES):
        raise DispatchInputError(
            PAIR_OBJECTIVES.name,
            f"must have {len(OBJECTIVES)} columns, got shape {obj.shape}",
            "shape",
        )
    return score_checked(obj, w, settings)


def score_checked(
    obj: NDArray[np.float64], w: NDArray[np.float64], settings: ResolverSettings
) -> NDArray[np.float64]:
    """`score_pairs` on inputs already checked (resolve validates them once). ``w``: [3],
    or one row per order ([B, 1, 3] for objectives [B, N, 3]: `resolve_many`); the same
    arithmetic either way, element by element."""
    latency = 1.0 / (1.0 + obj[..., ETA] / settings.eta_scale_minutes)
    ontime = obj[..., ONTIME].clip(0.0, 1.0)  # np.clip without its wrappers
    cost = 1.0 / (1.0 + obj[..., COST] / settings.cost_scale_cny)
    total = w[..., 0] * latency + w[..., 1] * ontime + w[..., 2] * cost
    result: NDArray[np.float64] = total / w.sum(axis=-1)
    return result
