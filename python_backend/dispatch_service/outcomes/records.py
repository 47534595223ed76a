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
from itertools import accumulate, chain, repeat
from operator import attrgetter, is_
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


@dataclass(eq=False, slots=True)
class AnsweredWindow:
    """One answered window as an entry point hands it to the writer: arrays it will not
    change again (copies of request tensors, which Triton reuses after the answer). Made
    on the request's thread, so made cheaply: slots and plain assignments (a frozen
    dataclass sets each of its 15 fields through ``object.__setattr__``, 2.5x the time);
    nobody changes it after.

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


_SIZE: Final = attrgetter("size")


def _flat(arrays: Sequence[NDArray[Any]], counts: list[int], name: str) -> NDArray[Any]:
    """The windows' per-order arrays end to end (one value per order, or ValueError)."""
    if list(map(_SIZE, arrays)) != counts:
        raise ValueError(f"{name}: not one value per order")
    return np.concatenate(arrays, axis=None)


def _rows(arrays: Sequence[NDArray[Any]], counts: list[int], name: str) -> NDArray[Any]:
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
    def joined(cls, parts: Sequence[DecisionRows]) -> DecisionRows:
        """Several batches' columns end to end."""
        return cls(
            **{
                name: list(chain.from_iterable(getattr(part, name) for part in parts))
                for name in cls.__dataclass_fields__
            }
        )

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


# What `decision_rows` reads of each window, fetched in one C-level call per window.
_WINDOW_FIELDS: Final = attrgetter(
    "order_ids", "user_ids", "model_version", "fallback_level", "created_at",
    "promised_minutes", "assigned_objectives", "rider_ids", "assigned_rider_index",
    "topk_rider_index", "request_id", "dispatch_time", "entry_point", "city", "weights",
)  # fmt: skip


def decision_rows(windows: Sequence[AnsweredWindow]) -> DecisionRows:
    """The records of several windows as columns, in order. Each column is read for all
    their orders at once (a window holds one order or a few, and numpy costs per call, not
    per value); what is left per order is the conversion of ids to text. Raises ValueError
    where any window's arrays are not of its orders (`AnsweredWindow`)."""
    if not windows:
        return DecisionRows.of_records([])
    (
        order_ids, user_ids, versions, levels, created, promised, objectives, rider_ids,
        assigned_rows, topk_rows, request_ids, times, entry_points, cities, weights,
    ) = zip(*map(_WINDOW_FIELDS, windows), strict=True)  # fmt: skip
    counts = list(map(_SIZE, order_ids))
    if not sum(counts):
        return DecisionRows.of_records([])  # numpy refuses to join no arrays

    def each_order(values: Sequence[T]) -> list[T]:
        """One value per window repeated for each of its orders."""
        return list(chain.from_iterable(map(repeat, values, counts)))

    if any(map(is_, levels, repeat(None))):  # the entry point did not say: -1
        levels = tuple(
            np.full(count, -1) if level is None else level
            for level, count in zip(levels, counts, strict=True)
        )
    objective_rows = _rows(objectives, counts, "assigned_objectives")
    if objective_rows.shape[1] != 3:
        raise ValueError("assigned_objectives: not 3 objectives per order")
    assigned_riders, topk_riders, assigned = _riders(rider_ids, assigned_rows, topk_rows, counts)
    eta, ontime, cost = (objective_rows[:, column].tolist() for column in range(3))
    for row in (assigned < 0).nonzero()[0].tolist():  # left unassigned: no chosen pair
        eta[row] = ontime[row] = cost[row] = None
    latency_weight, ontime_weight, cost_weight = _weight_columns(
        each_order(_window_weights(weights))
    )
    return DecisionRows(
        request_id=each_order(request_ids),
        order_id=_texts(_flat(order_ids, counts, "order_ids")),
        decided_at=each_order(list(map(float, times))),
        entry_point=each_order(entry_points),
        city=each_order(cities),
        routing_bucket=user_buckets(_flat(user_ids, counts, "user_ids")).tolist(),
        model_version=_flat(versions, counts, "model_version").astype(np.int64).tolist(),
        fallback_level=_flat(levels, counts, "fallback_level").astype(np.int64).tolist(),
        assigned_rider=assigned_riders,
        topk_riders=topk_riders,
        eta_minutes=eta,
        ontime_probability=ontime,
        cost=cost,
        created_at=_flat(created, counts, "created_at").astype(np.float64).tolist(),
        promised_minutes=_flat(promised, counts, "promised_minutes").astype(np.float64).tolist(),
        weight_latency=latency_weight,
        weight_ontime=ontime_weight,
        weight_cost=cost_weight,
    )


def _riders(
    rider_ids: Sequence[NDArray[Any]],
    assigned_rows: Sequence[NDArray[Any]],
    topk_rows: Sequence[NDArray[Any]],
    counts: list[int],
) -> tuple[list[str | None], list[tuple[str, ...]], NDArray[np.int64]]:
    """Each order's assigned rider (None: unassigned) and Top-K riders as text, and its
    assigned row (< 0: none). The windows' riders are joined end to end and each order's
    rows (of its own window, checked) are shifted to its window's first rider among all."""
    rider_counts = list(map(_SIZE, rider_ids))
    riders = np.concatenate(rider_ids, axis=None)
    total = sum(counts)
    first = np.fromiter(  # per order: its window's first rider among all
        chain.from_iterable(map(repeat, accumulate(rider_counts[:-1], initial=0), counts)),
        dtype=np.int64,
        count=total,
    )
    limit = np.fromiter(
        chain.from_iterable(map(repeat, rider_counts, counts)), dtype=np.int64, count=total
    )
    assigned = _flat(assigned_rows, counts, "assigned_rider_index").astype(np.int64)
    topk = _rows(_padded(topk_rows), counts, "topk_rider_index").astype(np.int64)
    if (assigned >= limit).any() or (topk >= limit[:, None]).any():
        raise ValueError("rider index beyond the window's riders")
    chosen = assigned >= 0
    names = iter(_texts(riders[(assigned + first)[chosen]]))
    assigned_riders = [next(names) if row else None for row in chosen.tolist()]
    listed = topk >= 0  # -1 pads
    topk_names = _texts(riders[(topk + first[:, None])[listed]])
    ends = list(accumulate(listed.sum(axis=1).tolist()))
    topk_riders = [
        tuple(topk_names[start:end]) for start, end in zip([0, *ends[:-1]], ends, strict=True)
    ]
    return assigned_riders, topk_riders, assigned


def _padded(topk_rows: Sequence[NDArray[Any]]) -> Sequence[NDArray[Any]]:
    """The windows' Top-K rows padded with -1 to the widest (a window with fewer riders
    than K has fewer columns)."""
    widths = [rows.shape[-1] if rows.ndim == 2 else 0 for rows in topk_rows]
    width = max(widths)
    if min(widths) == width:
        return topk_rows
    return [
        rows
        if rows.ndim != 2 or rows.shape[1] == width
        else np.concatenate([rows, np.full((rows.shape[0], width - rows.shape[1]), -1)], axis=1)
        for rows in topk_rows
    ]


def _window_weights(weights: Sequence[NDArray[Any] | None]) -> list[tuple[float, ...]]:
    """Each window's objective weights (None: the defaults); each distinct array checked
    once, by the request's own rule (a batch's windows carry the defaults or a few sets)."""
    parsed: dict[tuple[Any, ...], tuple[float, ...]] = {}
    out = []
    for sent in weights:
        if sent is None:
            out.append(_DEFAULT_WEIGHTS)
            continue
        key = (sent.dtype.char, sent.shape, sent.tobytes())
        value = parsed.get(key)
        if value is None:
            value = parsed[key] = tuple(parse_objective_weights(sent).tolist())
        out.append(value)
    return out
