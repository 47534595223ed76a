"""dispatch_service.pipeline.plain_routing: the usual windows routed with one call.

Answers are checked against values written out here (a scorer that answers known rows, a
clock that ticks known times); the wiring test compares with the routing engine (the same
library, so it checks only that both give one answer); the others check every case the
path must leave to the engine.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import NUM_PAIR_FEATURES
from dispatch_service.pipeline.plain_routing import PlainWindow, routed_alone, routed_together
from dispatch_service.routing.engine import RouteItem, RouterSettings, route_and_score_many_sync
from dispatch_service.routing.fallback import FallbackLevel

F32 = NDArray[np.float32]


def plain(
    orders: int,
    width: int,
    *,
    version: int = 1,
    seed: int = 0,
    cpu_scoring: bool = False,
    served: Callable[[int], bool] = lambda v: v in (1, 2),
) -> PlainWindow:
    rng = np.random.default_rng(seed)
    features = rng.random((orders * width, NUM_PAIR_FEATURES)).astype(np.float32)
    candidates = np.arange(orders * width, dtype=np.int32).reshape(orders, width)
    versions = np.full(orders, version, dtype=np.int32)
    return PlainWindow(features, candidates, versions, cpu_scoring, served)


def row_scorer(calls: list[tuple[int, int]]) -> Callable[[int, F32], F32]:
    """Scores each row as (version, row's first feature, its row count in the call)."""

    def score(version: int, features: F32) -> F32:
        calls.append((version, features.shape[0]))
        rows = features.shape[0]
        return np.stack(
            [np.full(rows, version), features[:, 0], np.full(rows, rows)], axis=1
        ).astype(np.float64)

    return score


def ticking(*times: float) -> Callable[[], float]:
    return iter(times).__next__


def test_one_call_over_every_window_each_answered_with_its_rows() -> None:
    windows = [plain(1, 3, seed=1), plain(2, 4, seed=2, cpu_scoring=True), plain(1, 1, seed=3)]
    calls: list[tuple[int, int]] = []
    routed = routed_together(windows, score=row_scorer(calls), clock=ticking(10.0, 10.024))
    assert calls == [(1, 3 + 8 + 1)]
    assert routed is not None and len(routed) == 3
    for window, got in zip(windows, routed, strict=True):
        rows = window.features.shape[0]
        orders = window.candidates.shape[0]
        assert got.objectives.dtype == np.float32
        np.testing.assert_array_equal(got.objectives[:, 0], np.ones(rows, np.float32))
        np.testing.assert_array_equal(got.objectives[:, 1], window.features[:, 0])
        np.testing.assert_array_equal(got.objectives[:, 2], np.full(rows, 12, np.float32))
        np.testing.assert_array_equal(got.model_version, [1] * orders)
        np.testing.assert_array_equal(got.chosen_version, [1] * orders)
        level = FallbackLevel.CPU_SCORED if window.cpu_scoring else FallbackLevel.CHOSEN
        np.testing.assert_array_equal(got.fallback_level, [int(level)] * orders)
        (call,) = got.calls
        assert (call.version, call.role, call.orders, call.error) == (1, "primary", orders, None)
        # 24 ms for 12 rows: 2 ms a row, each window its rows' share
        assert call.seconds == pytest.approx(0.002 * rows)
        assert got.shadows == ()


def test_one_window_alone() -> None:
    calls: list[tuple[int, int]] = []
    window = plain(3, 2, version=2)
    got = routed_alone(window, score=row_scorer(calls), clock=ticking(1.0, 1.5))
    assert got is not None and calls == [(2, 6)]
    np.testing.assert_array_equal(got.model_version, [2, 2, 2])
    assert got.calls[0].seconds == pytest.approx(0.5)


def _never(version: int, features: F32) -> F32:
    raise AssertionError("must not be called")


@pytest.mark.parametrize(
    "windows",
    [
        [plain(1, 2), plain(1, 2, version=2)],  # two versions
        [plain(1, 2), plain(1, 2, served=lambda v: False)],  # a version not served
        [plain(1, 2, version=0)],  # the rule (no version)
        [plain(0, 0)],  # no orders
        [],
    ],
    ids=["two-versions", "not-served", "rule", "no-orders", "no-windows"],
)
def test_left_to_the_engine_before_any_call(windows: list[PlainWindow]) -> None:
    assert routed_together(windows, score=_never, clock=ticking(0.0, 1.0)) is None


def test_orders_of_one_window_on_two_versions_are_left_to_the_engine() -> None:
    window = plain(2, 2)
    window.versions[1] = 2
    assert routed_alone(window, score=_never, clock=ticking(0.0, 1.0)) is None


def _broken(name: str) -> PlainWindow:
    window = plain(2, 3)
    if name == "nan":
        window.features[4, 2] = np.nan
    elif name == "float64":
        return PlainWindow(
            window.features.astype(np.float64),  # type: ignore[arg-type]
            window.candidates, window.versions, False, window.served,
        )  # fmt: skip
    elif name == "rows":
        return PlainWindow(
            window.features[:5], window.candidates, window.versions, False, window.served
        )
    return window


@pytest.mark.parametrize("name", ["nan", "float64", "rows"])
def test_unusual_features_are_left_to_the_engine(name: str) -> None:
    assert routed_together([plain(1, 2), _broken(name)], score=_never, clock=ticking(0, 1)) is None


@pytest.mark.parametrize(
    "answer",
    [
        lambda v, x: np.full((x.shape[0], 3), np.nan),
        lambda v, x: np.zeros((x.shape[0] - 1, 3)),
        lambda v, x: 1 / 0,
    ],
    ids=["nan", "short", "raises"],
)
def test_an_unusable_answer_is_left_to_the_engine(answer: Callable[[int, F32], Any]) -> None:
    assert routed_together([plain(1, 2), plain(2, 2)], score=answer, clock=ticking(0, 1)) is None


def test_wiring_the_engine_routes_the_same_windows_alike() -> None:
    """The engine's joined call and plan against the path, with ONNX-like row scores."""
    settings = RouterSettings(stable_version=1, canary_version=2, canary_percent=0)
    windows = [plain(orders, width, seed=seed) for seed, (orders, width) in
               enumerate(itertools.product((1, 3), (1, 5)))]  # fmt: skip
    score = row_scorer([])
    got = routed_together(windows, score=score, clock=ticking(0.0, 1.0))
    items = [RouteItem(w.features, w.candidates, w.versions, settings, served=w.served)
             for w in windows]  # fmt: skip
    expected = route_and_score_many_sync(items, score)
    assert got is not None
    for mine, theirs in zip(got, expected, strict=True):
        assert not isinstance(theirs, Exception)
        assert mine.objectives.tobytes() == theirs.objectives.tobytes()
        for name in ("model_version", "fallback_level", "chosen_version"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name))
        assert [(c.version, c.role, c.orders, c.error) for c in mine.calls] == [
            (c.version, c.role, c.orders, c.error) for c in theirs.calls
        ]
