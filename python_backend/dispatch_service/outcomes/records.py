"""What the store keeps: one `DecisionRecord` per answered order, one `Outcome` per decision.

A decision is named by `DecisionId`: the request id the window was sent under (Triton's
request id; `DispatchClient` sends a fresh one per window and the same one on a retry)
and the order's id. An entry point hands the writer one `AnsweredWindow` per answered
window (references to arrays it owns, nothing computed on the request path);
`decision_rows` turns a batch of them into the records' columns on the writer's thread
(`DecisionRows`, which the store inserts as they are).

Privacy: a record keeps no address, no coordinates and no user id, only the user's routing
bucket (0..99, `routing.policy.user_buckets`): the bucket is what routing and the analysis
of a canary need. Order, request and rider ids are kept: outcomes are joined by them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, Final, NamedTuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.domain.window import parse_objective_weights
from dispatch_service.routing.policy import user_buckets

__all__ = [
    "AnsweredWindow",
    "DecisionId",
    "DecisionRecord",
    "DecisionRows",
    "Outcome",
    "batch_decision_records",
    "decision_records",
    "decision_rows",
]

T = TypeVar("T")


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


def _texts(values: NDArray[Any]) -> list[str]:
    """Ids as text (UTF-8 bytes decoded); all bytes, the usual case, in one C-level loop."""
    items = values.tolist()
    if set(map(type, items)) <= {bytes}:
        return list(map(bytes.decode, items, repeat("utf-8"), repeat("replace")))
    return list(map(_text, items))


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


_DEFAULT_WEIGHTS: Final = tuple(parse_objective_weights(None).tolist())


@dataclass(frozen=True)
class DecisionRows:
    """Decision records as columns: one list per field, one entry per order, in the order
    of the windows. The writer builds them from a batch of windows with a few numpy calls
    per column (`decision_rows`) and the store zips them into its rows, with no object per
    record in between; `records` gives the same as `DecisionRecord`s."""

    request_id: list[str]
    order_id: list[str]
    decided_at: list[float]
    entry_point: list[str]
    city: list[str]
    routing_bucket: list[int]
    model_version: list[int]
    fallback_level: list[int]
    assigned_rider: list[str | None]
    topk_riders: list[tuple[str, ...]]
    eta_minutes: list[float | None]
    ontime_probability: list[float | None]
    cost: list[float | None]
    created_at: list[float]
    promised_minutes: list[float]
    weight_latency: list[float]
    weight_ontime: list[float]
    weight_cost: list[float]

    def __len__(self) -> int:
        return len(self.order_id)

    @classmethod
    def of_records(cls, records: Sequence[DecisionRecord]) -> DecisionRows:
        columns = {
            name: [getattr(record, name) for record in records]
            for name in DecisionRecord.__dataclass_fields__
            if name != "weights"
        }
        latency, ontime, cost = _weight_columns([record.weights for record in records])
        return cls(**columns, weight_latency=latency, weight_ontime=ontime, weight_cost=cost)

    def records(self) -> list[DecisionRecord]:
        return [
            DecisionRecord(
                request_id=request_id, order_id=order_id, decided_at=decided_at,
                entry_point=entry_point, city=city, routing_bucket=bucket,
                model_version=version, fallback_level=level, assigned_rider=rider,
                topk_riders=topk, eta_minutes=eta, ontime_probability=ontime, cost=cost,
                created_at=created_at, promised_minutes=promised, weights=(w_lat, w_on, w_cost),
            )
            for (
                request_id, order_id, decided_at, entry_point, city, bucket, version, level,
                rider, topk, eta, ontime, cost, created_at, promised, w_lat, w_on, w_cost,
            ) in zip(*(getattr(self, name) for name in self.__dataclass_fields__), strict=True)
        ]  # fmt: skip


def _weight_columns(
    weights: list[tuple[float, ...]],
) -> tuple[list[float], list[float], list[float]]:
    """Per-order (latency, on-time, cost) weights as three columns."""
    if not weights:
        return [], [], []
    latency, ontime, cost = map(list, zip(*weights, strict=True))
    return latency, ontime, cost


def decision_records(window: AnsweredWindow) -> list[DecisionRecord]:
    """The window's records, one per order (on the writer's thread, never the request's)."""
    return decision_rows([window]).records()


def batch_decision_records(windows: Sequence[AnsweredWindow]) -> list[DecisionRecord]:
    """The records of several windows, in order (`decision_rows`)."""
    return decision_rows(windows).records()


def decision_rows(windows: Sequence[AnsweredWindow]) -> DecisionRows:
    """The records of several windows as columns, in order. Each column is read for all
    their orders at once (a window holds one order or a few, and numpy costs per call, not
    per value); what is left per order is the conversion of ids to text. Raises ValueError
    where any window's arrays are not of its orders (`AnsweredWindow`)."""
    counts = [window.order_ids.size for window in windows]
    if not sum(counts):
        return DecisionRows.of_records([])  # numpy refuses to join no arrays

    def each_order(values: list[T]) -> list[T]:
        """One value per window repeated for each of its orders."""
        return list(chain.from_iterable(map(repeat, values, counts)))

    orders = _texts(_flat([w.order_ids for w in windows], counts, "order_ids"))
    buckets = user_buckets(_flat([w.user_ids for w in windows], counts, "user_ids")).tolist()
    versions = _flat([w.model_version for w in windows], counts, "model_version")
    levels = _flat(
        [
            np.full(count, -1) if w.fallback_level is None else w.fallback_level
            for w, count in zip(windows, counts, strict=True)
        ],
        counts,
        "fallback_level",
    )
    created = _flat([w.created_at for w in windows], counts, "created_at")
    promised = _flat([w.promised_minutes for w in windows], counts, "promised_minutes")
    objectives = _rows([w.assigned_objectives for w in windows], counts, "assigned_objectives")
    if objectives.shape[1] != 3:
        raise ValueError("assigned_objectives: not 3 objectives per order")
    assigned_riders, topk_riders, assigned = _riders(windows, counts)
    eta, ontime, cost = (objectives[:, column].tolist() for column in range(3))
    for row in np.flatnonzero(assigned < 0).tolist():  # left unassigned: no chosen pair
        eta[row] = ontime[row] = cost[row] = None
    latency_weight, ontime_weight, cost_weight = _weight_columns(
        each_order(_window_weights(windows))
    )
    return DecisionRows(
        request_id=each_order([w.request_id for w in windows]),
        order_id=orders,
        decided_at=each_order([float(w.dispatch_time) for w in windows]),
        entry_point=each_order([w.entry_point for w in windows]),
        city=each_order([w.city for w in windows]),
        routing_bucket=buckets,
        model_version=versions.astype(np.int64).tolist(),
        fallback_level=levels.astype(np.int64).tolist(),
        assigned_rider=assigned_riders,
        topk_riders=topk_riders,
        eta_minutes=eta,
        ontime_probability=ontime,
        cost=cost,
        created_at=created.astype(np.float64).tolist(),
        promised_minutes=promised.astype(np.float64).tolist(),
        weight_latency=latency_weight,
        weight_ontime=ontime_weight,
        weight_cost=cost_weight,
    )


def _riders(
    windows: Sequence[AnsweredWindow], counts: list[int]
) -> tuple[list[str | None], list[tuple[str, ...]], NDArray[np.int64]]:
    """Each order's assigned rider (None: unassigned) and Top-K riders as text, and its
    assigned row (< 0: none). The windows' riders are joined end to end and each order's
    rows (of its own window, checked) are shifted to its window's first rider among all."""
    rider_counts = [w.rider_ids.size for w in windows]
    riders = np.concatenate([w.rider_ids.reshape(-1) for w in windows])
    first = np.repeat(np.cumsum([0, *rider_counts[:-1]]), counts)
    limit = np.repeat(rider_counts, counts)
    assigned = _flat(
        [w.assigned_rider_index for w in windows], counts, "assigned_rider_index"
    ).astype(np.int64)
    topk = _rows([w.topk_rider_index for w in windows], counts, "topk_rider_index").astype(np.int64)
    if (assigned >= limit).any() or (topk >= limit[:, None]).any():
        raise ValueError("rider index beyond the window's riders")
    chosen = assigned >= 0
    names = iter(_texts(riders[(assigned + first)[chosen]]))
    assigned_riders = [next(names) if row else None for row in chosen.tolist()]
    listed = topk >= 0  # -1 pads
    topk_names = _texts(riders[(topk + first[:, None])[listed]])
    ends = np.cumsum(listed.sum(axis=1)).tolist()
    topk_riders = [
        tuple(topk_names[start:end]) for start, end in zip([0, *ends[:-1]], ends, strict=True)
    ]
    return assigned_riders, topk_riders, assigned


def _window_weights(windows: Sequence[AnsweredWindow]) -> list[tuple[float, ...]]:
    """Each window's objective weights; each distinct array checked once, by the request's
    own rule (a batch's windows carry the defaults or a few sets of weights)."""
    parsed: dict[tuple[Any, ...], tuple[float, ...]] = {}
    out = []
    for window in windows:
        weights = window.weights
        if weights is None:
            out.append(_DEFAULT_WEIGHTS)
            continue
        key = (weights.dtype.char, weights.shape, weights.tobytes())
        value = parsed.get(key)
        if value is None:
            value = parsed[key] = tuple(parse_objective_weights(weights).tolist())
        out.append(value)
    return out
