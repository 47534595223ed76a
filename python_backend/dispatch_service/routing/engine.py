"""The routing plan of `dispatch_router` and `dispatch_fused`, and its two drivers.

Both entry points answer through one plan (`_routing`): it groups a window's orders by the
version routing chose for them (`policy`), asks for the primary and shadow calls (`shadow`),
one stable retry for the orders whose version failed, and the rule-based dispatcher
(`fallback`) for the rest. The plan does not make calls itself: `route_and_score_many`
drives the plans of a batch's windows with async calls (the router's BLS, bounded by
``bls_timeout_ms``), `route_and_score_many_sync` with calls in this process (dispatch_fused's
ONNX Runtime sessions); in both, the calls of one version that the windows ask for in a
round are made as one call over all their rows (`_routing_many`). `route_and_score` and
`route_and_score_sync` are the same for one window. The Triton bridges are
`serving.router_adapter` and `serving.fused_adapter`.

Both drivers take the same `served` answer (`policy.ServedVersions`): a version that is not
served is never called; its orders fail at once (``NOT_SERVED``) into the fallback chain, so
the answer does not depend on how an absent version fails in one entry point or the other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import (
    CANDIDATE_RIDER_INDEX,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    PAIR_FEATURES,
)
from dispatch_service.core.batches import split_rows
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window_wire import USER_IDS_FIELD
from dispatch_service.routing.fallback import (
    RULE_BASED_VERSION,
    FallbackLevel,
    rule_based_objectives,
)
from dispatch_service.routing.policy import IsServed
from dispatch_service.routing.settings import RouterSettings
from dispatch_service.routing.shadow import ShadowComparison, compare_shadow, shadow_version_of

__all__ = [
    "NOT_SERVED",
    "TIMED_OUT",
    "ModelCall",
    "ModelCallError",
    "Outcome",
    "RouteItem",
    "RoutedScores",
    "Scorer",
    "SyncScorer",
    "check_pair_features",
    "route_and_score",
    "route_and_score_many",
    "route_and_score_many_sync",
    "route_and_score_sync",
]

F32 = NDArray[np.float32]
I32 = NDArray[np.int32]

NOT_SERVED: Final = "not served"  # ModelCall.error of a version that was not called
TIMED_OUT: Final = "timeout"  # ModelCall.error of a call that ran past bls_timeout_ms


def _all_served(version: int) -> bool:
    return True


# An async call of one dispatch_model version: (version, pair features [p, F]) -> [p, 3].
Scorer = Callable[[int, F32], Awaitable[NDArray[Any]]]
# The same, answered in this process (dispatch_fused's ONNX Runtime sessions).
SyncScorer = Callable[[int, F32], NDArray[Any]]


@dataclass(frozen=True)
class ModelCall:
    """One call of one version, for metrics and logs."""

    version: int
    role: str  # "primary", "retry" or "shadow"
    orders: int
    seconds: float
    error: str | None = None  # NOT_SERVED: the version is not served and was not called

    @property
    def called(self) -> bool:
        """Whether the call was made at all (a version that is not served is not called)."""
        return self.error != NOT_SERVED


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
        return _failed(job, clock() - started, TIMED_OUT)
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


def check_pair_features(
    features: ArrayLike, candidates: ArrayLike
) -> tuple[F32, NDArray[np.int64]]:
    """PAIR_FEATURES as FP32 [B*N, F], finite, one row per CANDIDATE_RIDER_INDEX position
    (the rule for every step that scores them); returns both arrays, the index as int64."""
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
    *,
    shadow: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    served: IsServed = _all_served,
) -> RoutedScores:
    """Score each order with its version, falling back per order; shadow-score if asked.

    `versions` is int [B] (``choose_versions``). Every call is bounded by
    ``settings.bls_timeout_ms``; primary and shadow calls run concurrently, then one stable
    retry for the orders whose version failed, then the rule-based dispatcher for the rest.
    """
    item = RouteItem(features, candidates, versions, settings, shadow, served)
    return _alone(await route_and_score_many([item], scorer, clock))


def route_and_score_sync(
    features: ArrayLike,
    candidates: ArrayLike,
    versions: ArrayLike,
    settings: RouterSettings,
    scorer: SyncScorer,
    *,
    shadow: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    served: IsServed = _all_served,
) -> RoutedScores:
    """`route_and_score` with versions scored in this process, one call after another.

    The same routing, fallback chain and shadow comparison, without an event loop
    (dispatch_fused, whose versions are ONNX Runtime sessions in its own process).
    """
    item = RouteItem(features, candidates, versions, settings, shadow, served)
    return _alone(route_and_score_many_sync([item], scorer, clock))


def _alone(routed: list[RoutedScores | Exception]) -> RoutedScores:
    """The one window's routed scores, or the exception it raised."""
    (outcome,) = routed
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@dataclass(frozen=True, eq=False)
class RouteItem:
    """One window to route in a batch (`route_and_score_many`): `route_and_score`'s
    arguments for it."""

    features: ArrayLike
    candidates: ArrayLike
    versions: ArrayLike
    settings: RouterSettings
    shadow: bool = False
    served: IsServed = _all_served

    def plan(self) -> Generator[list[_Job], list[Outcome], RoutedScores]:
        """This window's routing plan (`_routing`)."""
        return _routing(
            self.features,
            self.candidates,
            self.versions,
            self.settings,
            shadow=self.shadow,
            served=self.served,
        )


async def route_and_score_many(
    items: Sequence[RouteItem],
    scorer: Scorer,
    clock: Callable[[], float] = time.perf_counter,
) -> list[RoutedScores | Exception]:
    """`route_and_score` of each window of a batch (one Triton `execute`), each its own
    answer or the exception it alone raised, with the calls of one version made as one
    call over all the windows' rows (`_routing_many`). Each call is bounded by the first
    window's ``bls_timeout_ms``."""
    if not items:
        return []
    timeout_s = items[0].settings.bls_timeout_ms / 1000.0
    plan = _routing_many(items)
    try:  # the plan may finish without a call (no version served)
        jobs = next(plan)
        while True:
            outcomes = await asyncio.gather(*(_call(scorer, job, timeout_s, clock) for job in jobs))
            jobs = plan.send(list(outcomes))
    except StopIteration as done:
        routed: list[RoutedScores | Exception] = done.value
        return routed


def route_and_score_many_sync(
    items: Sequence[RouteItem],
    scorer: SyncScorer,
    clock: Callable[[], float] = time.perf_counter,
) -> list[RoutedScores | Exception]:
    """`route_and_score_many` with versions scored in this process (dispatch_fused)."""
    plan = _routing_many(items)
    try:  # the plan may finish without a call (no version served)
        jobs = next(plan)
        while True:
            jobs = plan.send([_call_now(scorer, job, clock) for job in jobs])
    except StopIteration as done:
        routed: list[RoutedScores | Exception] = done.value
        return routed


def _routing_many(
    items: Sequence[RouteItem],
) -> Generator[list[_Job], list[Outcome], list[RoutedScores | Exception]]:
    """Each window's own plan (`_routing`), run side by side: each round, the calls all
    windows ask for are made as one call per version over their rows (the model scores
    every row on its own), and each window gets its rows' answer, timed as its rows' share
    of the call. A joined call that fails (an error, or one window's rows answered NaN) is
    made again for each window alone, so each window ends as it would alone; one that timed
    out fails every member at once (no window's rows are to blame, and a second try would
    double the wait)."""
    if len(items) == 1:  # nothing to join: the window's own plan, as it is
        (item,) = items
        try:
            routed = yield from item.plan()
        except Exception as exc:  # this window's own error (e.g. DispatchInputError)
            return [exc]
        return [routed]
    results: dict[int, RoutedScores | Exception] = {}
    plans: dict[int, Generator[list[_Job], list[Outcome], RoutedScores]] = {}
    waiting: dict[int, list[_Job]] = {}

    def advance(number: int, outcomes: list[Outcome] | None) -> None:
        plan = plans[number]
        try:
            waiting[number] = next(plan) if outcomes is None else plan.send(outcomes)
        except StopIteration as done:
            results[number] = done.value
        except Exception as exc:  # this window's own error (e.g. DispatchInputError)
            results[number] = exc

    for number, item in enumerate(items):
        plans[number] = item.plan()
        advance(number, None)
    while waiting:
        asked, waiting = waiting, {}
        refs: dict[int, list[tuple[int, int]]] = {}  # version -> (window, its job) in order
        for number, jobs in asked.items():
            for at, job in enumerate(jobs):
                refs.setdefault(job.version, []).append((number, at))
        groups = [[asked[n][k] for n, k in members] for members in refs.values()]
        joined = [_joined_job(version, jobs) for version, jobs in zip(refs, groups, strict=True)]
        outcomes = yield joined
        answers: dict[tuple[int, int], Outcome] = {}
        alone: list[tuple[int, int]] = []
        for members, jobs, job, (scores, call) in zip(
            refs.values(), groups, joined, outcomes, strict=True
        ):
            if len(jobs) == 1:  # a call of one window's job: its own outcome
                answers[members[0]] = (scores, call)
            elif scores is None and call.error == TIMED_OUT:  # no window's rows to blame
                for ref, part in zip(members, jobs, strict=True):
                    answers[ref] = _failed(part, call.seconds, TIMED_OUT)
            elif scores is None:
                alone.extend(members)
            else:
                per_row = call.seconds / max(job.features.shape[0], 1)
                parts = split_rows(scores, [part.features.shape[0] for part in jobs])
                for ref, part, rows in zip(members, jobs, parts, strict=True):
                    seconds = per_row * part.features.shape[0]
                    answers[ref] = (rows, ModelCall(part.version, part.role, part.orders, seconds))
        if alone:
            again = yield [asked[n][k] for n, k in alone]
            answers.update(zip(alone, again, strict=True))
        for number, jobs in asked.items():
            advance(number, [answers[(number, at)] for at in range(len(jobs))])
    return [results[number] for number in range(len(items))]


def _joined_job(version: int, jobs: list[_Job]) -> _Job:
    """One call of ``version`` over the rows of ``jobs``, in order."""
    if len(jobs) == 1:
        return jobs[0]
    features = np.concatenate([job.features for job in jobs])
    return _Job(version, "joined", features, sum(job.orders for job in jobs))


def _served_calls(
    jobs: list[_Job], served: IsServed
) -> Generator[list[_Job], list[Outcome], list[Outcome]]:
    """Ask the driver for the calls of served versions only; the others fail as NOT_SERVED."""
    made = [served(job.version) for job in jobs]
    wanted = [job for job, ok in zip(jobs, made, strict=True) if ok]
    answers = iter((yield wanted) if wanted else [])
    return [
        next(answers) if ok else _failed(job, 0.0, NOT_SERVED)
        for job, ok in zip(jobs, made, strict=True)
    ]


def _version_groups(chosen: NDArray[np.int32]) -> list[tuple[int, NDArray[np.bool_]]]:
    """Each version routing chose, ascending, with the orders it was chosen for."""
    if chosen.size == 1 or (chosen.size and bool((chosen == chosen[0]).all())):
        # the usual window: one version
        return [(int(chosen[0]), np.ones(chosen.size, dtype=np.bool_))]
    return [(int(v), chosen == v) for v in np.unique(chosen).tolist()]


def _routing(
    features: ArrayLike,
    candidates: ArrayLike,
    versions: ArrayLike,
    settings: RouterSettings,
    *,
    shadow: bool,
    served: IsServed = _all_served,
) -> Generator[list[_Job], list[Outcome], RoutedScores]:
    """The routing itself, free of how calls are made: yields the calls it needs (first the
    primary and shadow calls together, then the stable retry if any), receives their
    outcomes in the same order, and returns the routed scores."""
    x, index = check_pair_features(features, candidates)
    num_orders, width = index.shape
    chosen = np.asarray(versions, dtype=np.int32).reshape(-1)
    if chosen.shape != (num_orders,):
        raise DispatchInputError(
            USER_IDS_FIELD,
            f"must have B = {num_orders} rows like {CANDIDATE_RIDER_INDEX.name}, "
            f"got {chosen.shape[0]}",
            "shape",
        )
    per_order = x.reshape(num_orders, width, NUM_PAIR_FEATURES)

    groups = _version_groups(chosen)
    # The usual window: one version for every order (its mask, known to be all true).
    everyone = groups[0][1] if len(groups) == 1 else None

    def rows_of(orders: NDArray[np.bool_]) -> F32:
        if orders is everyone or orders.all():  # one version for the whole window, no copy
            return np.ascontiguousarray(x)
        return np.ascontiguousarray(per_order[orders].reshape(-1, NUM_PAIR_FEATURES))

    def count(orders: NDArray[np.bool_]) -> int:
        return num_orders if orders is everyone else int(orders.sum())

    objectives = np.zeros((num_orders, width, len(OBJECTIVES)), dtype=np.float32)
    model_version = np.full(num_orders, RULE_BASED_VERSION, dtype=np.int32)
    level = np.full(num_orders, int(FallbackLevel.RULE_BASED), dtype=np.int32)

    primary_jobs = [_Job(v, "primary", rows_of(m), count(m)) for v, m in groups]
    shadow_groups = [
        (v, m, shadow_version_of(v, settings)) for v, m in groups if shadow and num_orders
    ]
    shadow_groups = [(v, m, s) for v, m, s in shadow_groups if s]
    shadow_jobs = [_Job(s, "shadow", rows_of(m), count(m)) for _, m, s in shadow_groups]
    outcomes = yield from _served_calls([*primary_jobs, *shadow_jobs], served)
    primary_out, shadow_out = outcomes[: len(groups)], outcomes[len(groups) :]
    calls = [call for _, call in outcomes]

    failed = np.zeros(num_orders, dtype=np.bool_)
    for (v, mask), (scores, _) in zip(groups, primary_out, strict=True):
        if scores is None:
            failed |= mask
            continue
        at = ... if mask is everyone else mask  # every order: no boolean indexing
        objectives[at] = scores.reshape(-1, width, len(OBJECTIVES))
        model_version[at] = v
        level[at] = int(FallbackLevel.CHOSEN)
    # Every order is in one group: where every primary call answered, nothing falls back.
    if any(scores is None for scores, _ in primary_out):
        retry = failed & (chosen != settings.stable_version)
        if retry.any():
            job = _Job(settings.stable_version, "retry", rows_of(retry), int(retry.sum()))
            ((scores, call),) = yield from _served_calls([job], served)
            calls.append(call)
            if scores is not None:
                objectives[retry] = scores.reshape(-1, width, len(OBJECTIVES))
                model_version[retry] = settings.stable_version
                level[retry] = int(FallbackLevel.STABLE_RETRY)
        rule = level == int(FallbackLevel.RULE_BASED)
        if rule.any():
            rule_rows = rows_of(rule)
            objectives[rule] = rule_based_objectives(rule_rows).reshape(-1, width, len(OBJECTIVES))

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
    if settings.cpu_scoring:  # the device fallback runs the model on the CPU
        level[level == int(FallbackLevel.CHOSEN)] = int(FallbackLevel.CPU_SCORED)
    return RoutedScores(
        objectives=objectives.reshape(-1, len(OBJECTIVES)),
        model_version=model_version,
        fallback_level=level,
        chosen_version=chosen,
        calls=tuple(calls),
        shadows=tuple(comparisons),
    )
