"""dispatch_fused's routing where there is nothing to plan: every order of a window, or of
every window of an execute, routed to one served version, no shadow call, and that version
answering usable scores. One ONNX Runtime call, no fallback chain.

Why: the routing engine (`engine.route_and_score_sync`, `route_and_score_many_sync`) runs a
plan per window that can join calls, retry the stable version and fall back to the rule;
on a batch of small windows its bookkeeping costs several times the model call. Here the
usual case is answered directly, with the engine's values: the version's scores as
`engine._checked` keeps them (float32), each order at level CHOSEN (CPU_SCORED where the
settings say the model runs on the CPU), one primary call per window timed as the engine
times it (a joined call: each window's rows' share). Every function returns None where the
case is not this one (several versions, unusual tensors, a call that fails or answers NaN);
the caller then runs the engine on the same values, which names the error or falls back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import NUM_PAIR_FEATURES, OBJECTIVES
from dispatch_service.core.batches import split_rows
from dispatch_service.routing.engine import ModelCall, RoutedScores, SyncScorer
from dispatch_service.routing.fallback import FallbackLevel
from dispatch_service.routing.policy import IsServed

__all__ = ["PlainWindow", "routed_alone", "routed_together"]

_WIDTH: Final = len(OBJECTIVES)


@dataclass(frozen=True)
class PlainWindow:
    """One window's routing inputs: its pair features and candidates (the encoder's), each
    order's chosen version, whether versions are scored on the CPU as a fallback, and which
    versions are served (the window's own snapshot, as its routing saw them)."""

    features: NDArray[np.float32]
    candidates: NDArray[np.int32]
    versions: NDArray[np.int32]
    cpu_scoring: bool
    served: IsServed


def routed_alone(
    window: PlainWindow, *, score: SyncScorer, clock: Callable[[], float]
) -> RoutedScores | None:
    """`engine.route_and_score_sync` of one window, without shadow scoring, when every
    order goes to one served version and it answers; None otherwise."""
    found = routed_together([window], score=score, clock=clock)
    return None if found is None else found[0]


def routed_together(
    windows: Sequence[PlainWindow], *, score: SyncScorer, clock: Callable[[], float]
) -> list[RoutedScores] | None:
    """`engine.route_and_score_many_sync` of windows without shadow scoring, when every
    order of every window goes to one served version and its one call over all their rows
    answers; None otherwise (the engine then routes them, nothing having been kept)."""
    found = [_one_version(window) for window in windows]
    usable = [choice for choice in found if choice is not None]
    if not windows or len(usable) < len(windows) or len({v for v, _ in usable}) != 1:
        return None
    version = usable[0][0]
    rows = [window.features.shape[0] for window in windows]
    total = sum(rows)
    started = clock()
    try:
        features = windows[0].features if len(windows) == 1 else np.concatenate(
            [window.features for window in windows]
        )  # fmt: skip
        answer = np.asarray(score(version, features))
    except Exception:  # the engine calls it again and falls back
        return None
    if answer.shape != (total, _WIDTH) or not bool(np.isfinite(answer).all()):
        return None
    per_row = (clock() - started) / max(total, 1)
    routed: list[RoutedScores] = []
    for window, (_, orders), part in zip(windows, usable, split_rows(answer, rows), strict=True):
        level = FallbackLevel.CPU_SCORED if window.cpu_scoring else FallbackLevel.CHOSEN
        seconds = per_row * part.shape[0]
        routed.append(
            RoutedScores(
                objectives=part.astype(np.float32),
                model_version=np.full(orders.size, version, dtype=np.int32),
                fallback_level=np.full(orders.size, int(level), dtype=np.int32),
                chosen_version=orders,
                calls=(ModelCall(version, "primary", int(orders.size), seconds),),
            )
        )
    return routed


def _one_version(window: PlainWindow) -> tuple[int, NDArray[np.int32]] | None:
    """(the version, each order's choice) where every order of the window chose one served
    version and its tensors are as the encoder makes them; None otherwise."""
    chosen = np.asarray(window.versions, dtype=np.int32).reshape(-1)
    orders = int(chosen.size)
    if orders == 0:
        return None
    version = int(chosen[0])
    features, candidates = window.features, window.candidates
    rows = features.shape[0]
    if (
        (orders > 1 and not bool((chosen == version).all()))
        or not window.served(version)
        or features.dtype != np.float32
        or features.shape != (rows, NUM_PAIR_FEATURES)
        or candidates.dtype.kind not in "iu"
        or candidates.ndim != 2
        or candidates.shape[0] != orders
        or candidates.size != rows
        or not bool(np.isfinite(features).all())
    ):
        return None
    return version, chosen
