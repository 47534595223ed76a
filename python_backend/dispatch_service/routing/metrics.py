"""The router's metric families and what one routed request records.

Recorded by router_adapter and fused_adapter through a metrics.MetricsSink; every series also
carries the recording model's own `model` and `version` labels. The per-order families
(`ROUTED_ORDERS`, `FALLBACK_ORDERS`) also carry the window's `city`: a registry id (so the
label's values are bounded by the registry), or `NO_CITY` for a window routed without one
(`dispatch_features`, whose client encodes the window). Shadow figures are exported
as sums and counts so that means and ratios are computed over any window in PromQL, e.g.
top-1 agreement = rate(dispatch_shadow_top1_agreements_total[5m]) /
rate(dispatch_shadow_orders_total[5m]).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_service.core.metrics import LATENCY_BUCKETS_MS, MetricKind, MetricSpec, Observation
from dispatch_service.domain.cities import NO_CITY
from dispatch_service.routing.engine import NOT_SERVED, TIMED_OUT, RoutedScores
from dispatch_service.routing.fallback import FallbackLevel

__all__ = [
    "FALLBACK_ORDERS",
    "FUSED_ROUTING_METRICS",
    "FUSED_SCORING_LATENCY",
    "MODEL_CALLS",
    "MODEL_ERRORS",
    "MODEL_LATENCY",
    "NO_CITY",
    "ROUTED_ORDERS",
    "ROUTER_METRICS",
    "SHADOW_ONTIME_DIFF",
    "SHADOW_ORDERS",
    "SHADOW_PAIRS",
    "SHADOW_SCORE_DIFF",
    "SHADOW_TOP1_AGREEMENTS",
    "answered_counts",
    "fallback_counts",
    "routed_observations",
]


def _count(*columns: NDArray[np.int32]) -> dict[tuple[int, ...], int]:
    if not columns or columns[0].size == 0:
        return {}
    first = tuple(int(column[0]) for column in columns)
    if columns[0].size == 1 or all(
        (column == value).all() for column, value in zip(columns, first, strict=True)
    ):
        # The usual window: every order answered alike (np.unique over rows costs ~50 us).
        return {first: int(columns[0].size)}
    unique, counts = np.unique(np.stack(columns, axis=1), axis=0, return_counts=True)
    return {
        tuple(int(v) for v in row): int(c)
        for row, c in zip(unique.tolist(), counts.tolist(), strict=True)
    }


def answered_counts(routed: RoutedScores) -> dict[tuple[int, ...], int]:
    """(version that scored, fallback level) -> orders."""
    return _count(routed.model_version, routed.fallback_level)


_FELL: Final = frozenset((int(FallbackLevel.STABLE_RETRY), int(FallbackLevel.RULE_BASED)))


def fallback_counts(routed: RoutedScores) -> dict[tuple[int, ...], int]:
    """(chosen version that failed, level that answered instead) -> orders."""
    level = routed.fallback_level
    if _FELL.isdisjoint(level.tolist()):  # the usual window (np.isin costs ~40 us)
        return {}
    fell = (level == int(FallbackLevel.STABLE_RETRY)) | (level == int(FallbackLevel.RULE_BASED))
    return _count(routed.chosen_version[fell], routed.fallback_level[fell])


MODEL_CALLS: Final = MetricSpec(
    "dispatch_router_model_calls_total",
    MetricKind.COUNTER,
    "dispatch_model calls routing made for a window, by version and role (primary, retry, "
    "shadow); the windows of one execute share one call per version",
    labels=("model_version", "role"),
)
MODEL_ERRORS: Final = MetricSpec(
    "dispatch_router_model_errors_total",
    MetricKind.COUNTER,
    "failed dispatch_model calls (error, unusable answer, timeout, version not served)",
    labels=("model_version", "role", "reason"),
)
MODEL_LATENCY: Final = MetricSpec(
    "dispatch_router_model_latency_ms",
    MetricKind.HISTOGRAM,
    "time of a window's dispatch_model call by dispatch_router (BLS round trip to another "
    "process; a call shared by an execute's windows: the window's rows' share), ms",
    labels=("model_version", "role"),
    buckets=LATENCY_BUCKETS_MS,
)
# dispatch_fused scores in its own process: a different measurement, so a different name.
FUSED_SCORING_LATENCY: Final = MetricSpec(
    "dispatch_fused_scoring_latency_ms",
    MetricKind.HISTOGRAM,
    "time of a window's dispatch_model version call inside dispatch_fused (ONNX Runtime; a "
    "call shared by an execute's windows: the window's rows' share), ms",
    labels=("model_version", "role"),
    buckets=LATENCY_BUCKETS_MS,
)
ROUTED_ORDERS: Final = MetricSpec(
    "dispatch_router_orders_total",
    MetricKind.COUNTER,
    "orders answered, by the version that scored them (0 = rule-based), fallback level and "
    "the window's city",
    labels=("model_version", "level", "city"),
)
FALLBACK_ORDERS: Final = MetricSpec(
    "dispatch_router_fallbacks_total",
    MetricKind.COUNTER,
    "orders whose chosen version failed, by that version, the level that answered and the "
    "window's city",
    labels=("model_version", "level", "city"),
)
_PAIR_LABELS: Final = ("primary", "shadow")
SHADOW_ORDERS: Final = MetricSpec(
    "dispatch_shadow_orders_total",
    MetricKind.COUNTER,
    "orders scored by both a primary and a shadow version",
    labels=_PAIR_LABELS,
)
SHADOW_TOP1_AGREEMENTS: Final = MetricSpec(
    "dispatch_shadow_top1_agreements_total",
    MetricKind.COUNTER,
    "shadowed orders whose best candidate (default weights) is the same in both versions",
    labels=_PAIR_LABELS,
)
SHADOW_PAIRS: Final = MetricSpec(
    "dispatch_shadow_pairs_total",
    MetricKind.COUNTER,
    "order-rider pairs scored by both versions",
    labels=_PAIR_LABELS,
)
SHADOW_SCORE_DIFF: Final = MetricSpec(
    "dispatch_shadow_score_abs_diff_total",
    MetricKind.COUNTER,
    "sum over shadowed pairs of |weighted score (shadow) - weighted score (primary)|",
    labels=_PAIR_LABELS,
)
SHADOW_ONTIME_DIFF: Final = MetricSpec(
    "dispatch_shadow_ontime_abs_diff_total",
    MetricKind.COUNTER,
    "sum over shadowed pairs of |on-time probability (shadow) - (primary)|",
    labels=_PAIR_LABELS,
)
_SHARED: Final = (
    MODEL_CALLS,
    MODEL_ERRORS,
    ROUTED_ORDERS,
    FALLBACK_ORDERS,
    SHADOW_ORDERS,
    SHADOW_TOP1_AGREEMENTS,
    SHADOW_PAIRS,
    SHADOW_SCORE_DIFF,
    SHADOW_ONTIME_DIFF,
)
ROUTER_METRICS: Final = (MODEL_LATENCY, *_SHARED)  # dispatch_router's
FUSED_ROUTING_METRICS: Final = (FUSED_SCORING_LATENCY, *_SHARED)  # dispatch_fused's routing


def _reason(error: str) -> str:
    if error == NOT_SERVED:
        return "not_served"
    return "timeout" if error == TIMED_OUT else "error"


def routed_observations(
    routed: RoutedScores, latency: MetricSpec = MODEL_LATENCY, city: str | None = None
) -> list[Observation]:
    """What one answered routed request records (a few values, never one per order).

    ``city``: the registry id of the window's city (None: `NO_CITY`), the `city` label of
    the per-order families.

    ``latency``: the family the call times go to (`MODEL_LATENCY` for the router's BLS calls,
    `FUSED_SCORING_LATENCY` for dispatch_fused's in-process calls). A version that was not
    served was not called: it counts as an error (reason ``not_served``), not as a call.
    """
    out: list[Observation] = []
    labels: tuple[tuple[str, str], ...]
    for call in routed.calls:
        labels = (("model_version", str(call.version)), ("role", call.role))
        if call.called:
            out.append(Observation(MODEL_CALLS, 1.0, labels))
            out.append(Observation(latency, call.seconds * 1000.0, labels))
        if call.error is not None:
            out.append(Observation(MODEL_ERRORS, 1.0, (*labels, ("reason", _reason(call.error)))))
    for spec, counts in (
        (ROUTED_ORDERS, answered_counts(routed)),
        (FALLBACK_ORDERS, fallback_counts(routed)),
    ):
        for (version, level), orders in counts.items():
            labels = (
                ("model_version", str(version)),
                ("level", str(level)),
                ("city", city or NO_CITY),
            )
            out.append(Observation(spec, float(orders), labels))
    for cmp in routed.shadows:
        labels = (("primary", str(cmp.primary_version)), ("shadow", str(cmp.shadow_version)))
        out += [
            Observation(SHADOW_ORDERS, float(cmp.orders), labels),
            Observation(SHADOW_TOP1_AGREEMENTS, float(cmp.top1_agreements), labels),
            Observation(SHADOW_PAIRS, float(cmp.pairs), labels),
            Observation(SHADOW_SCORE_DIFF, cmp.score_abs_diff_sum, labels),
            Observation(SHADOW_ONTIME_DIFF, cmp.ontime_abs_diff_sum, labels),
        ]
    return out
