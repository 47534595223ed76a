"""What the store keeps: one `DecisionRecord` per answered order, one `Outcome` per decision.

A decision is named by `DecisionId`: the request id the window was sent under (Triton's
request id; `DispatchClient` sends a fresh one per window and the same one on a retry)
and the order's id. An entry point hands the writer one `AnsweredWindow` per answered
window (references to arrays it owns, nothing computed on the request path);
`batch_decision_records` turns a batch of them into records on the writer's thread.

Privacy: a record keeps no address, no coordinates and no user id, only the user's routing
bucket (0..99, `routing.policy.user_buckets`): the bucket is what routing and the analysis
of a canary need. Order, request and rider ids are kept: outcomes are joined by them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.domain.window import parse_objective_weights
from dispatch_service.routing.policy import user_buckets

__all__ = [
    "AnsweredWindow",
    "DecisionId",
    "DecisionRecord",
    "Outcome",
    "batch_decision_records",
    "decision_records",
]


class DecisionId(NamedTuple):
    request_id: str
    order_id: str


@dataclass(frozen=True)
class DecisionRecord:
    """One answered order. Times are unix seconds; figures of the chosen (assigned) pair,
    None where the order was left unassigned."""

    request_id: str
    order_id: str
    decided_at: float  # the window's DISPATCH_TIME
    entry_point: str  # dispatch_fused | dispatch_priority | dispatch (the ensemble)
    city: str  # the registered city that served the window ("" where none was named)
    routing_bucket: int  # the user's bucket, 0..99
    model_version: int  # 0: the rule-based dispatcher
    fallback_level: int  # ORDER_FALLBACK_LEVEL (-1 where the entry point did not say)
    assigned_rider: str | None
    topk_riders: tuple[str, ...]
    eta_minutes: float | None
    ontime_probability: float | None
    cost: float | None
    created_at: float  # the order's creation time
    promised_minutes: float  # late = delivered more than this after created_at
    weights: tuple[float, float, float]  # the objective weights (latency, on-time, cost)

    @property
    def decision_id(self) -> DecisionId:
        return DecisionId(self.request_id, self.order_id)


@dataclass(frozen=True)
class Outcome:
    """What became of one decision (its shape checked by `ingest.parse_outcome`).
    ``ended_at`` is the cancellation or reassignment time; ``rider_id`` the delivering (or
    new) rider."""

    request_id: str
    order_id: str
    status: OutcomeStatus
    picked_up_at: float | None = None
    delivered_at: float | None = None
    ended_at: float | None = None
    rider_id: str | None = None

    @property
    def decision_id(self) -> DecisionId:
        return DecisionId(self.request_id, self.order_id)

    def same_as(self, other: Outcome) -> bool:
        """The same report (times equal to the microsecond): a resend, stored once."""
        return (
            self.status == other.status
            and self.rider_id == other.rider_id
            and all(
                _close(a, b)
                for a, b in (
                    (self.picked_up_at, other.picked_up_at),
                    (self.delivered_at, other.delivered_at),
                    (self.ended_at, other.ended_at),
                )
            )
        )


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=0.0, abs_tol=1e-6)


@dataclass(frozen=True, eq=False)
class AnsweredWindow:
    """One answered window as an entry point hands it to the writer: arrays it will not
    change again (copies of request tensors, which Triton reuses after the answer).

    Per order (B rows): ids, user ids, creation time, promised minutes, version, fallback
    level, Top-K rider rows, assigned rider row and the assigned pair's objectives
    (ETA minutes, on-time probability, cost)."""

    request_id: str
    entry_point: str
    city: str
    dispatch_time: float
    order_ids: NDArray[Any]
    user_ids: NDArray[Any]
    created_at: NDArray[Any]
    promised_minutes: NDArray[Any]
    rider_ids: NDArray[Any]
    weights: NDArray[Any] | None  # OBJECTIVE_WEIGHTS as sent (None: the defaults)
    model_version: NDArray[Any]
    fallback_level: NDArray[Any] | None
    topk_rider_index: NDArray[Any]  # [B, K], -1 pads
    assigned_rider_index: NDArray[Any]  # [B], -1 = unassigned
    assigned_objectives: NDArray[Any]  # [B, 3]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _flat(arrays: list[NDArray[Any]], counts: list[int], name: str) -> NDArray[Any]:
    """The windows' per-order arrays end to end (one value per order, or ValueError)."""
    if [array.size for array in arrays] != counts:
        raise ValueError(f"{name}: not one value per order")
    return np.concatenate(arrays, axis=None)


def _rows(arrays: list[NDArray[Any]], counts: list[int], name: str) -> NDArray[Any]:
    """The windows' per-order rows stacked ([B, n] each, the same n, or ValueError)."""
    if [array.shape[0] for array in arrays] != counts or any(a.ndim != 2 for a in arrays):
        raise ValueError(f"{name}: not one row per order")
    return np.concatenate(arrays, axis=0)


_DEFAULT_WEIGHTS = tuple(parse_objective_weights(None).tolist())


def decision_records(window: AnsweredWindow) -> list[DecisionRecord]:
    """The window's records, one per order (on the writer's thread, never the request's)."""
    return batch_decision_records([window])


def batch_decision_records(windows: Sequence[AnsweredWindow]) -> list[DecisionRecord]:
    """The records of several windows, in order. Each column is read for all their orders
    at once (a window holds one order or a few, and numpy costs per call, not per value).
    Raises ValueError where any window's arrays are not of its orders (`AnsweredWindow`)."""
    if not windows:
        return []
    counts = [window.order_ids.size for window in windows]
    orders = [_text(o) for o in _flat([w.order_ids for w in windows], counts, "order_ids")]
    buckets = user_buckets(_flat([w.user_ids for w in windows], counts, "user_ids")).tolist()
    versions = _flat([w.model_version for w in windows], counts, "model_version").tolist()
    levels = _flat(
        [
            np.full(count, -1) if w.fallback_level is None else w.fallback_level
            for w, count in zip(windows, counts, strict=True)
        ],
        counts,
        "fallback_level",
    ).tolist()
    created = _flat([w.created_at for w in windows], counts, "created_at").tolist()
    promised = _flat([w.promised_minutes for w in windows], counts, "promised_minutes").tolist()
    assigned = _flat(
        [w.assigned_rider_index for w in windows], counts, "assigned_rider_index"
    ).tolist()
    topk = _rows([w.topk_rider_index for w in windows], counts, "topk_rider_index").tolist()
    objectives = _rows([w.assigned_objectives for w in windows], counts, "assigned_objectives")
    if objectives.shape[1] != 3:
        raise ValueError("assigned_objectives: not 3 objectives per order")
    figures = objectives.tolist()
    records = []
    first = 0  # the window's first order among all
    for window, count in zip(windows, counts, strict=True):
        riders = window.rider_ids.reshape(-1).tolist()
        weights = (
            _DEFAULT_WEIGHTS
            if window.weights is None
            else tuple(parse_objective_weights(window.weights).tolist())
        )
        decided_at = float(window.dispatch_time)
        for row in range(first, first + count):
            rider = assigned[row]
            eta, ontime, cost = (None, None, None) if rider < 0 else figures[row]
            records.append(
                DecisionRecord(
                    request_id=window.request_id,
                    order_id=orders[row],
                    decided_at=decided_at,
                    entry_point=window.entry_point,
                    city=window.city,
                    routing_bucket=buckets[row],
                    model_version=int(versions[row]),
                    fallback_level=int(levels[row]),
                    assigned_rider=_text(riders[rider]) if rider >= 0 else None,
                    topk_riders=tuple(_text(riders[i]) for i in topk[row] if i >= 0),
                    eta_minutes=eta,
                    ontime_probability=ontime,
                    cost=cost,
                    created_at=float(created[row]),
                    promised_minutes=float(promised[row]),
                    weights=weights,
                )
            )
        first += count
    return records
