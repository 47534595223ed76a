"""Live quality per model version x city x fallback level, from joined decisions and outcomes.

Over the deliveries the service's own assignment made (status ``delivered``, by the
assigned rider, with the pair's predictions recorded):

- ETA error: realised minutes = (delivered_at - decided_at) / 60, the span the model
  predicts (`eta_minutes`: minutes from the dispatch decision to delivery);
  ``eta_mae`` = mean |predicted - realised|, ``eta_bias`` = mean (predicted - realised)
  (positive: the model promises later than it delivers).
- On time: delivered_at - created_at <= promised_minutes x 60. ``brier`` = mean
  (p - on_time)^2 of the predicted on-time probability p; ``ece`` = sum over
  `ECE_BINS` equal-width bins of p of (bin share) x |mean p - on-time rate| in the bin;
  ``late_rate`` = 1 - on-time rate.
- ``delivery_minutes``: mean realised minutes; ``cost``: mean predicted cost of the
  assigned pair (the platform reports no realised cost).

Cancelled and reassigned outcomes are counted (``cancelled``, ``reassigned``) but enter
no figure: no assigned pair's prediction was put to the test.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.outcomes.store import JoinedRow

__all__ = ["ECE_BINS", "QualityFigures", "QualityKey", "expected_calibration_error", "live_quality"]

ECE_BINS: Final = 10


@dataclass(frozen=True, order=True)
class QualityKey:
    model_version: int
    city: str
    fallback_level: int


@dataclass(frozen=True)
class QualityFigures:
    deliveries: int  # the figures below are over these
    cancelled: int
    reassigned: int
    eta_mae: float
    eta_bias: float
    brier: float
    ece: float
    late_rate: float
    delivery_minutes: float
    cost: float

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def expected_calibration_error(
    probability: np.ndarray[Any, Any], outcome: np.ndarray[Any, Any], bins: int = ECE_BINS
) -> float:
    """ECE over ``bins`` equal-width bins of [0, 1] (1.0 falls in the last bin)."""
    if probability.size == 0:
        return float("nan")
    index = np.minimum((probability * bins).astype(np.int64), bins - 1)
    total = 0.0
    for b in np.unique(index):
        members = index == b
        total += members.mean() * abs(probability[members].mean() - outcome[members].mean())
    return float(total)


def _figures(rows: list[JoinedRow]) -> QualityFigures:
    delivered = [
        r
        for r in rows
        if r.status is OutcomeStatus.DELIVERED
        and r.delivered_at is not None
        and r.eta_minutes is not None
        and r.ontime_probability is not None
    ]
    count = len(delivered)
    nan = float("nan")
    if count:
        predicted = np.array([r.eta_minutes for r in delivered], dtype=np.float64)
        realised = np.array(
            [(r.delivered_at - r.decided_at) / 60.0 for r in delivered],  # type: ignore[operator]
            dtype=np.float64,
        )
        on_time = np.array(
            [r.delivered_at - r.created_at <= r.promised_minutes * 60.0 for r in delivered],  # type: ignore[operator]
            dtype=np.float64,
        )
        probability = np.array([r.ontime_probability for r in delivered], dtype=np.float64)
        costs = np.array([r.cost for r in delivered], dtype=np.float64)
        error = predicted - realised
        eta_mae, eta_bias = float(np.abs(error).mean()), float(error.mean())
        brier = float(((probability - on_time) ** 2).mean())
        ece = expected_calibration_error(probability, on_time)
        late_rate = float(1.0 - on_time.mean())
        minutes, cost = float(realised.mean()), float(costs.mean())
    else:
        eta_mae = eta_bias = brier = ece = late_rate = minutes = cost = nan
    return QualityFigures(
        deliveries=count,
        cancelled=sum(r.status is OutcomeStatus.CANCELLED for r in rows),
        reassigned=sum(r.status is OutcomeStatus.REASSIGNED for r in rows),
        eta_mae=eta_mae,
        eta_bias=eta_bias,
        brier=brier,
        ece=ece,
        late_rate=late_rate,
        delivery_minutes=minutes,
        cost=cost,
    )


def live_quality(rows: Iterable[JoinedRow]) -> dict[QualityKey, QualityFigures]:
    """The figures per version x city x fallback level, in key order."""
    groups: defaultdict[QualityKey, list[JoinedRow]] = defaultdict(list)
    for row in rows:
        groups[QualityKey(row.model_version, row.city, row.fallback_level)].append(row)
    return {key: _figures(groups[key]) for key in sorted(groups)}
