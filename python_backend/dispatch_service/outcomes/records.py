"""What the store keeps: one `DecisionRecord` per answered order, one `Outcome` per decision.

A decision is named by `DecisionId`: the request id the window was sent under (Triton's
request id; `DispatchClient` sends a fresh one per window and the same one on a retry)
and the order's id. An entry point hands the writer one `AnsweredWindow` per answered
window (references to arrays it owns, nothing computed on the request path);
`decision_records` turns it into records on the writer's thread.

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


def decision_records(window: AnsweredWindow) -> list[DecisionRecord]:
    """The window's records, one per order (on the writer's thread, never the request's)."""
    riders = [_text(r) for r in np.asarray(window.rider_ids, dtype=object).reshape(-1).tolist()]
    orders = [_text(o) for o in np.asarray(window.order_ids, dtype=object).reshape(-1).tolist()]
    count = len(orders)
    buckets = user_buckets(np.asarray(window.user_ids, dtype=object).reshape(-1)).tolist()
    weights = tuple(float(w) for w in parse_objective_weights(window.weights).tolist())
    versions = np.asarray(window.model_version).reshape(-1).tolist()
    levels: Sequence[int] = (
        [-1] * count
        if window.fallback_level is None
        else np.asarray(window.fallback_level).reshape(-1).tolist()
    )
    topk = np.asarray(window.topk_rider_index).reshape(count, -1).tolist()
    assigned = np.asarray(window.assigned_rider_index).reshape(-1).tolist()
    objectives = np.asarray(window.assigned_objectives, dtype=np.float64).reshape(count, 3)
    created = np.asarray(window.created_at, dtype=np.float64).reshape(-1).tolist()
    promised = np.asarray(window.promised_minutes, dtype=np.float64).reshape(-1).tolist()
    records = []
    for row in range(count):
        rider = assigned[row]
        eta, ontime, cost = (
            (None, None, None) if rider < 0 else tuple(float(x) for x in objectives[row].tolist())
        )
        records.append(
            DecisionRecord(
                request_id=window.request_id,
                order_id=orders[row],
                decided_at=float(window.dispatch_time),
                entry_point=window.entry_point,
                city=window.city,
                routing_bucket=int(buckets[row]),
                model_version=int(versions[row]),
                fallback_level=int(levels[row]),
                assigned_rider=riders[rider] if rider >= 0 else None,
                topk_riders=tuple(riders[i] for i in topk[row] if i >= 0),
                eta_minutes=eta,
                ontime_probability=ontime,
                cost=cost,
                created_at=float(created[row]),
                promised_minutes=float(promised[row]),
                weights=(weights[0], weights[1], weights[2]),
            )
        )
    return records
