"""Server-side canary routing, shadow scoring and the fallback chain of `dispatch_router`.

`dispatch_router` sits in the `dispatch` ensemble where `dispatch_model` used to be: it gets
the window's pair features, decides which `dispatch_model` version scores each order, calls
those versions (through Triton's BLS in production, through any async callable in tests) and
hands the resolver one objectives tensor plus, per order, the version that scored it and the
fallback level that answered. Everything here is plain, typed and unit-tested; the Triton
bridge is `router_adapter`.

Routing
    Each order is routed by its ``ORDER_USER_IDS`` entry: a stable 64-bit hash (FNV-1a,
    then the MurmurHash3 finaliser so that similar ids spread evenly) picks one of 100
    buckets, and buckets ``0 .. canary_percent - 1`` go to the canary version, the rest to
    the stable one. The hash is the same in every process and release (never Python's salted
    ``hash()``), so a user always sees one version; raising the percentage only adds users to
    the canary, lowering it only removes them. A request may force a version with the
    optional ``MODEL_VERSION_TAG`` input: ``stable``, ``canary`` or a version number.

Shadow
    A ``shadow_percent`` share of requests is also scored by the other version (canary for
    orders on the stable version, stable for orders on the canary). The shadow answer never
    reaches the response: it is only compared with the primary one (top-1 rider under the
    default weights, mean absolute score and on-time probability differences) for metrics.
    Shadow calls run concurrently with the primary ones and are bounded by the same timeout.

Fallback chain
    Level 0: the chosen version answered. Level 1: it failed (error, timeout, unloaded, or an
    answer of the wrong shape or with non-finite values) and the stable version answered a
    retry. Level 2: the rule-based dispatcher (``rule_based_objectives``) answered, so that
    the resolver picks the nearest feasible rider and still respects capacity. Orders whose
    chosen version *is* the stable one skip level 1: retrying the version that just failed
    would only double the wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import (
    CANDIDATE_RIDER_INDEX,
    DEFAULT_OBJECTIVE_WEIGHTS,
    MODEL_VERSION_TAG,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    PAIR_FEATURE_NAMES,
    PAIR_FEATURES,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import LATENCY_BUCKETS_MS, MetricKind, MetricSpec, Observation
from dispatch_service.domain.resolver import fnv1a_64, ids_as_bytes, score_pairs
from dispatch_service.routing.settings import ROUTING_BUCKETS, RouterSettings

__all__ = [
    "FALLBACK_ORDERS",
    "MODEL_CALLS",
    "MODEL_ERRORS",
    "MODEL_LATENCY",
    "ROUTED_ORDERS",
    "ROUTER_METRICS",
    "ROUTING_BUCKETS",
    "RULE_BASED_VERSION",
    "RULE_COST_BASE_CNY",
    "RULE_COST_PER_KM_CNY",
    "RULE_HANDLING_MINUTES",
    "RULE_ONTIME_SPREAD_MINUTES",
    "RULE_SPEED_KMH",
    "SHADOW_ONTIME_DIFF",
    "SHADOW_ORDERS",
    "SHADOW_PAIRS",
    "SHADOW_SCORE_DIFF",
    "SHADOW_TOP1_AGREEMENTS",
    "TAG_CANARY",
    "TAG_STABLE",
    "FallbackLevel",
    "ModelCall",
    "ModelCallError",
    "Outcome",
    "RoutedScores",
    "RouterSettings",
    "Scorer",
    "ShadowComparison",
    "SyncScorer",
    "answered_counts",
    "choose_versions",
    "compare_shadow",
    "fallback_counts",
    "parse_version_tag",
    "route_and_score",
    "route_and_score_now",
    "routed_observations",
    "rule_based_objectives",
    "settings_record",
    "shadow_sampled",
    "shadow_version_of",
    "user_buckets",
]

RULE_BASED_VERSION: Final = 0  # ORDER_MODEL_VERSION of an order the rule-based dispatcher scored
TAG_STABLE: Final = "stable"
TAG_CANARY: Final = "canary"

F32 = NDArray[np.float32]
I32 = NDArray[np.int32]

# An async call of one dispatch_model version: (version, pair features [p, F]) -> [p, 3].
Scorer = Callable[[int, F32], Awaitable[NDArray[Any]]]
# The same, answered in this process (dispatch_fused's ONNX Runtime sessions).
SyncScorer = Callable[[int, F32], NDArray[Any]]


class FallbackLevel(IntEnum):
    """ORDER_FALLBACK_LEVEL: which link of the chain answered an order."""

    CHOSEN = 0  # the routed (or forced) version
    STABLE_RETRY = 1  # the stable version, after the chosen one failed
    RULE_BASED = 2  # no model answered: the rule-based dispatcher


# ---- routing -----------------------------------------------------------------------------

_MIX1: Final = np.uint64(0xFF51AFD7ED558CCD)
_MIX2: Final = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT: Final = np.uint64(33)


def user_buckets(user_ids: ArrayLike) -> NDArray[np.int64]:
    """Bucket in [0, 100) per user id; identical in every process (FNV-1a + fmix64)."""
    h = fnv1a_64(ids_as_bytes("ORDER_USER_IDS", user_ids))
    h = h ^ (h >> _SHIFT)
    h = h * _MIX1  # numpy arrays wrap modulo 2**64
    h = h ^ (h >> _SHIFT)
    h = h * _MIX2
    h = h ^ (h >> _SHIFT)
    buckets: NDArray[np.int64] = (h % np.uint64(ROUTING_BUCKETS)).astype(np.int64)
    return buckets


def parse_version_tag(tag: ArrayLike | None, settings: RouterSettings) -> int | None:
    """The version a ``MODEL_VERSION_TAG`` forces, or None when the request sets none.

    ``stable`` -> the stable version; ``canary`` -> the canary (the stable version while no
    canary runs); a decimal number -> that version, whether or not it is loaded (an absent
    version fails its call and the stable version answers at level 1).
    """
    if tag is None:
        return None
    name = MODEL_VERSION_TAG.name
    values = ids_as_bytes(name, tag)
    if len(values) != 1:
        raise DispatchInputError(name, f"must have shape [1], got {len(values)} values", "shape")
    try:
        text = values[0].decode("ascii").strip().lower()
    except UnicodeDecodeError:
        raise DispatchInputError(name, "must be ASCII text", "dtype") from None
    if text == TAG_STABLE:
        return settings.stable_version
    if text == TAG_CANARY:
        return settings.canary_version or settings.stable_version
    if text.isdigit() and len(text) <= 9 and int(text) >= 1:
        return int(text)
    raise DispatchInputError(
        name, "must be 'stable', 'canary' or a version number >= 1", "unknown_value"
    )


def choose_versions(
    user_ids: ArrayLike, settings: RouterSettings, forced: int | None = None
) -> I32:
    """int32 [B]: the dispatch_model version that should score each order."""
    count = int(np.asarray(user_ids, dtype=object).reshape(-1).size)
    if forced is not None:
        return np.full(count, forced, dtype=np.int32)
    versions = np.full(count, settings.stable_version, dtype=np.int32)
    if settings.canary_version and settings.canary_percent:
        canary = user_buckets(user_ids) < settings.canary_percent
        versions[canary] = settings.canary_version
    return versions


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


# ---- the rule-based dispatcher -----------------------------------------------------------

_PICKUP_KM: Final = PAIR_FEATURE_NAMES.index("pickup_distance_km")
_TRIP_KM: Final = PAIR_FEATURE_NAMES.index("trip_distance_km")
_SLACK: Final = PAIR_FEATURE_NAMES.index("slack_minutes")
RULE_SPEED_KMH: Final = 15.0  # one speed for every vehicle: nearer always means sooner
RULE_HANDLING_MINUTES: Final = 4.0
RULE_ONTIME_SPREAD_MINUTES: Final = 8.0
RULE_COST_BASE_CNY: Final = 6.0
RULE_COST_PER_KM_CNY: Final = 1.2
_MAX_KM: Final = 20_000.0


def rule_based_objectives(features: ArrayLike) -> F32:
    """[P, 3] objectives from pair features alone, for when no model version answers.

    ETA is the pickup plus trip distance at a fixed speed plus handling time; on-time is a
    logistic of the order's slack minus that ETA; cost is a base fare plus a rate per km.
    Within one order only the pickup distance differs between candidates, and every
    objective worsens with it, so a nearer rider dominates a farther one and the resolver
    (Pareto-consistent) ranks each order's nearest feasible rider first.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != NUM_PAIR_FEATURES:
        raise DispatchInputError(
            PAIR_FEATURES.name, f"must have shape [P, {NUM_PAIR_FEATURES}], got {x.shape}", "shape"
        )
    pickup = np.clip(np.nan_to_num(x[:, _PICKUP_KM], nan=_MAX_KM), 0.0, _MAX_KM)
    trip = np.clip(np.nan_to_num(x[:, _TRIP_KM], nan=0.0), 0.0, _MAX_KM)
    slack = np.clip(np.nan_to_num(x[:, _SLACK], nan=0.0), -1e6, 1e6)
    km = pickup + trip
    eta = km / RULE_SPEED_KMH * 60.0 + RULE_HANDLING_MINUTES
    z = np.clip((slack - eta) / RULE_ONTIME_SPREAD_MINUTES, -60.0, 60.0)
    ontime = 1.0 / (1.0 + np.exp(-z))
    cost = RULE_COST_BASE_CNY + RULE_COST_PER_KM_CNY * km
    out: F32 = np.stack([eta, ontime, cost], axis=1).astype(np.float32)
    return out


# ---- shadow comparison -------------------------------------------------------------------

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


# ---- orchestration -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCall:
    """One call of one version, for metrics and logs."""

    version: int
    role: str  # "primary", "retry" or "shadow"
    orders: int
    seconds: float
    error: str | None = None


@dataclass(frozen=True, eq=False)
class RoutedScores:
    """dispatch_router's answer (eq=False: arrays inside)."""

    objectives: F32  # [P, 3]
    model_version: I32  # [B] the version that scored each order, 0 = rule-based
    fallback_level: I32  # [B] FallbackLevel per order
    chosen_version: I32  # [B] the version routing picked (before any fallback)
    calls: tuple[ModelCall, ...] = ()
    shadows: tuple[ShadowComparison, ...] = field(default=())


class ModelCallError(RuntimeError):
    """A version's answer cannot be used (wrong shape, non-finite values)."""


def _checked(answer: NDArray[Any], rows: int) -> F32:
    scores = np.asarray(answer)
    if scores.shape != (rows, len(OBJECTIVES)):
        raise ModelCallError(f"answer has shape {scores.shape}, expected ({rows}, 3)")
    if not np.isfinite(scores).all():
        raise ModelCallError("answer holds NaN or infinity")
    return scores.astype(np.float32, copy=False)


@dataclass(frozen=True, eq=False)
class _Job:
    """One version call the routing needs made: which version, why, on which rows."""

    version: int
    role: str
    features: F32
    orders: int


Outcome = tuple[F32 | None, ModelCall]


def _failed(job: _Job, seconds: float, error: str) -> Outcome:
    return None, ModelCall(job.version, job.role, job.orders, seconds, error)


async def _call(scorer: Scorer, job: _Job, timeout_s: float, clock: Callable[[], float]) -> Outcome:
    started = clock()
    try:
        answer = await asyncio.wait_for(scorer(job.version, job.features), timeout_s)
        scores = _checked(answer, job.features.shape[0])
    except TimeoutError:
        return _failed(job, clock() - started, "timeout")
    except Exception as exc:  # any failure of a version is a fallback, not a failed request
        return _failed(job, clock() - started, f"{type(exc).__name__}: {exc}")
    return scores, ModelCall(job.version, job.role, job.orders, clock() - started)


def _call_now(scorer: SyncScorer, job: _Job, clock: Callable[[], float]) -> Outcome:
    """`_call` for a scorer in this process: no timeout (it cannot be interrupted anyway)."""
    started = clock()
    try:
        scores = _checked(scorer(job.version, job.features), job.features.shape[0])
    except Exception as exc:  # any failure of a version is a fallback, not a failed request
        return _failed(job, clock() - started, f"{type(exc).__name__}: {exc}")
    return scores, ModelCall(job.version, job.role, job.orders, clock() - started)


def _check_shapes(features: ArrayLike, candidates: ArrayLike) -> tuple[F32, NDArray[np.int64]]:
    index = np.asarray(candidates)
    if index.dtype.kind not in "iu" or index.ndim != 2:
        raise DispatchInputError(
            CANDIDATE_RIDER_INDEX.name,
            f"must be an INT32 [B, N] tensor, got {index.dtype} {index.shape}",
            "shape",
        )
    x = np.asarray(features)
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != NUM_PAIR_FEATURES:
        raise DispatchInputError(
            PAIR_FEATURES.name,
            f"must be an FP32 [P, {NUM_PAIR_FEATURES}] tensor, got {x.dtype} {x.shape}",
            "shape",
        )
    num_orders, width = index.shape
    if x.shape[0] != num_orders * width:
        raise DispatchInputError(
            PAIR_FEATURES.name,
            f"must have B*N = {num_orders}*{width} rows like {CANDIDATE_RIDER_INDEX.name}, "
            f"got {x.shape[0]}",
            "shape",
        )
    if not np.isfinite(x).all():
        raise DispatchInputError(
            PAIR_FEATURES.name, "must be finite, got NaN or infinity", "not_finite"
        )
    return x, index.astype(np.int64)


async def route_and_score(
    features: ArrayLike,
    candidates: ArrayLike,
    versions: ArrayLike,
    settings: RouterSettings,
    scorer: Scorer,
    shadow: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> RoutedScores:
    """Score each order with its version, falling back per order; shadow-score if asked.

    `versions` is int [B] (``choose_versions``). Every call is bounded by
    ``settings.bls_timeout_ms``; primary and shadow calls run concurrently, then one stable
    retry for the orders whose version failed, then the rule-based dispatcher for the rest.
    """
    timeout_s = settings.bls_timeout_ms / 1000.0
    plan = _routing(features, candidates, versions, settings, shadow)
    jobs = next(plan)
    while True:
        outcomes = await asyncio.gather(*(_call(scorer, job, timeout_s, clock) for job in jobs))
        try:
            jobs = plan.send(list(outcomes))
        except StopIteration as done:
            routed: RoutedScores = done.value
            return routed


def route_and_score_now(
    features: ArrayLike,
    candidates: ArrayLike,
    versions: ArrayLike,
    settings: RouterSettings,
    scorer: SyncScorer,
    shadow: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> RoutedScores:
    """`route_and_score` with versions scored in this process, one call after another.

    The same routing, fallback chain and shadow comparison, without an event loop
    (dispatch_fused, whose versions are ONNX Runtime sessions in its own process).
    """
    plan = _routing(features, candidates, versions, settings, shadow)
    jobs = next(plan)
    while True:
        try:
            jobs = plan.send([_call_now(scorer, job, clock) for job in jobs])
        except StopIteration as done:
            routed: RoutedScores = done.value
            return routed


def _routing(
    features: ArrayLike,
    candidates: ArrayLike,
    versions: ArrayLike,
    settings: RouterSettings,
    shadow: bool,
) -> Generator[list[_Job], list[Outcome], RoutedScores]:
    """The routing itself, free of how calls are made: yields the calls it needs (first the
    primary and shadow calls together, then the stable retry if any), receives their
    outcomes in the same order, and returns the routed scores."""
    x, index = _check_shapes(features, candidates)
    num_orders, width = index.shape
    chosen = np.asarray(versions, dtype=np.int32).reshape(-1)
    if chosen.shape != (num_orders,):
        raise DispatchInputError(
            "ORDER_USER_IDS",
            f"must have B = {num_orders} rows like {CANDIDATE_RIDER_INDEX.name}, "
            f"got {chosen.shape[0]}",
            "shape",
        )
    per_order = x.reshape(num_orders, width, NUM_PAIR_FEATURES)

    def rows_of(orders: NDArray[np.bool_]) -> F32:
        if orders.all():  # the usual case: one version for the whole window, no copy
            return np.ascontiguousarray(x)
        return np.ascontiguousarray(per_order[orders].reshape(-1, NUM_PAIR_FEATURES))

    objectives = np.zeros((num_orders, width, len(OBJECTIVES)), dtype=np.float32)
    model_version = np.full(num_orders, RULE_BASED_VERSION, dtype=np.int32)
    level = np.full(num_orders, int(FallbackLevel.RULE_BASED), dtype=np.int32)
    groups = [(int(v), chosen == v) for v in np.unique(chosen).tolist()]

    primary_jobs = [_Job(v, "primary", rows_of(m), int(m.sum())) for v, m in groups]
    shadow_groups = [
        (v, m, shadow_version_of(v, settings)) for v, m in groups if shadow and num_orders
    ]
    shadow_groups = [(v, m, s) for v, m, s in shadow_groups if s]
    shadow_jobs = [_Job(s, "shadow", rows_of(m), int(m.sum())) for _, m, s in shadow_groups]
    outcomes = yield [*primary_jobs, *shadow_jobs]
    primary_out, shadow_out = outcomes[: len(groups)], outcomes[len(groups) :]
    calls = [call for _, call in outcomes]

    failed = np.zeros(num_orders, dtype=np.bool_)
    for (v, mask), (scores, _) in zip(groups, primary_out, strict=True):
        if scores is None:
            failed |= mask
            continue
        objectives[mask] = scores.reshape(-1, width, len(OBJECTIVES))
        model_version[mask] = v
        level[mask] = int(FallbackLevel.CHOSEN)

    retry = failed & (chosen != settings.stable_version)
    if retry.any():
        job = _Job(settings.stable_version, "retry", rows_of(retry), int(retry.sum()))
        ((scores, call),) = yield [job]
        calls.append(call)
        if scores is not None:
            objectives[retry] = scores.reshape(-1, width, len(OBJECTIVES))
            model_version[retry] = settings.stable_version
            level[retry] = int(FallbackLevel.STABLE_RETRY)

    rule = level == int(FallbackLevel.RULE_BASED)
    if rule.any():
        objectives[rule] = rule_based_objectives(rows_of(rule)).reshape(-1, width, len(OBJECTIVES))

    comparisons: list[ShadowComparison] = []
    for (v, mask, s), (scores, _) in zip(shadow_groups, shadow_out, strict=True):
        answered = mask & (level == int(FallbackLevel.CHOSEN))
        if scores is None or not answered.any():
            continue
        shadow_scores = scores.reshape(-1, width, len(OBJECTIVES))[answered[mask]]
        comparisons.append(
            compare_shadow(
                objectives[answered].reshape(-1, len(OBJECTIVES)),
                shadow_scores.reshape(-1, len(OBJECTIVES)),
                index[answered],
                v,
                s,
            )
        )
    return RoutedScores(
        objectives=objectives.reshape(-1, len(OBJECTIVES)),
        model_version=model_version,
        fallback_level=level,
        chosen_version=chosen,
        calls=tuple(calls),
        shadows=tuple(comparisons),
    )


def _count(*columns: NDArray[np.int32]) -> dict[tuple[int, ...], int]:
    if not columns or columns[0].size == 0:
        return {}
    unique, counts = np.unique(np.stack(columns, axis=1), axis=0, return_counts=True)
    return {
        tuple(int(v) for v in row): int(c)
        for row, c in zip(unique.tolist(), counts.tolist(), strict=True)
    }


def answered_counts(routed: RoutedScores) -> dict[tuple[int, ...], int]:
    """(version that scored, fallback level) -> orders."""
    return _count(routed.model_version, routed.fallback_level)


def fallback_counts(routed: RoutedScores) -> dict[tuple[int, ...], int]:
    """(chosen version that failed, level that answered instead) -> orders."""
    fell = routed.fallback_level > int(FallbackLevel.CHOSEN)
    return _count(routed.chosen_version[fell], routed.fallback_level[fell])


def settings_record(settings: RouterSettings, **context: Any) -> dict[str, Any]:
    """The structured log record of a router (re)load with these settings."""
    return {"event": "router_settings_loaded", **context, **asdict(settings)}


# ---- metrics -------------------------------------------------------------------------------
# Recorded by router_adapter through a metrics.MetricsSink; every series also carries the
# router's own `model` and `version` labels. Shadow figures are exported as sums and counts
# so that means and ratios are computed over any window in PromQL, e.g. top-1 agreement =
# rate(dispatch_shadow_top1_agreements_total[5m]) / rate(dispatch_shadow_orders_total[5m]).

MODEL_CALLS: Final = MetricSpec(
    "dispatch_router_model_calls_total",
    MetricKind.COUNTER,
    "dispatch_model calls by the router, by version and role (primary, retry, shadow)",
    labels=("model_version", "role"),
)
MODEL_ERRORS: Final = MetricSpec(
    "dispatch_router_model_errors_total",
    MetricKind.COUNTER,
    "failed dispatch_model calls (error, unloaded version, unusable answer, timeout)",
    labels=("model_version", "role", "reason"),
)
MODEL_LATENCY: Final = MetricSpec(
    "dispatch_router_model_latency_ms",
    MetricKind.HISTOGRAM,
    "time of one dispatch_model call as the router sees it (BLS round trip), ms",
    labels=("model_version", "role"),
    buckets=LATENCY_BUCKETS_MS,
)
ROUTED_ORDERS: Final = MetricSpec(
    "dispatch_router_orders_total",
    MetricKind.COUNTER,
    "orders answered, by the version that scored them (0 = rule-based) and fallback level",
    labels=("model_version", "level"),
)
FALLBACK_ORDERS: Final = MetricSpec(
    "dispatch_router_fallbacks_total",
    MetricKind.COUNTER,
    "orders whose chosen version failed, by that version and the level that answered",
    labels=("model_version", "level"),
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
ROUTER_METRICS: Final = (
    MODEL_CALLS,
    MODEL_ERRORS,
    MODEL_LATENCY,
    ROUTED_ORDERS,
    FALLBACK_ORDERS,
    SHADOW_ORDERS,
    SHADOW_TOP1_AGREEMENTS,
    SHADOW_PAIRS,
    SHADOW_SCORE_DIFF,
    SHADOW_ONTIME_DIFF,
)


def routed_observations(routed: RoutedScores) -> list[Observation]:
    """What one answered dispatch_router request records (a few values, never one per order)."""
    out: list[Observation] = []
    for call in routed.calls:
        labels = (("model_version", str(call.version)), ("role", call.role))
        out.append(Observation(MODEL_CALLS, 1.0, labels))
        out.append(Observation(MODEL_LATENCY, call.seconds * 1000.0, labels))
        if call.error is not None:
            reason = "timeout" if call.error == "timeout" else "error"
            out.append(Observation(MODEL_ERRORS, 1.0, (*labels, ("reason", reason))))
    for spec, counts in (
        (ROUTED_ORDERS, answered_counts(routed)),
        (FALLBACK_ORDERS, fallback_counts(routed)),
    ):
        for (version, level), orders in counts.items():
            labels = (("model_version", str(version)), ("level", str(level)))
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
